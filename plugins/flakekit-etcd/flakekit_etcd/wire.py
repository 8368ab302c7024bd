"""The shapes of etcd's v3 JSON gateway that the store and the membership both send:
base64 keys and values, range ends, and the compares and requests of a ``kv/txn``."""

from __future__ import annotations

import base64
from typing import Any

__all__ = [
    "b64",
    "created",
    "delete",
    "exists",
    "get",
    "kv_at",
    "leased",
    "modified",
    "put",
    "range_end",
    "range_payload",
    "unb64",
]


def b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text or "")


def range_end(prefix: str) -> bytes:
    """The range end that covers every key starting with ``prefix``."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return bytes(raw)


def range_payload(key: str, end: bytes | None = None, *,
                  keys_only: bool = False) -> dict[str, Any]:
    """A ``kv/range`` request: ``key`` alone, or up to ``end`` (exclusive)."""
    payload: dict[str, Any] = {"key": b64(key)}
    if end is not None:
        payload["range_end"] = b64(end)
    if keys_only:
        payload["keys_only"] = True
    return payload


# -- the compares of a transaction -----------------------------------------------------------
def created(key: str, revision: int) -> dict[str, Any]:
    """The key was created at ``revision`` (0: it does not exist)."""
    return {"key": b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": revision}


def exists(key: str) -> dict[str, Any]:
    return {"key": b64(key), "result": "GREATER", "target": "CREATE", "create_revision": 0}


def modified(key: str, revision: int) -> dict[str, Any]:
    return {"key": b64(key), "result": "EQUAL", "target": "MOD", "mod_revision": revision}


def leased(key: str, lease: int) -> dict[str, Any]:
    return {"key": b64(key), "result": "EQUAL", "target": "LEASE", "lease": lease}


# -- the requests of a transaction -----------------------------------------------------------
def put(key: str, value: bytes, *, lease: int | None = None,
        keep_lease: bool = False) -> dict[str, Any]:
    request: dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease is not None:
        request["lease"] = lease
    if keep_lease:
        request["ignore_lease"] = True
    return {"request_put": request}


def get(key: str) -> dict[str, Any]:
    return {"request_range": {"key": b64(key)}}


def delete(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": b64(key)}}


def kv_at(body: dict[str, Any], index: int) -> dict[str, Any] | None:
    """The key read by the ``index``-th request of a transaction (None: no such key)."""
    responses = body.get("responses") or []
    if index >= len(responses):
        return None
    kvs = (responses[index].get("response_range") or {}).get("kvs") or []
    return kvs[0] if kvs else None
