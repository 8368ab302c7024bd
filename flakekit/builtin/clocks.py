"""Built-in clocks: monotonic (default) and system."""

from __future__ import annotations

from flakekit.pluginhost.markers import hookimpl
from flakekit.pluginhost.registry import ClockFactory, Register
from flakekit.values.clock import MonotonicClock, MonotonicSettings, SystemClock, SystemSettings


@hookimpl
def flakekit_register_clocks(register: Register[ClockFactory]) -> None:
    register(
        "monotonic", MonotonicClock.from_settings, settings=MonotonicSettings,
        description="wall time read once, advanced by the monotonic clock (never goes back)",
    )
    register(
        "system", SystemClock.from_settings, settings=SystemSettings,
        description="the host's wall clock; waits out steps back up to max_backward",
    )
