"""What ``SegmentUnavailableError`` tells the user (issue 9, item 8): a database that
fails or does not answer is named as the cause, with what to check; raising the step is
suggested only when segments did arrive and were used up by bursts."""

from __future__ import annotations

import pytest
from test_segment import MemoryStore, generator

from flakekit.cli import main
from flakekit.errors import SegmentUnavailableError
from flakekit.testing import unreachable_url, wait_until
from flakekit.testing.cli import write_segment_toml

STEP_ADVICE = "raise the key's step"


def unavailable(gen, *, after_a_failed_fetch: bool = False) -> str:
    for _ in range(10):  # the buffer in memory
        gen.next_id()
    if after_a_failed_fetch:   # the background fetch failed (not only: not back yet)
        wait_until(lambda: gen.stats().fetch_failures > 0, 60)
    with pytest.raises(SegmentUnavailableError) as caught:
        gen.next_id()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_failing_database_is_the_cause_not_the_step():
    store = MemoryStore(step=10)
    gen = generator(store, wait_budget="100ms", retry_min="5ms", retry_max="10ms").start()
    store.fail = True
    try:
        message = unavailable(gen, after_a_failed_fetch=True)
    finally:
        gen.close()
    assert "the last fetch failed: database down" in message
    assert "check that the database is up" in message
    assert STEP_ADVICE not in message


def test_database_that_does_not_answer_is_named():
    class Named(MemoryStore):
        where = "leaf_alloc at postgresql://db.example/ids"

    store = Named(step=10)
    gen = generator(store, wait_budget="100ms").start()
    store.gate.clear()  # the next fetch hangs, as on a server that accepts TCP and is silent
    try:
        message = unavailable(gen)
    finally:
        store.gate.set()
        gen.close()
    assert "segment store (leaf_alloc at postgresql://db.example/ids) did not answer" in message
    assert STEP_ADVICE not in message


def test_step_advice_when_segments_arrived_and_were_used_up():
    """A caller that waited while fetches completed but others drained every segment."""
    from flakekit.generators.segment import _Wait

    store = MemoryStore(step=10)
    gen = generator(store, wait_budget="100ms").start()
    try:
        fetches = gen.stats().fetches
        with pytest.raises(SegmentUnavailableError, match=STEP_ADVICE):
            gen._raise_unavailable(_Wait(0.0, fetches - 1))
        with pytest.raises(SegmentUnavailableError, match="did not answer"):
            gen._raise_unavailable(_Wait(0.0, fetches))
    finally:
        gen.close()


@pytest.mark.parametrize("kind", ["postgresql", "mariadb"])
def test_cli_next_against_a_database_that_is_down(kind, tmp_path, capsys):
    from sqlalchemy.engine import make_url

    url = unreachable_url(kind)
    port = make_url(url).port
    config = write_segment_toml(tmp_path, url, "invoices")
    try:
        main(["next", "invoices", "-c", str(config)])
    except SystemExit as exc:
        code = exc.code
    _, err = capsys.readouterr()
    error = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(error) == 1, err
    assert f"127.0.0.1:{port}" in error[0] or f"port {port}" in error[0]
    assert "check that the database is up" in error[0] and STEP_ADVICE not in error[0]


