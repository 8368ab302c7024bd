"""Packaging: the license, metadata, one version, the changelog tool, and that every
distribution in the repository builds a clean wheel (only its own package, even with a
stale ``build/`` directory of another distribution lying around)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import flakekit
from flakekit.__about__ import __version__

ROOT = Path(__file__).resolve().parent.parent
#: (directory, distribution, package) of every distribution in the repository
DISTRIBUTIONS = [
    (".", "flakekit", "flakekit"),
    ("plugins/flakekit-server", "flakekit-server", "flakekit_server"),
    ("plugins/flakekit-zookeeper", "flakekit-zookeeper", "flakekit_zookeeper"),
    ("plugins/flakekit-etcd", "flakekit-etcd", "flakekit_etcd"),
    ("plugins/flakekit-redis", "flakekit-redis", "flakekit_redis"),
    ("examples/flakekit-example-plugin", "flakekit-example-plugin", "flakekit_example"),
]
IDS = [d[1] for d in DISTRIBUTIONS]


def pyproject(directory: str) -> dict:
    return tomllib.loads((ROOT / directory / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_distribution_is_listed():
    """The list above covers every pyproject.toml in the repository."""
    found = {str(p.parent.relative_to(ROOT)) for p in ROOT.glob("**/pyproject.toml")
             if not any(part.startswith(".") or part in ("build", "node_modules")
                        for part in p.relative_to(ROOT).parts)}
    assert found == {d for d, _, _ in DISTRIBUTIONS}


def test_license_is_mit_everywhere():
    """LICENSE is the MIT text the metadata claims; each distribution ships the same file."""
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License") and "flakekit authors" in text
    assert "THE SOFTWARE IS PROVIDED \"AS IS\"" in text
    for directory, _, _ in DISTRIBUTIONS:
        project = pyproject(directory)["project"]
        assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
        assert (ROOT / directory / "LICENSE").read_text(encoding="utf-8") == text


@pytest.mark.parametrize(("directory", "dist", "package"), DISTRIBUTIONS, ids=IDS)
def test_metadata(directory, dist, package):
    """Name, classifiers (the Python versions we test), no placeholder URLs, hatchling."""
    data = pyproject(directory)
    project = data["project"]
    assert project["name"] == dist
    classifiers = project["classifiers"]
    for minor in (11, 12, 13):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers
    assert not any(c.startswith("License ::") for c in classifiers)  # license is an SPDX expression
    for url in project.get("urls", {}).values():
        assert "example." not in url and "TODO" not in url
    assert data["build-system"]["build-backend"] == "hatchling.build"
    assert data["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == [package]


def test_one_version():
    """flakekit/__about__.py is the version: the package, `--version` and the build read it."""
    assert flakekit.__version__ == __version__
    assert pyproject(".")["project"]["dynamic"] == ["version"]
    assert pyproject(".")["tool"]["hatch"]["version"]["path"] == "flakekit/__about__.py"
    out = subprocess.run([sys.executable, "-m", "flakekit.cli", "--version"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert out.strip() == f"flakekit, version {__version__}"


@pytest.mark.parametrize(("directory", "dist", "package"), DISTRIBUTIONS[1:], ids=IDS[1:])
def test_plugins_pin_a_compatible_core(directory, dist, package):
    """Each plugin depends on a flakekit range that contains this core's version and
    stops before the next minor (0.x minors may break plugins)."""
    project = pyproject(directory)["project"]
    pins = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "flakekit"]
    assert len(pins) == 1
    spec = pins[0].specifier
    assert __version__ in spec
    major, minor = (int(x) for x in __version__.split(".")[:2])
    assert f"{major}.{minor + 1}.0" not in spec


def test_changelog_is_built_by_towncrier(tmp_path):
    """`towncrier build` turns a changelog.d/ fragment into a CHANGELOG.md section."""
    towncrier = shutil.which("towncrier", path=str(Path(sys.executable).parent))
    if towncrier is None:
        pytest.skip("towncrier is not installed (pip install -e '.[test]')")
    for name in ("pyproject.toml", "CHANGELOG.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "changelog.d", tmp_path / "changelog.d")
    shutil.copytree(ROOT / "flakekit", tmp_path / "flakekit")
    (tmp_path / "changelog.d" / "+probe.fixed.md").write_text("The probe works.\n")
    subprocess.run([towncrier, "build", "--keep", "--version", "9.9.9",
                    "--date", "2030-01-01"], cwd=tmp_path, check=True, capture_output=True,
                   timeout=120)
    text = (tmp_path / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## 9.9.9 (2030-01-01)" in text and "### Fixed" in text and "- The probe works." in text
    assert text.index("## 9.9.9") < text.index("## 0.1.0")  # newest first
    assert "## 0.1.0" in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def _copy_repo(dest: Path) -> None:
    ignore = shutil.ignore_patterns(".git", ".venv*", "__pycache__", "*.egg-info", ".hypothesis",
                                    ".pytest_cache", ".mypy_cache", ".ruff_cache", "build",
                                    "dist", "test-artifacts", "*.db")
    shutil.copytree(ROOT, dest, ignore=ignore)


def _wheel_names(directory: Path, out: Path) -> tuple[str, set[str]]:
    """Build ``directory`` as the docs say (`pip wheel --no-deps -w OUT DIR`); return the
    wheel's file name and the top-level names inside it."""
    before = set(out.glob("*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--disable-pip-version-check", "-w", str(out), str(directory)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = set(out.glob("*.whl")) - before
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    return wheel.name, {name.split("/")[0] for name in names}


def _plant_stale_build(directory: Path) -> None:
    """What a setuptools build leaves behind: build/lib/<some package>/."""
    stale = directory / "build" / "lib" / "stale_other_package"
    stale.mkdir(parents=True)
    (stale / "__init__.py").write_text("LEFT_OVER = True\n")


@pytest.mark.slow
def test_every_distribution_builds_a_clean_wheel(tmp_path):
    """Each distribution's wheel holds only its own package and dist-info (with the
    license), even with a stale build/ directory in its folder."""
    repo = tmp_path / "repo"
    _copy_repo(repo)
    out = tmp_path / "wheels"
    for directory, dist, package in DISTRIBUTIONS:
        _plant_stale_build(repo / directory)
        name, top = _wheel_names(repo / directory, out)
        dist_info = f"{dist.replace('-', '_')}-{_version(repo / directory, package)}.dist-info"
        assert name.startswith(dist_info.removesuffix(".dist-info") + "-")
        assert top == {package, dist_info}, (dist, top)
        with zipfile.ZipFile(out / name) as zf:
            assert f"{dist_info}/licenses/LICENSE" in zf.namelist()
            # flakekit's fixtures are opt-in: no wheel registers a pytest plugin
            entry_points = (zf.read(f"{dist_info}/entry_points.txt").decode()
                            if f"{dist_info}/entry_points.txt" in zf.namelist() else "")
            assert "[pytest11]" not in entry_points, dist
            assert not [n for n in zf.namelist() if "__pycache__" in n or n.endswith(".pyc")]


@pytest.mark.slow
def test_a_plugin_copied_from_the_example_packages_only_itself(tmp_path):
    """The docs say: copy examples/flakekit-example-plugin to start a plugin. A copy made
    after the example was built (build/ inside), renamed as its README says, must not
    package the example's module."""
    example = ROOT / "examples" / "flakekit-example-plugin"
    mine = tmp_path / "flakekit-mine"
    shutil.copytree(example, mine, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    old_build = mine / "build" / "lib" / "flakekit_example"
    old_build.mkdir(parents=True)
    shutil.copy(example / "flakekit_example" / "__init__.py", old_build / "__init__.py")
    (mine / "flakekit_example").rename(mine / "flakekit_mine")
    toml = (mine / "pyproject.toml").read_text(encoding="utf-8")
    toml = toml.replace('name = "flakekit-example-plugin"', 'name = "flakekit-mine"')
    toml = toml.replace('example = "flakekit_example"', 'mine = "flakekit_mine"')
    toml = toml.replace('packages = ["flakekit_example"]', 'packages = ["flakekit_mine"]')
    (mine / "pyproject.toml").write_text(toml, encoding="utf-8")
    _, top = _wheel_names(mine, tmp_path / "wheels")
    assert top == {"flakekit_mine", "flakekit_mine-0.1.0.dist-info"}


def _version(directory: Path, package: str) -> str:
    project = tomllib.loads((directory / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    if "version" in project:
        return str(project["version"])
    source = directory / ("flakekit/__about__.py" if package == "flakekit"
                          else f"{package}/__init__.py")
    namespace: dict = {}
    line = next(x for x in source.read_text(encoding="utf-8").splitlines()
                if x.startswith("__version__"))
    exec(line, namespace)
    return str(namespace["__version__"])
