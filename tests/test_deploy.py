"""The deployment files in deploy/ are checked, not only shipped (there is no container
runtime or Kubernetes cluster on the test machines; docs/operations.md says so):

- ``deploy/Dockerfile``: parsed (dockerfile-parse): two stages, the run stage non-root with
  a HEALTHCHECK on /ready and no source tree; its COPY and pip commands run the same way
  in a throw-away venv, which then serves and passes the HEALTHCHECK's own command;
- ``deploy/systemd/flakekit.service``: ``systemd-analyze verify`` finds nothing to say;
- ``deploy/kubernetes/flakekit.yaml``: every document valid against the Kubernetes JSON
  schemas (kubernetes-validate ships them: offline), the StatefulSet's --node and
  --advertise from the pod, probes and PodDisruptionBudget matching it, and its config
  accepted by ``flakekit config check`` as the pod would run it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

import dockerfile_parse
import kubernetes_validate as kv
import pytest
import yaml

import flakekit
from flakekit.testing.cli import run_cli

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


# -- Dockerfile --------------------------------------------------------------------------------
def stages() -> list[list[dict[str, Any]]]:
    """The Dockerfile's instructions (dockerfile-parse), one list per stage (FROM first)."""
    parser = dockerfile_parse.DockerfileParser(path=str(DEPLOY / "Dockerfile"))
    out: list[list[dict[str, Any]]] = []
    for ins in parser.structure:
        if ins["instruction"] == "FROM":
            out.append([])
        if out and ins["instruction"] != "COMMENT":
            out[-1].append(ins)
    return out


def values(stage: list[dict[str, Any]], instruction: str) -> list[str]:
    return [i["value"] for i in stage if i["instruction"] == instruction]


def _moved(text: str, paths: dict[str, Path]) -> str:
    """``text`` with the image's absolute paths moved under the test's tmp."""
    for inside, outside in paths.items():
        text = re.sub(rf"(?<![\w/]){re.escape(inside)}(?=[/\s\"':]|$)", str(outside), text)
    return text


def _set_env(value: str, env: dict[str, str], paths: dict[str, Path]) -> None:
    """An ENV instruction: its ``$NAME`` expanded against the environment so far."""
    for pair in shlex.split(value):
        name, _, val = pair.partition("=")
        env[name] = re.sub(r"\$(\w+)", lambda m: env.get(m[1], ""), _moved(val, paths))


def test_dockerfile_is_multi_stage_non_root_with_a_healthcheck_on_ready():
    build, run = stages()
    assert re.fullmatch(r"python:\$\{PYTHON\}-slim AS build", build[0]["value"])
    assert values(run, "COPY") == ["--from=build /wheels /wheels"]   # no source in the image
    user = values(run, "USER")[-1]
    uid = user.split(":")[0]
    assert uid not in ("root", "0") and f"--uid {uid} " in " ".join(values(run, "RUN"))
    (port,) = values(run, "EXPOSE")
    (check,) = values(run, "HEALTHCHECK")
    options, _, command = check.partition("CMD ")
    assert "--interval=" in options and "--start-period=" in options
    argv = json.loads(command)
    assert f"http://127.0.0.1:{port}/ready" in argv[-1]
    assert json.loads(values(run, "ENTRYPOINT")[-1]) == ["flakekit"]
    cmd = json.loads(values(run, "CMD")[-1])
    assert cmd[:1] == ["serve"] and cmd[cmd.index("--port") + 1] == port
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert values(run, "STOPSIGNAL") == ["SIGTERM"]


def _sh(command: str, paths: dict[str, Path], cwd: Path, env: dict[str, str]) -> None:
    """A RUN command of the Dockerfile, its absolute paths moved under the test's tmp."""
    command = _moved(command, paths)
    run = subprocess.run(["sh", "-c", command], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, f"{command}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"


@pytest.mark.slow
def test_dockerfile_commands_build_a_server_that_passes_its_healthcheck(tmp_path):
    """The build stage's COPYs and pip command make the wheels from only what they copy;
    the run stage's pip commands install them into a fresh venv (no site packages of this
    one), whose ``flakekit serve`` (the CMD, on a free port) passes the HEALTHCHECK command."""
    build, run = stages()
    paths = {"/src": tmp_path / "src", "/wheels": tmp_path / "wheels",
             "/opt/flakekit": tmp_path / "opt", "/var/lib/flakekit": tmp_path / "state"}
    for path in paths.values():
        path.mkdir()
    # the interpreter the image's `python` is: this one's, without this venv's packages
    base_bin = Path(getattr(sys, "_base_executable", sys.executable)).parent
    env = {k: v for k, v in os.environ.items()   # pip's settings of this machine stay
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME") and not k.startswith("PYTEST_")}
    env["PATH"] = f"{base_bin}:/usr/bin:/bin"
    workdir = paths[values(build, "WORKDIR")[0]]
    for copy in values(build, "COPY"):
        *sources, dest = copy.split()
        for source in sources:
            target = workdir / dest / (Path(source).name if dest.endswith("/") else "")
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns(
                    "__pycache__", "*.pyc", "tests", "build", "dist"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / source, target)
    for command in values(build, "RUN"):
        _sh(command, paths, workdir, env)
    # the run stage in order: ENV as it comes (but pip's cache: the test may reuse what pip
    # fetched before), the pip commands (not groupadd/useradd: the host's users stay)
    for ins in run[1:]:
        if ins["instruction"] == "ENV":
            _set_env(ins["value"], env, paths)
            env.pop("PIP_NO_CACHE_DIR", None)
        elif ins["instruction"] == "RUN" and "pip" in ins["value"]:
            _sh(ins["value"], paths, tmp_path, env)
    image_bin = paths["/opt/flakekit"] / "bin"
    assert env["PATH"].startswith(f"{image_bin}:")
    assert env["FLAKEKIT_STATE_DIR"] == str(paths["/var/lib/flakekit"])
    listed = subprocess.run([str(image_bin / "flakekit"), "plugins"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "flakekit-server" in listed.stdout, listed.stderr
    cmd = json.loads(values(run, "CMD")[-1])
    port = values(run, "EXPOSE")[0]
    cmd[cmd.index("--port") + 1] = "0"
    cmd[cmd.index("--host") + 1] = "127.0.0.1"
    server = subprocess.Popen([str(image_bin / "flakekit"), *cmd], env=env,
                              cwd=paths["/var/lib/flakekit"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        banner = server.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", banner)
        assert match, banner + server.communicate(timeout=30)[1]
        options, _, command = values(run, "HEALTHCHECK")[0].partition("CMD ")
        check = [a.replace(f":{port}/", f":{match[1]}/") for a in json.loads(command)]
        start_period = float(re.search(r"--start-period=(\d+)s", options)[1])
        deadline = time.monotonic() + start_period
        while True:   # as the runtime does: retried until the start period is over
            result = subprocess.run(check, env=env, capture_output=True, text=True, timeout=30)
            if result.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert result.returncode == 0, result.stderr[-2000:]
        with urllib.request.urlopen(f"http://127.0.0.1:{match[1]}/ready", timeout=5) as r:
            assert json.loads(r.read())["ready"] is True
    finally:
        server.terminate()
        server.wait(30)


# -- systemd -----------------------------------------------------------------------------------
UNIT = DEPLOY / "systemd" / "flakekit.service"


def _verify(unit_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` of ``unit_text``; its /opt/flakekit is a directory whose
    bin/flakekit is this interpreter's (verify checks that ExecStart= is executable)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is missing: run scripts/install-systemd.sh (apt-get install "
                    "systemd)")
    opt = tmp_path / "opt"
    (opt / "bin").mkdir(parents=True, exist_ok=True)
    flakekit_bin = Path(sys.executable).with_name("flakekit")
    (opt / "bin" / "flakekit").unlink(missing_ok=True)
    (opt / "bin" / "flakekit").symlink_to(flakekit_bin)
    unit = tmp_path / "units" / UNIT.name
    unit.parent.mkdir(exist_ok=True)
    unit.write_text(unit_text.replace("/opt/flakekit/", f"{opt}/"), encoding="utf-8")
    return subprocess.run([analyze, "verify", "--man=no", str(unit)], capture_output=True,
                          text=True, timeout=60)


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path):
    text = UNIT.read_text(encoding="utf-8")
    result = _verify(text, tmp_path)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr)
    # the check can fail: a misspelt directive is reported
    broken = _verify(text.replace("NoNewPrivileges=", "NoNewPrivilege="), tmp_path)
    assert "Unknown key" in broken.stdout + broken.stderr
    # and the unit runs what the docs say: flakekit serve, non-root, restarted on failure
    service = dict(line.split("=", 1) for line in text.splitlines()
                   if "=" in line and not line.startswith("#"))
    assert service["User"] == "flakekit" and service["Restart"] == "on-failure"
    assert service["ExecStart"].startswith("/opt/flakekit/bin/flakekit serve ")


# -- Kubernetes --------------------------------------------------------------------------------
def manifests() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "flakekit.yaml").read_text())
            if d]
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def test_kubernetes_manifests_are_valid_against_the_schemas():
    docs = manifests()
    assert set(docs) == {"ConfigMap/flakekit-config", "Service/flakekit-peers",
                         "Service/flakekit", "StatefulSet/flakekit",
                         "PodDisruptionBudget/flakekit"}
    for version in ("1.27", kv.latest_version()):
        for doc in docs.values():
            kv.validate(doc, version, strict=True)
    # the check can fail: a misspelt field is refused (strict), so is a wrong type
    sts = json.loads(json.dumps(docs["StatefulSet/flakekit"]))
    sts["spec"]["replica"] = sts["spec"].pop("replicas")
    with pytest.raises(kv.ValidationError):
        kv.validate(sts, kv.latest_version(), strict=True)


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of args and env values."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m[1]], value)


def test_statefulset_nodes_are_named_by_the_pod_and_advertised_on_the_headless_service(
        tmp_path, capsys, monkeypatch):
    docs = manifests()
    sts, peers = docs["StatefulSet/flakekit"], docs["Service/flakekit-peers"]
    pdb = docs["PodDisruptionBudget/flakekit"]
    spec = sts["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["serviceName"] == peers["metadata"]["name"]
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"]
    for selector in (peers["spec"]["selector"], docs["Service/flakekit"]["spec"]["selector"],
                     spec["selector"]["matchLabels"], pdb["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1 and spec["replicas"] >= 3
    (box,) = spec["template"]["spec"]["containers"]
    assert box["image"] == f"flakekit:{flakekit.__version__}"
    assert box["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert box["livenessProbe"]["httpGet"]["path"] == "/health"
    assert spec["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    fields = {e["name"]: e["valueFrom"].get("fieldRef", {}).get("fieldPath")
              for e in box["env"] if "valueFrom" in e}
    assert fields["POD_NAME"] == "metadata.name"
    assert fields["POD_NAMESPACE"] == "metadata.namespace"
    # the args of pod flakekit-1 in namespace ids, expanded as Kubernetes does
    pod_env = {"POD_NAME": f"{sts['metadata']['name']}-1", "POD_NAMESPACE": "ids"}
    args = dict(a.split("=", 1) for a in (_expand(a, pod_env) for a in box["args"][1:]))
    assert box["args"][0] == "serve"
    assert args["--node"] == "flakekit-1"
    assert args["--advertise"] == "http://flakekit-1.flakekit-peers.ids.svc.cluster.local:8080"
    port = box["ports"][0]["containerPort"]
    assert args["--port"] == str(port) and args["--advertise"].endswith(f":{port}")
    # the ConfigMap's config, at the path the pod mounts it, checks out for that node
    (mount,) = [m for m in box["volumeMounts"] if m["name"] == "config"]
    config = tmp_path / Path(args["--config"]).relative_to(mount["mountPath"])
    config.write_text(docs["ConfigMap/flakekit-config"]["data"][config.name], encoding="utf-8")
    assert tomllib.loads(config.read_text())["cluster"]["membership"]["type"] == "sql"
    monkeypatch.setenv("FLAKEKIT_DB_URL", f"sqlite:///{tmp_path / 'ids.db'}")
    monkeypatch.setenv("FLAKEKIT_NODE", args["--node"])
    monkeypatch.setenv("FLAKEKIT_ADVERTISE", args["--advertise"])
    code, out, err = run_cli(capsys, "config", "check", str(config))
    assert code == 0, err
    assert "node 'flakekit-1'" in out and args["--advertise"] in out
