"""A refusal relayed from a key's owner names the node that refused (issue 20): a peer's
``404 unknown_key`` used to reach the client naming neither node."""

from __future__ import annotations

import json

from flakekit_server.cluster import _name_refuser


def test_a_relayed_error_names_the_refusing_node():
    body = json.dumps({"error": "unknown_key", "status": 404,
                       "message": "no generator serves key 'orders'"}).encode()
    data = json.loads(_name_refuser(body, "n2", "http://10.0.0.7:8080"))
    assert data["message"] == ("node 'n2' (http://10.0.0.7:8080) answered: no generator "
                               "serves key 'orders'")
    assert (data["node"], data["error"], data["status"]) == ("n2", "unknown_key", 404)


def test_a_body_that_is_not_a_json_object_is_relayed_unchanged():
    assert _name_refuser(b"-3", "n2", "http://h:1") == b"-3"
    assert _name_refuser(b"[1]", "n2", "http://h:1") == b"[1]"
