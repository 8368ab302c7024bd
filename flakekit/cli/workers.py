"""``flakekit workers``: the worker ids every generator's allocator knows about."""

from __future__ import annotations

from typing import Any

import click

from flakekit.cli.main import cli, config_option, echo_json, json_option


def _row(generator: str, allocator: str, rec: Any) -> dict[str, Any]:
    from flakekit.values.timeunits import iso_utc  # attrs: not for --help

    return {
        "generator": generator, "allocator": allocator,
        "worker_id": rec.worker_id, "epoch": rec.epoch, "state": rec.state,
        "last_seen": iso_utc(rec.last_seen),
        "mine": rec.mine, "holder": rec.holder or None, **rec.extra,
    }


def _details(extra: dict[str, Any]) -> str:
    """The allocator-specific part of a record, short: ``host:port (name)`` or ``k=v``."""
    if "host" in extra and "port" in extra:
        where = f"{extra['host']}:{extra['port']}"
        return f"{where} ({extra['host_name']})" if extra.get("host_name") else where
    return " ".join(f"{k}={v}" for k, v in extra.items()
                    if v not in (None, "") and isinstance(v, (str, int)))[:60]


_RECORD_KEYS = {"generator", "allocator", "worker_id", "epoch", "state", "last_seen", "mine",
                "holder"}


@cli.group(invoke_without_command=True)
@config_option
@json_option
@click.pass_context
def workers(ctx: click.Context, config_path: str | None, as_json: bool) -> None:
    """List the worker ids every generator's allocator knows about (id, holder, epoch,
    last seen, lease state)."""
    if ctx.invoked_subcommand is not None:
        return
    import flakekit

    kit = flakekit.load(config_path)
    rows: list[dict[str, Any]] = []
    try:
        for name in kit.config.generators:
            for part in kit.parts_of(name, "allocator"):
                try:
                    records = part.obj.records()
                finally:
                    part.obj.close()
                rows.extend(_row(name, part.ref.type, rec) for rec in records)
    finally:
        kit.close()
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo("no workers yet")
        return
    header = ("GENERATOR", "ALLOCATOR", "ID", "EPOCH", "STATE", "LAST SEEN (UTC)", "WHERE",
              "HOLDER")
    table = [header] + [
        (r["generator"], r["allocator"], str(r["worker_id"]), str(r["epoch"]), r["state"],
         (r["last_seen"] or "-")[:19].replace("T", " "),
         _details({k: v for k, v in r.items() if k not in _RECORD_KEYS}), r["holder"] or "-")
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
