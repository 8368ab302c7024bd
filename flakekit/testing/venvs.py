"""A throw-away venv that sees the running interpreter's packages, with one project
pip-installed into it: how tests install a plugin without touching the test's own venv."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import venv
from pathlib import Path

__all__ = ["venv_with"]


def venv_with(project: Path, env_dir: Path) -> Path:
    """Create ``env_dir`` (``--system-site-packages`` plus this interpreter's
    site-packages and editable installs behind its own), pip-install ``project`` into it
    with ``--no-deps``, and return its ``bin`` directory, whose ``flakekit`` runs
    ``python -m flakekit.cli`` in it. Raises RuntimeError with pip's output on failure."""
    venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(env_dir)
    bin_dir = env_dir / "bin"
    python = bin_dir / "python"
    # --system-site-packages sees the base interpreter's packages, not this venv's: add
    # this venv's site-packages (and its editable installs' .pth files) behind its own
    site_dir = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True).stdout.strip()
    parents = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    Path(site_dir, "zz_parent_venv.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in parents))
    # the console script: flakekit itself is not installed into the throw-away venv
    script = bin_dir / "flakekit"
    script.write_text(f'#!/bin/sh\nexec "{python}" -m flakekit.cli "$@"\n')
    script.chmod(0o755)
    # the projects' build backend is hatchling; without it here pip fetches it
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("hatchling") else []
    result = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "-q", "install",
         "--no-deps", *isolation, str(project)],
        capture_output=True, text=True, timeout=180,
    )
    if result.returncode != 0:
        raise RuntimeError(f"pip install {project} into {env_dir} failed:\n{result.stdout}\n"
                           f"{result.stderr}")
    return bin_dir
