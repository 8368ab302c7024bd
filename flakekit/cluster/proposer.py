"""Proposer: when this node asks the store to move the view to the serving members.

Any node may propose; the store's compare-and-set picks one winner per epoch, so a loser
just re-reads. Not gossip: nodes never tell each other who is alive, they all read the
same member records. The debounce keeps a blip (a node renewing late, a rolling restart)
from moving keys back and forth.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from flakekit.values.cluster import Member, MemberInfo, View

__all__ = ["Proposer"]


@attrs.define
class Proposer:
    """Decides, from the member records and the view, whether to propose now.

    ``wanted(infos, view, now_ns)`` returns the members to propose (sorted), or None when
    the view already lists exactly the serving members, when they have differed for less
    than ``debounce_ns``, or when no member serves (an empty view routes nothing; the last
    view stays).
    """

    debounce_ns: int
    _differs_since: int | None = None
    _differs_for: tuple[Member, ...] | None = None
    proposals: int = 0
    lost: int = 0

    def wanted(self, infos: Iterable[MemberInfo], view: View, now_ns: int,
               *, at_once: bool = False) -> tuple[Member, ...] | None:
        serving = tuple(sorted({info.member for info in infos if info.serving}))
        if not serving or serving == tuple(sorted(view.members)):
            self._differs_since = self._differs_for = None
            return None
        if serving != self._differs_for:   # a different difference: debounce it afresh
            self._differs_for, self._differs_since = serving, now_ns
        assert self._differs_since is not None
        if not at_once and now_ns - self._differs_since < self.debounce_ns:
            return None
        return serving

    def outcome(self, won: bool) -> None:
        """Count a proposal; either way the difference is debounced again from now."""
        self.proposals += 1
        if not won:
            self.lost += 1
        self._differs_since = self._differs_for = None

    def due_in_ns(self, now_ns: int) -> int | None:
        """Nanoseconds until a pending difference may be proposed (None: nothing pending)."""
        if self._differs_since is None:
            return None
        return max(0, self._differs_since + self.debounce_ns - now_ns)
