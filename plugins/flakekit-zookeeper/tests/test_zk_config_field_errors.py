"""ZooKeeper settings' cross-field checks name their field with ``FieldError`` (issue 11
item 5), so the config error's path comes from the error, not from its message text."""

from __future__ import annotations

import pytest
from flakekit_zookeeper import ZooKeeperSettings

from flakekit.plugin import FieldError
from flakekit.testing.configs import assert_field_error


@pytest.mark.parametrize(("table", "field"), [
    ({"session_timeout": "4s", "safety_window": "3s"}, "safety_window"),
    ({"session_timeout": "0.5s"}, "session_timeout"),
    ({"name": "a/b"}, "name"),
    ({"ip": "not-an-ip"}, "ip"),
    ({"root": "/snowflake/"}, "root"),
], ids=["safety", "session-floor", "name", "ip", "root"])
def test_config_checks_raise_field_error(table, field):
    assert_field_error(ZooKeeperSettings, table, field,
                       starts=f"'{field}' must")   # the text users saw before


def test_membership_root_must_be_a_path():
    from flakekit_zookeeper import ZooKeeperMembershipSettings

    with pytest.raises(FieldError, match="'root' must be a znode path such as '/flakekit'"):
        ZooKeeperMembershipSettings(root=None)
