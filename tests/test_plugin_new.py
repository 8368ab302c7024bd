"""``flakekit plugin new``: the skeleton it writes installs, registers, lints and passes its
own tests (in a throw-away venv, never in this one)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from flakekit.__about__ import __version__
from flakekit.cli.plugin_new import core_range, write_skeleton
from flakekit.testing.cli import run_cli, run_error_line
from flakekit.testing.venvs import venv_with

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def skeleton(tmp_path_factory) -> Path:
    return write_skeleton("acme-ids", tmp_path_factory.mktemp("skeleton"))


@pytest.fixture(scope="module")
def skeleton_venv(skeleton, tmp_path_factory) -> Path:
    """The ``bin`` of a ``--system-site-packages`` venv that sees this venv's packages
    (as ``example_plugin_venv`` in conftest.py) with the skeleton pip-installed into it."""
    try:
        return venv_with(skeleton, tmp_path_factory.mktemp("skeleton-venv") / "venv")
    except RuntimeError as exc:
        pytest.fail(str(exc))


def _run(bin_dir: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # not the PYTEST_XDIST_* of a parallel run: the skeleton's own pytest runs alone
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run([str(bin_dir / args[0]), *args[1:]], capture_output=True, text=True,
                          timeout=180, cwd=cwd, env=env)


def test_writes_the_files_with_the_core_range(skeleton):
    assert sorted(str(p.relative_to(skeleton)) for p in skeleton.rglob("*") if p.is_file()) == [
        "LICENSE", "README.md", "flakekit_acme_ids/__init__.py", "pyproject.toml",
        "tests/test_acme_ids.py",
    ]
    project = tomllib.loads((skeleton / "pyproject.toml").read_text())
    low, high = core_range(__version__)
    assert project["project"]["dependencies"] == [f"flakekit>={low},<{high}"]
    assert project["project"]["entry-points"]["flakekit"] == {"acme-ids": "flakekit_acme_ids"}
    assert project["build-system"]["build-backend"] == "hatchling.build"
    assert "MIT License" in (skeleton / "LICENSE").read_text()
    code = (skeleton / "flakekit_acme_ids" / "__init__.py").read_text()
    imports = {line.split()[1] for line in code.splitlines()
               if line.startswith(("from flakekit", "import flakekit"))}
    assert imports == {"flakekit", "flakekit.plugin"}
    assert "flakekit.testing" in (skeleton / "tests" / "test_acme_ids.py").read_text()


def test_command_writes_into_dir(capsys, tmp_path):
    status, out, err = run_cli(capsys, "plugin", "new", "acme", "--dir", str(tmp_path))
    assert (status, err) == (0, "")
    assert out.startswith(f"wrote {tmp_path / 'flakekit-acme'}/")
    assert (tmp_path / "flakekit-acme" / "flakekit_acme" / "__init__.py").is_file()


def test_core_range_is_the_running_minor_release():
    assert core_range("0.1.0") == ("0.1", "0.2")
    assert core_range("1.12.3rc1") == ("1.12", "1.13")


def test_installed_skeleton_registers_and_passes_its_tests(skeleton, skeleton_venv):
    plugins = _run(skeleton_venv, "flakekit", "plugins")
    assert plugins.returncode == 0, plugins.stderr
    assert "acme-ids  (flakekit-acme-ids 0.1.0)" in plugins.stdout
    listing = _run(skeleton_venv, "flakekit", "layout", "list")
    assert listing.returncode == 0, listing.stderr
    assert "acme-ids" in listing.stdout
    tests = _run(skeleton_venv, "python", "-m", "pytest", "-p", "no:cacheprovider", "-q",
                 cwd=skeleton)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "4 passed" in tests.stdout


def test_generated_code_passes_ruff_with_the_repo_config(skeleton):
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip("ruff is not installed (the lint extra)")
    result = subprocess.run([str(ruff), "check", "--no-cache", "--config",
                             str(ROOT / "pyproject.toml"), "."], cwd=skeleton,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name",
                         ["Acme", "acme_ids", "acme.ids", "acme-", "acme--ids", "1acme", ""])
def test_bad_name_is_one_line_and_exit_2(name, tmp_path, capsys):
    err = run_error_line(capsys, "plugin", "new", name, "--dir", str(tmp_path))
    assert err.startswith("error: NAME: ")
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_overwrite(tmp_path, capsys):
    (tmp_path / "flakekit-acme").mkdir()
    (tmp_path / "flakekit-acme" / "mine.txt").write_text("keep")
    err = run_error_line(capsys, "plugin", "new", "acme", "--dir", str(tmp_path))
    assert err.startswith("error: --dir: ") and "already exists" in err
    assert [p.name for p in (tmp_path / "flakekit-acme").iterdir()] == ["mine.txt"]
