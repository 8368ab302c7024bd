"""ClusterSettings: what one node needs to take part in a cluster (``[cluster]``).

Durations are seconds (a number, or a string such as ``"10s"``, ``"500ms"``); they are
kept as floats because they only feed waits and lease requests, never the hot path.
"""

from __future__ import annotations

from typing import Any

import attrs

from flakekit.errors import FieldError
from flakekit.values.owners import MAX_WEIGHT
from flakekit.values.timeunits import parse_duration_ns

__all__ = ["ClusterSettings"]


def _seconds(field: str, value: object) -> float:
    try:
        return parse_duration_ns(value, default_unit="s") / 1e9
    except ValueError as exc:
        raise FieldError(field, f"{field}: {exc} (seconds, or a duration such as "
                         "'10s' or '500ms')") from None


def _lease_s(value: object) -> float:
    return _seconds("lease", value)


def _handoff_wait_s(value: object) -> float:
    return _seconds("handoff_wait", value)


def _debounce_s(value: object) -> float:
    return _seconds("debounce", value)


def _text(field: str, fix: str) -> Any:
    def check(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
        if not isinstance(value, str) or not value.strip() or len(value) > 255:
            raise FieldError(field, f"{field} must be a non-empty string of at most 255 "
                             f"characters ({fix}), got {value!r}")
    return check


@attrs.frozen
class ClusterSettings:
    """One node's ``[cluster]`` settings.

    Attributes:
        name: the cluster (nodes with the same name and membership store form one).
        node: this node's stable id (from config or ``$FLAKEKIT_NODE``; never ip:port,
            which changes on a restart).
        advertise: the URL peers and clients reach this node at (``http://10.0.0.5:8080``).
        weight: this node's share of strict keys, an integer from 1 to 64 (default 1).
        lease: seconds of the node's membership lease (default 10): a node that cannot
            renew for that long stops serving strict keys, and a crashed owner's keys move
            after about that long.
        handoff_wait: seconds a request for a key that is being handed off waits for the
            new owner before ``KeyMovingError`` (default 2; 0 answers at once).
        debounce: seconds the alive members must differ from the view before this node
            proposes a new view (default 0.5: a rolling restart moves keys once, not per
            node blip).
    """

    name: str = attrs.field(validator=_text("name", "the cluster's name"))
    node: str = attrs.field(validator=_text("node", "set node = ... or $FLAKEKIT_NODE"))
    advertise: str = attrs.field(
        default="", validator=attrs.validators.instance_of(str))
    weight: int = attrs.field(default=1)
    lease: float = attrs.field(default=10.0, converter=_lease_s)
    handoff_wait: float = attrs.field(default=2.0, converter=_handoff_wait_s)
    debounce: float = attrs.field(default=0.5, converter=_debounce_s)

    @weight.validator
    def _check_weight(self, attribute: attrs.Attribute[int], value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WEIGHT:
            raise FieldError("weight", f"weight must be an integer from 1 to {MAX_WEIGHT} "
                             f"(a node's relative share of strict keys), got {value!r}")

    def __attrs_post_init__(self) -> None:
        if self.lease <= 0:
            raise FieldError("lease", f"lease must be more than 0 seconds (e.g. '10s'), "
                             f"got {self.lease:g}")
        if self.advertise and "://" not in self.advertise:
            raise FieldError("advertise", "advertise must be a URL such as "
                             f"'http://10.0.0.5:8080', got {self.advertise!r}")
