"""An event recorder: a stand-in for pluggy's ``pm.hook`` that remembers every event."""

from __future__ import annotations

from typing import Any

from flakekit.values.events import Events

__all__ = ["EventRecorder"]


class EventRecorder:
    """Records every ``flakekit_*`` event hook call as ``(name, kwargs)``.

    Pass it where a hook relay goes (``Events(recorder)``, or ``recorder.events``), then
    assert on ``calls``, ``names()`` or ``alerts()``.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("flakekit_"):
            raise AttributeError(name)
        return lambda **kwargs: self.calls.append((name, kwargs))

    @property
    def events(self) -> Events:
        """An :class:`Events` that reports here."""
        return Events(self)

    def names(self) -> list[str]:
        """The hook names called, in order."""
        return [name for name, _ in self.calls]

    def alerts(self) -> list[str]:
        """The ``kind`` of every ``flakekit_alert``, in order."""
        return [kw["kind"] for name, kw in self.calls if name == "flakekit_alert"]
