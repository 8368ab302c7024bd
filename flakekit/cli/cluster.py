"""``flakekit cluster status`` and ``flakekit cluster drain``: cluster mode for operators.

Both read and write the membership store directly (no node has to be up, and no node
id or ``advertise`` is needed where they run): members with their state and lease, the
view epoch, the owner of every strict key in that view (the same rendezvous hash the
nodes use) and the key-owner table's claims. ``drain`` is a planned hand-off: mark the
node draining, then propose the view without it (compare-and-set on the epoch), so every
node releases or claims its keys as it sees the new epoch.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from flakekit.cli.main import _host, cli, config_option, echo_json, json_option
from flakekit.errors import ClusterError, ConfigError, FlakekitError, UnknownNameError

if TYPE_CHECKING:
    from flakekit.assembly.kit import Kit
    from flakekit.cluster.store_contracts import Membership
    from flakekit.values.cluster import Member, MemberInfo, View

__all__ = ["cluster_group", "drain_node", "status_report"]

#: how often ``drain`` re-reads the view when another proposer moved it first
PROPOSE_ATTEMPTS = 5


def _operator_kit(config_path: str | None) -> Kit:
    """The config's kit, built without joining (``as_member=False``)."""
    from flakekit.assembly.config import load_config
    from flakekit.assembly.kit import build_kit

    config = load_config(config_path)
    if config.cluster is None:
        raise ConfigError("cluster", f"{config.source or 'the embedded default'} has no "
                          "[cluster] section; add one (name, advertise, membership) or pass "
                          "the cluster's config with -c")
    return build_kit(config, _host(), as_member=False)


def _read(what: str, where: str, func: Any, *args: Any) -> Any:
    """Call the store; anything but a flakekit error becomes one line naming the store."""
    try:
        return func(*args)
    except FlakekitError:
        raise
    except Exception as exc:  # noqa: BLE001 - a driver's error: one line, no traceback
        text = str(exc).strip().splitlines()
        raise ClusterError(f"{what} in {where} failed: {text[0] if text else type(exc).__name__}"
                           ) from None


def _owners(view: View, keys: list[str]) -> dict[str, Member | None]:
    from flakekit.values.owners import OwnerMap

    if not view.members:
        return dict.fromkeys(keys)
    owner_map = OwnerMap(view)
    return {key: owner_map.owner(key) for key in keys}


def _ms_iso(ms: int) -> str | None:
    if not ms:
        return None
    from flakekit.values.timeunits import iso_utc
    return iso_utc(dt.datetime.fromtimestamp(ms / 1000, dt.UTC))


def _claims(kit: Kit) -> list[dict[str, Any]]:
    """The key-owner table of every store the strict generators use (each table once)."""
    seen: set[str] = set()
    rows = []
    for gen in kit.strict_generators():
        where = gen.store.where
        if where in seen:
            continue
        seen.add(where)
        for rec in _read("reading the key owners", where, gen.store.key_owners):
            rows.append({"key": rec.key, "node": rec.node, "epoch": rec.epoch,
                         "released": rec.released, "claimed_at": _ms_iso(rec.claimed_at_ms)})
    return rows


def status_report(kit: Kit) -> dict[str, Any]:
    """What ``flakekit cluster status --json`` prints."""
    from flakekit.values.owners import HASH_NAME

    spec = kit.config.cluster
    membership = kit.membership
    assert spec is not None and membership is not None
    where = membership.where
    infos = _read("listing the members", where, membership.members, spec.name)
    view = _read("reading the view", where, membership.view, spec.name)
    in_view = set(view.nodes())
    members = [{
        "node": info.node, "advertise": info.member.advertise, "weight": info.member.weight,
        "state": info.state, "in_view": info.node in in_view,
        "lease_left_s": info.expires_in_ms / 1000 if info.state != "left" else None,
        "holder": info.holder or None, "incarnation": info.incarnation,
    } for info in infos]
    known = {info.node for info in infos}
    members += [{"node": m.node, "advertise": m.advertise, "weight": m.weight,
                 "state": "missing", "in_view": True, "lease_left_s": None, "holder": None,
                 "incarnation": None} for m in view.members if m.node not in known]
    strict = kit.strict_generators()
    owners = _owners(view, [gen.key for gen in strict])
    claims = _claims(kit)
    by_key = {row["key"]: row for row in claims}
    return {
        "cluster": spec.name, "epoch": view.epoch, "hash": HASH_NAME,
        "changed_at": _ms_iso(view.changed_at_ms), "view": list(view.nodes()),
        "membership": {"type": spec.membership.type, "where": where},
        "members": members,
        "strict": [{"generator": gen.name, "key": gen.key,
                    "owner": owner.node if (owner := owners[gen.key]) else None,
                    "claim": by_key.get(gen.key)} for gen in strict],
        "claims": claims,
    }


def _table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _lease(member: dict[str, Any]) -> str:
    left = member["lease_left_s"]
    if left is None:
        return "-"
    return f"{left:.1f}s left" if left > 0 else f"lapsed {-left:.1f}s ago"


def _print_status(report: dict[str, Any]) -> None:
    changed = f", changed {report['changed_at']}" if report["changed_at"] else ""
    click.echo(f"cluster {report['cluster']!r}: view epoch {report['epoch']}{changed} "
               f"({', '.join(report['view']) or 'no members'}); hash {report['hash']}; "
               f"membership {report['membership']['type']} at {report['membership']['where']}")
    if report["members"]:
        _table([("NODE", "STATE", "IN VIEW", "WEIGHT", "LEASE", "ADVERTISE")] + [
            (m["node"], m["state"], "yes" if m["in_view"] else "no", str(m["weight"]),
             _lease(m), m["advertise"] or "-") for m in report["members"]])
    else:
        click.echo("  no members yet (start a node with `flakekit serve`)")
    if report["strict"]:
        rows = [("KEY", "GENERATOR", "OWNER", "CLAIMED BY", "CLAIM EPOCH", "RELEASED")]
        for s in report["strict"]:
            claim = s["claim"]
            rows.append((s["key"], s["generator"], s["owner"] or "-",
                         claim["node"] if claim else "-", str(claim["epoch"]) if claim else "-",
                         ("yes" if claim["released"] else "no") if claim else "-"))
        _table(rows)
    else:
        click.echo("  no strict keys (order = \"strict\" segment generators) in this config")


@cli.group("cluster")
def cluster_group() -> None:
    """Cluster mode: members, the view and who owns each strict key; drain a node."""


@cluster_group.command("status")
@config_option
@json_option
def status(config_path: str | None, as_json: bool) -> None:
    """Members (state, lease left), the view epoch, the owner of every strict key and
    the key-owner table's claims, read from the membership store."""
    kit = _operator_kit(config_path)
    try:
        report = status_report(kit)
    finally:
        kit.close()
    if as_json:
        echo_json(report)
    else:
        _print_status(report)


def drain_node(kit: Kit, node: str, undo: bool = False) -> dict[str, Any]:
    """Mark ``node`` draining and propose the view without it (``undo``: alive again and
    back in the view if its lease is current); what moved. A node served by several
    processes (``serve --workers N``: members ``node.0``, ``node.1``...) is drained as
    one: every process of it in one view change."""
    from flakekit.cluster.processes import processes_of

    spec = kit.config.cluster
    membership: Membership | None = kit.membership
    assert spec is not None and membership is not None
    where = membership.where
    infos = {i.node: i for i in _read("listing the members", where, membership.members,
                                      spec.name)}
    view = _read("reading the view", where, membership.view, spec.name)
    known = {*infos, *view.nodes()}
    names = [node] if node in known else processes_of(node, known)
    if not names:
        raise UnknownNameError("NODE", "member", node, known)
    was = {n: n in infos and infos[n].state == "draining" for n in names}
    marked: list[str] = []
    try:
        for name in names:
            if _read("marking the member", where, membership.set_draining, spec.name, name,
                     not undo):
                marked.append(name)
        result = _propose_drain(kit, membership, names, undo, infos, view)
    except BaseException:
        # nothing half-done: a drain that could not move the view leaves the marks as they
        # were (best effort: the error that stopped the drain is the one to report)
        for name in marked:
            if was[name] != (not undo):
                try:
                    membership.set_draining(spec.name, name, was[name])
                except FlakekitError as exc:
                    import logging  # only here: the cluster commands start without it

                    logging.getLogger("flakekit.cli").warning(
                        "cluster %s: could not put %s's draining mark back: %s", spec.name,
                        name, exc)
        raise
    result.update(node=node, marked=bool(marked))
    if names != [node]:
        result["members"] = names
    return result


def _propose_drain(kit: Kit, membership: Membership, names: list[str], undo: bool,
                   infos: dict[str, MemberInfo], view: View) -> dict[str, Any]:
    spec = kit.config.cluster
    assert spec is not None
    where = membership.where
    keys = [gen.key for gen in kit.strict_generators()]
    result: dict[str, Any] = {"cluster": spec.name,
                              "action": "undrain" if undo else "drain",
                              "from_epoch": view.epoch, "epoch": view.epoch, "moved": {}}
    for _ in range(PROPOSE_ATTEMPTS):
        if undo:
            back = [i for n in names if (i := infos.get(n)) is not None
                    and n not in view.nodes() and i.state in ("alive", "draining")]
            if not back:
                first = infos.get(names[0])
                result["state"] = first.state if first else "missing"
                return result  # in the view already, or it rejoins once alive
            members = sorted([*view.members, *(i.member for i in back)])
        else:
            members = [m for m in view.members if m.node not in names]
            if len(members) == len(view.members):
                return result  # not in the view: nothing moves
            if not members:
                who = (f"{names[0]!r} is the only member" if len(names) == 1 else
                       f"{', '.join(map(repr, names))} are the only members")
                raise ConfigError("NODE", f"{who} of view epoch {view.epoch}: no node would "
                                  "own the strict keys; start another node first")
        new = _read("proposing a view", where, membership.propose, spec.name, view.epoch,
                    members)
        if new is not None:
            before, after = _owners(view, keys), _owners(new, keys)
            result.update(from_epoch=view.epoch, epoch=new.epoch, view=list(new.nodes()))
            result["moved"] = {
                key: {"from": b.node if b else None, "to": a.node if a else None}
                for key in keys if (b := before[key]) != (a := after[key])}
            result["kept"] = len(keys) - len(result["moved"])
            return result
        view = _read("reading the view", where, membership.view, spec.name)
    raise ClusterError(f"cluster {spec.name!r}: the view kept changing while proposing "
                       f"({PROPOSE_ATTEMPTS} attempts); run the command again")


@cluster_group.command("drain")
@click.argument("node")
@click.option("--undo", is_flag=True,
              help="Put NODE back: clear draining and add it to the view if it is alive.")
@config_option
@json_option
def drain(node: str, undo: bool, config_path: str | None, as_json: bool) -> None:
    """Move every strict key off NODE (planned hand-off): mark it draining and propose
    the view without it."""
    kit = _operator_kit(config_path)
    try:
        result = drain_node(kit, node, undo)
    finally:
        kit.close()
    if as_json:
        echo_json(result)
        return
    verb = "undrained" if undo else "drained"
    if result["epoch"] == result["from_epoch"]:
        if undo and result.get("state") not in (None, "alive", "draining"):
            click.echo(f"{node!r} is no longer draining; it is {result['state']}: it rejoins "
                       "the view when its node is up again")
        else:
            where = "in" if undo else "out of"
            click.echo(f"{node!r} is already {where} view epoch {result['epoch']}; "
                       f"{'marked alive' if undo else 'marked draining'}, nothing moves")
        return
    processes = f" (members {', '.join(result['members'])})" if "members" in result else ""
    click.echo(f"{verb} {node!r}{processes}: view epoch {result['from_epoch']} -> "
               f"{result['epoch']} ({', '.join(result['view']) or 'no members'})")
    for key, move in result["moved"].items():
        click.echo(f"  {key}: {move['from'] or '-'} -> {move['to'] or '-'}")
    click.echo(f"  {len(result['moved'])} strict keys moved, {result['kept']} kept their owner")
