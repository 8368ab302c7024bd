"""The rule for segment keys (Leaf's ``biz_tag``), in one place: ``flakekit segments
create``, the listing of ``leaf_alloc`` rows and the HTTP server's URLs all apply it, so a
key the CLI accepts is one the server serves.

``biz_tag`` is ``varchar(128)``; a key travels in URL paths (``/api/segment/get/{key}``), so
it keeps to characters that need no escaping and cannot start like a relative path.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from flakekit.errors import FieldError

__all__ = ["KEY_RE", "KEY_RULE", "key_problem", "root_field"]

#: matched with ``fullmatch`` (``$`` alone also matches before a final newline)
KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,127}")
KEY_RULE = "use 1 to 128 of A-Z a-z 0-9 _ . : - (not starting with . : -)"


def key_problem(key: object) -> str | None:
    """Why ``key`` is no valid segment key (one line), or None when it is one."""
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        shown = key if not isinstance(key, str) or len(key) <= 40 else key[:40] + "..."
        return f"{shown!r} is not a valid segment key: {KEY_RULE}"
    return None


def root_field(default: str | None, *, example: str, what: str = "a key prefix") -> Any:
    """An attrs field holding where a store keeps its keys (``'/flakekit'``): absolute, no
    trailing or doubled ``/``, so that joining a name below it gives one valid path
    (``None`` allowed only when it is the default); a bad value raises a ``FieldError``."""
    def check(_: object, field: attrs.Attribute[Any], value: object) -> None:
        if value is None and default is None:
            return
        if not isinstance(value, str) or not value.startswith("/") or value.endswith("/") \
                or "//" in value:
            raise FieldError(field.name, f"'{field.name}' must be {what} such as {example!r}, "
                             f"got {value!r}")
    return attrs.field(default=default, validator=check)
