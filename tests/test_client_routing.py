"""The client's decisions without I/O (flakekit.client.Routing): what a 421, a 503, an owner
epoch or a view means. The same requests against real nodes: plugins/flakekit-server/tests/
test_client*.py."""

from __future__ import annotations

import json

import pytest

from flakekit.client import (
    DEFAULT_RETRY_AFTER,
    VIEW_EPOCH,
    Done,
    Retry,
    Routing,
    parse_view,
)
from flakekit.errors import (
    ClientConnectionError,
    ClientError,
    ClientRefusedError,
    ClientUnavailableError,
    StaleOwnerEpochError,
)
from flakekit.values.cluster import Member
from flakekit.values.owners import owner_of

A, B = "http://127.0.0.1:9001", "http://127.0.0.1:9002"


def view_body(epoch: int = 3, owners: dict | None = None, hash: str = "hrw-xxh64-v1") -> bytes:
    return json.dumps({"cluster": "c", "epoch": epoch, "hash": hash, "owners": owners or {},
                       "members": [{"node": "a", "advertise": A, "weight": 1, "state": "alive"},
                                   {"node": "b", "advertise": B, "weight": 2,
                                    "state": "alive"}]}).encode()


def routing(**kw) -> Routing:
    options = {"timeout": 1.0, "retry_budget": 1.0, "buffer": 0, **kw}
    return Routing([A, B], **options)


def with_view(r: Routing, **kw) -> Routing:
    r.set_view(parse_view(view_body(**kw), A), 0.0)
    return r


def ok(ids: list[int], epoch: int | None = None) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"ranges": [{"start": ids[0], "stop": ids[-1] + 1, "step": 1}]}).encode()
    headers = {} if epoch is None else {"x-flakekit-owner-epoch": str(epoch)}
    return 200, headers, body


def test_strict_key_goes_to_its_owner_with_the_view_epoch():
    r = with_view(routing(), owners={"inv": "b"})
    plan = r.plan("inv", 5, [])
    assert plan.strict and plan.base == B and plan.headers[VIEW_EPOCH] == "3"
    assert plan.path == "/api/v1/next/inv?count=5&format=ranges"


def test_owner_by_the_published_hash_for_a_learned_strict_key():
    r = with_view(routing())
    r.learned_strict.add("k-17")
    owner = owner_of("k-17", [Member("a", A, 1), Member("b", B, 2)])
    assert r.plan("k-17", 1, []).base == (A if owner.node == "a" else B)


def test_a_generator_is_routed_by_its_key():
    r = with_view(routing(), owners={"invoice": "b"})
    r.set_route_keys(json.dumps({"generators": [{"name": "invoices", "key": "invoice"},
                                                {"name": "orders"}]}).encode())
    assert r.is_strict("invoices") and r.plan("invoices", 1, []).base == B
    assert not r.is_strict("orders") and VIEW_EPOCH not in r.plan("orders", 1, []).headers


def test_unknown_hash_routes_by_published_owners_only():
    r = with_view(routing(), owners={"inv": "a"}, hash="something-else")
    assert r.owner_map is None and r.plan("inv", 1, []).base == A
    r.learned_strict.add("other")
    assert r.owner_base("other") is None   # not computed with a hash we do not know


def test_non_strict_keys_rotate_over_the_nodes():
    r = routing()
    bases = {r.plan("x", 1, []).base for _ in range(4)}
    assert bases == {A, B}
    first = r.plan("x", 1, [])
    assert r.plan("x", 1, [first.base]).base != first.base   # untried node first


def test_421_records_the_owner_and_rereads_the_view():
    r = with_view(routing(), owners={"inv": "a"})
    plan = r.plan("inv", 1, [])
    body = json.dumps({"error": "misdirected", "owner": "b", "advertise": B, "epoch": 3,
                       "message": "not me"}).encode()
    step = r.on_answer(plan, 421, {}, body, 0.0)
    assert isinstance(step, Retry) and step.delay == 0 and step.refresh == A
    assert r.hints["inv"] == (3, B) and r.plan("inv", 1, []).base == B
    r.set_view(parse_view(view_body(epoch=3, owners={"inv": "a"}), A), 1.0)
    assert r.plan("inv", 1, []).base == B        # the hint is as new as the view: kept
    r.set_view(parse_view(view_body(epoch=4, owners={"inv": "a"}), A), 2.0)
    assert r.plan("inv", 1, []).base == A        # a newer view replaces it


def test_421_with_a_new_advertised_node_adds_it():
    r = with_view(routing(), owners={"inv": "a"})
    body = json.dumps({"owner": "c", "advertise": "http://127.0.0.1:9003", "epoch": 4}).encode()
    r.on_answer(r.plan("inv", 1, []), 421, {}, body, 0.0)
    assert "http://127.0.0.1:9003" in r.nodes


def test_421_to_an_owner_that_just_failed_waits_instead_of_bouncing():
    """The owner crashed: it refuses connections and the other nodes' 421s still name it
    until the cluster moves the key. That is a wait within the budget (like a 503), not a
    redirect that counts toward the limit, so the client rides out a crash hand-off."""
    r = with_view(routing(), owners={"inv": "b"})
    plan = r.plan("inv", 1, [])
    assert plan.base == B
    r.on_connection_error(plan, ConnectionRefusedError("refused"), 1)
    again = r.plan("inv", 1, [B])
    body = json.dumps({"error": "misdirected", "owner": "b", "advertise": B, "epoch": 3,
                       "message": "not me"}).encode()
    step = r.on_answer(again, 421, {}, body, 0.0)   # another node: "b owns it"
    assert isinstance(step, Retry) and not step.redirect and step.delay > 0
    assert isinstance(step.error, ClientUnavailableError)
    assert "does not answer" in str(step.error)
    # a 421 naming a node that answers is a real redirect
    r.down.clear()
    step = r.on_answer(again, 421, {}, body, 0.0)
    assert isinstance(step, Retry) and step.redirect and step.delay == 0


def test_421_from_a_node_behind_the_known_view_keeps_the_newer_owner():
    """During a hand-off the nodes' views differ for up to a renewal interval: a 421 from a
    node still at an older epoch must not send the client back to the old owner (and must
    not count as a redirect); the client waits a moment and tries the newer owner again."""
    r = with_view(routing(), owners={"inv": "a"})   # view epoch 3
    newer = json.dumps({"owner": "b", "advertise": B, "epoch": 4}).encode()
    step = r.on_answer(r.plan("inv", 1, []), 421, {}, newer, 0.0)
    assert step.redirect and r.plan("inv", 1, []).base == B
    older = json.dumps({"owner": "a", "advertise": A, "epoch": 3}).encode()
    step = r.on_answer(r.plan("inv", 1, []), 421, {}, older, 0.0)
    assert isinstance(step, Retry) and not step.redirect and step.delay > 0
    assert isinstance(step.error, ClientUnavailableError) and "older than 4" in str(step.error)
    assert r.hints["inv"] == (4, B) and r.plan("inv", 1, []).base == B


def test_421_without_a_usable_hint_only_rereads():
    r = with_view(routing(), owners={"inv": "a"})
    step = r.on_answer(r.plan("inv", 1, []), 421, {}, b"not json", 0.0)
    assert isinstance(step, Retry) and step.refresh == A and "inv" not in r.hints
    assert step.redirect


def test_503_waits_retry_after_for_a_strict_key():
    r = with_view(routing(), owners={"inv": "b"})
    body = json.dumps({"error": "key_moving", "message": "moving"}).encode()
    step = r.on_answer(r.plan("inv", 1, []), 503, {"retry-after": "2"}, body, 0.0)
    assert isinstance(step, Retry) and step.delay == 2.0 and step.refresh == B
    assert isinstance(step.error, ClientUnavailableError) and "key_moving" in str(step.error)


def test_503_tries_another_node_first_for_a_non_strict_key():
    r = routing()
    plan = r.plan("x", 1, [])
    first = r.on_answer(plan, 503, {"retry-after": "3"}, b"{}", 0.0, tries=1)
    assert isinstance(first, Retry) and first.delay == 0.0
    second = r.on_answer(r.plan("x", 1, [plan.base]), 503, {"retry-after": "3"}, b"{}", 0.0,
                         tries=2)
    assert isinstance(second, Retry) and second.delay == 3.0


@pytest.mark.parametrize(("raw", "delay"), [(None, DEFAULT_RETRY_AFTER), ("1.5", 1.5),
                                            ("Wed, 21 Oct 2015 07:28:00 GMT", DEFAULT_RETRY_AFTER),
                                            ("-4", 0.0), ("9999", 60.0)])
def test_retry_after_values(raw, delay):
    r = with_view(routing(), owners={"inv": "a"})
    headers = {} if raw is None else {"retry-after": raw}
    assert r.on_answer(r.plan("inv", 1, []), 503, headers, b"", 0.0).delay == delay


def test_client_errors_are_raised_with_the_servers_message():
    r = routing()
    body = json.dumps({"error": "bad_request", "message": "count must be ..."}).encode()
    with pytest.raises(ClientRefusedError) as info:
        r.on_answer(r.plan("x", 1, []), 400, {}, body, 0.0)
    assert info.value.status == 400 and info.value.code == "bad_request"
    assert str(info.value).endswith("400 bad_request: count must be ...")


def test_unknown_generator_falls_back_to_the_leaf_url():
    r = routing()
    body = json.dumps({"error": "unknown_generator", "message": "no"}).encode()
    assert isinstance(r.on_answer(r.plan("tag", 3, []), 404, {}, body, 0.0), Retry)
    plan = r.plan("tag", 3, [])
    assert plan.leaf and plan.path == "/api/segment/get/tag" and plan.count == 1
    assert r.on_answer(plan, 200, {}, b"42", 0.0) == Done([42])


def test_owner_epochs_never_go_back():
    r = with_view(routing(), owners={"inv": "a"})
    plan = r.plan("inv", 2, [])
    assert r.on_answer(plan, *ok([1, 2], epoch=5), 0.0) == Done([1, 2])
    assert r.on_answer(plan, *ok([3, 4], epoch=5), 0.0) == Done([3, 4])
    with pytest.raises(StaleOwnerEpochError) as info:
        r.on_answer(plan, *ok([5, 6], epoch=4), 0.0)
    assert (info.value.epoch, info.value.seen, info.value.key) == (4, 5, "inv")
    assert r.on_answer(plan, *ok([7, 8], epoch=6), 0.0) == Done([7, 8])
    assert r.epochs["inv"] == 6
    assert r.view_due(1.0)     # an epoch above the view's: the view is re-read


def test_an_owner_epoch_marks_the_key_strict():
    r = routing()
    assert not r.is_strict("k")
    r.on_answer(r.plan("k", 1, []), *ok([1], epoch=1), 0.0)
    assert r.is_strict("k")


def test_garbled_answers_are_errors():
    r = routing()
    plan = r.plan("k", 2, [])
    with pytest.raises(ClientError, match="not the expected ID list"):
        r.on_answer(plan, 200, {}, b"<html>", 0.0)
    with pytest.raises(ClientError, match="asked for 2 IDs, got 1"):
        r.on_answer(plan, *ok([1]), 0.0)
    with pytest.raises(ClientError, match="is not an integer"):
        r.on_answer(plan, 200, {"x-flakekit-owner-epoch": "x"}, ok([1, 2])[2], 0.0)


def test_connection_error_marks_the_node_down():
    r = routing()
    plan = r.plan("k", 1, [])
    step = r.on_connection_error(plan, ConnectionRefusedError(), 1)
    assert step.delay == 0.0 and isinstance(step.error, ClientConnectionError)
    assert "connection refused" in str(step.error)
    assert r.ordered()[-1] == plan.base       # tried last for a while


def test_an_older_view_is_ignored():
    r = with_view(routing(), epoch=5, owners={"inv": "a"})
    r.set_view(parse_view(view_body(epoch=4, owners={"inv": "b"}), B), 1.0)
    assert r.view is not None and r.view.epoch == 5


@pytest.mark.parametrize("body", [b"", b"[]", b'{"epoch": 1}', b'{"epoch": "x", "members": []}'])
def test_a_bad_view_is_a_one_line_error(body):
    with pytest.raises(ClientError, match="cluster view is not the expected JSON") as info:
        parse_view(body, A)
    assert "\n" not in str(info.value)


def test_after_a_refusal_the_view_is_read_from_another_node_first():
    """A node that refuses (503) may hold the stale view that named it the owner: the
    client re-reads the view from the other nodes first, the refusing one last."""
    r = with_view(routing(), owners={"inv": "b"})
    step = r.on_answer(r.plan("inv", 1, []), 503, {"retry-after": "1"},
                       b'{"error": "cluster_unavailable", "message": "lease ran out"}', 0.0)
    assert step.refresh == B
    for _ in range(3):   # whatever the round-robin turn
        assert r.view_sources(step.refresh)[-1] == B


def test_the_default_budget_outlasts_the_documented_crash_windows():
    from flakekit.client import DEFAULT_RETRY_BUDGET, Client

    assert Client(A).routing.retry_budget == DEFAULT_RETRY_BUDGET >= 25.0
