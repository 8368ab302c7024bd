"""Contracts are enforced at build time, and a broken plugin is named, not fatal.

The plugins here are throw-away distributions: a module and a ``*.dist-info`` directory
(metadata + ``entry_points.txt``) in a temporary directory put on ``PYTHONPATH`` of a
``flakekit`` subprocess, so nothing is installed into this venv.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flakekit.errors import ContractError
from flakekit.pluginhost.contracts import WorkerAllocator, check_contract, members
from flakekit.pluginhost.registry import Registration


class NoRenew:
    """acquire/release/records/close, but no renew()."""

    renew_interval = 1.0

    def acquire(self, request): ...
    def release(self, lease, issued_until_ns): ...
    def records(self): return []
    def close(self): ...


#: a plugin whose allocator is :class:`NoRenew` (its source, copied into the plugin module)
NO_RENEW = f'''
import attrs
from flakekit import hookimpl


@attrs.frozen
class Settings:
    worker_id: int = 1


{inspect.getsource(NoRenew)}

@hookimpl
def flakekit_register_allocators(register):
    register("half", lambda settings, ctx: NoRenew(), settings=Settings)
'''

RAISES_ON_IMPORT = '''
raise RuntimeError("the vendor SDK is not configured")
'''


def make_dist(root: Path, dist: str, module: str, source: str, entry: str) -> Path:
    """A minimal installed distribution under ``root`` (which goes on PYTHONPATH)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n",
                                   encoding="utf-8")
    (info / "entry_points.txt").write_text(f"[flakekit]\n{entry} = {module}\n", encoding="utf-8")
    return root


def flakekit(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLAKEKIT_DISABLE_PLUGINS", "FLAKEKIT_LOAD_PLUGINS", "FLAKEKIT_CONFIG")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-m", "flakekit.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=cwd)


class TestContracts:
    def test_members_of_the_allocator_contract(self):
        """The protocol's members are read from the protocol, not listed by hand."""
        assert members(WorkerAllocator) == [
            "acquire", "close", "records", "release", "renew", "renew_interval"]

    def test_missing_member_is_named(self):
        """check_contract names the registration's origin and each missing member."""
        reg = Registration("allocator", "half", lambda: None, plugin="p",
                           origin="plugin 'p' (distribution d 0.1, module m)")
        with pytest.raises(ContractError) as info:
            check_contract(NoRenew(), WorkerAllocator, reg, "generators.g.allocator")
        assert str(info.value) == (
            "generators.g.allocator: allocator 'half' from plugin 'p' (distribution d 0.1, "
            "module m) returned NoRenew, which is not a WorkerAllocator: it lacks renew(); "
            "fix or disable that plugin")

    def test_config_check_refuses_an_allocator_without_renew(self, tmp_path):
        """`flakekit config check` exits 2 with one line naming the plugin and renew()."""
        site = make_dist(tmp_path / "site", "flakekit-half", "flakekit_half", NO_RENEW, "half")
        config = tmp_path / "flakekit.toml"
        config.write_text('[generators.g]\nallocator = { type = "half" }\n', encoding="utf-8")
        result = flakekit(site, "config", "check", str(config), cwd=tmp_path)
        assert result.returncode == 2, result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("error: generators.g.allocator: allocator 'half' from "
                                   "plugin 'half' (distribution flakekit-half 0.1, module "
                                   "flakekit_half)")
        assert "lacks renew()" in lines[0] and "Traceback" not in result.stderr


class TestBrokenPlugin:
    def test_import_failure_is_named_and_not_fatal(self, tmp_path):
        """A plugin raising on import: --help and `plugins` work and show it; building a
        config refuses with the FLAKEKIT_DISABLE_PLUGINS line, which then works."""
        site = make_dist(tmp_path / "site", "flakekit-sdk", "flakekit_sdk", RAISES_ON_IMPORT,
                         "sdk")
        help_ = flakekit(site, "--help", cwd=tmp_path)
        assert help_.returncode == 0, help_.stderr
        assert "Commands:" in help_.stdout
        listing = flakekit(site, "plugins", cwd=tmp_path)
        assert listing.returncode == 0, listing.stderr
        assert "sdk  (flakekit-sdk 0.1)  BROKEN" in listing.stdout
        assert ("plugin 'sdk' (entry point flakekit:sdk, distribution flakekit-sdk 0.1) is "
                "broken: import failed: RuntimeError: the vendor SDK is not configured; fix "
                "it, or skip it with FLAKEKIT_DISABLE_PLUGINS=sdk") in listing.stdout
        config = tmp_path / "flakekit.toml"
        config.write_text('[generators.g]\nallocator = { type = "static", worker_id = 1 }\n',
                          encoding="utf-8")
        check = flakekit(site, "config", "check", str(config), cwd=tmp_path)
        assert check.returncode == 2
        assert "FLAKEKIT_DISABLE_PLUGINS=sdk" in check.stderr
        assert "Traceback" not in check.stderr and len(check.stderr.strip().splitlines()) == 1
        env_skip = {**os.environ, "FLAKEKIT_DISABLE_PLUGINS": "sdk",
                    "PYTHONPATH": str(site)}
        skipped = subprocess.run([sys.executable, "-m", "flakekit.cli", "next", "g", "-c",
                                  str(config)], capture_output=True, text=True, timeout=120,
                                 env=env_skip, cwd=tmp_path)
        assert skipped.returncode == 0, skipped.stderr
        assert int(skipped.stdout) > 0
