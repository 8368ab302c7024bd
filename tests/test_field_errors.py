"""Cross-field checks name their field with ``FieldError`` (issue 11 item 5).

A check in ``__attrs_post_init__`` sees several fields; it says which one to fix by raising
``FieldError(field, message)``, and building the settings reports ``path.field: message``.
Nothing reads the field name out of the message text any more.
"""

from __future__ import annotations

import attrs
import pytest

import flakekit.plugin
from flakekit.assembly.settings import build_settings
from flakekit.builtin.sql import SqlAllocatorSettings
from flakekit.errors import ConfigError, FieldError, FlakekitError
from flakekit.generators.segment import SegmentSettings


@attrs.frozen
class Window:
    low: int = 0
    high: int = 10

    def __attrs_post_init__(self) -> None:
        if self.high <= self.low:
            raise FieldError("high", "must be above the lower bound")


@attrs.frozen
class Plain:
    low: int = 0

    def __attrs_post_init__(self) -> None:
        if self.low < 0:
            raise ValueError("'low' is negative")  # a plain ValueError: no field to name


def test_field_error_is_a_value_error_carrying_its_field():
    exc = FieldError("high", "must be above the lower bound")
    assert isinstance(exc, ValueError) and isinstance(exc, FlakekitError)
    assert exc.field == "high" and exc.message == str(exc) == "must be above the lower bound"
    assert flakekit.plugin.FieldError is FieldError  # plugins raise it too


def test_build_settings_names_the_field_the_check_gives():
    """The message does not mention ``high``: the path comes from the error, not its text."""
    with pytest.raises(ConfigError) as info:
        build_settings(Window, {"low": 5, "high": 3}, "generators.w")
    assert info.value.path == "generators.w.high"
    assert str(info.value) == "generators.w.high: must be above the lower bound"


def test_a_plain_value_error_names_the_table_not_a_guess():
    with pytest.raises(ConfigError) as info:
        build_settings(Plain, {"low": -1}, "generators.p")
    assert info.value.path == "generators.p"
    assert str(info.value) == "generators.p: 'low' is negative"


@pytest.mark.parametrize(
    ("cls", "table", "field"),
    [
        (SqlAllocatorSettings, {"heartbeat": "2h"}, "heartbeat"),
        (SegmentSettings, {"grow_below": "1h", "shrink_after": "30min"}, "shrink_after"),
        (SegmentSettings, {"retry_min": "100us"}, "retry_min"),
        (SegmentSettings, {"key": ""}, "key"),
    ],
    ids=["sql-heartbeat", "segment-durations", "segment-retry", "segment-key"],
)
def test_builtin_cross_field_checks_raise_field_error(cls, table, field):
    with pytest.raises(FieldError) as raw:
        cls(**table)
    assert raw.value.field == field
    with pytest.raises(ConfigError) as info:
        build_settings(cls, table, "generators.g.x")
    assert info.value.path == f"generators.g.x.{field}"
    assert info.value.message == raw.value.message


def test_the_message_parser_is_gone():
    import flakekit.assembly.settings as settings

    assert not hasattr(settings, "_field_in")
