"""The manifests' command lines run: the signaling and CPU worker containers of deploy/k8s are
started with their rendered arguments and environment (`$(VAR)` expanded as the kubelet does),
only the cluster's names swapped for this machine's (the Redis and signaling Services, the
ports, the mounted secret's and scene volume's paths); their probes answer where the manifests
look, signaling keeps uploads in the folder the scene volume is mounted at, the worker
registers, the preStop hook drains it and every process exits 0. The GPU worker's line is
parsed (it cannot run without a GPU)."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from render_server.cli.main import build_parser

from .browser import free_port
from .deploy_manifests import container, documents, kubectl, of_kind, prepared_tree, render
from .redis_server import redis_server

pytestmark = pytest.mark.skipif(
    kubectl() is None, reason="kubectl (Debian's kubernetes-client) is not installed"
)

SECRETS_DIR = "/etc/render-server/secrets"
SCENES_DIR = "/var/lib/render-server/scenes"  # the scene volume's mount (a ReadWriteMany claim)


def environment(docs: list[dict[str, Any]], spec: dict[str, Any]) -> dict[str, str]:
    """A container's `env` as the kubelet resolves it (values, ConfigMap and Secret keys)."""
    (config,) = of_kind(docs, "ConfigMap")
    (secret,) = of_kind(docs, "Secret")
    out: dict[str, str] = {}
    for env in spec.get("env", []):
        source = env.get("valueFrom", {})
        if "value" in env:
            out[env["name"]] = env["value"]
        elif "configMapKeyRef" in source:
            out[env["name"]] = config["data"][source["configMapKeyRef"]["key"]]
        elif "secretKeyRef" in source:
            out[env["name"]] = base64.b64decode(
                secret["data"][source["secretKeyRef"]["key"]]
            ).decode()
        elif "fieldRef" in source:
            out[env["name"]] = "render-server-worker-7d9f8-x2x4q"  # metadata.name
    return out


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """`$(VAR)` references expanded as Kubernetes does for args."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in args]


def here(args: list[str], swaps: dict[str, str]) -> list[str]:
    out = []
    for a in args:
        for cluster, local in swaps.items():
            a = a.replace(cluster, local)
        out.append(a)
    return out


def after(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RENDER_SERVER_")}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "render_server", *args],
            env={**base, **env, "PYTHONUNBUFFERED": "1"}, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def answers(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{url} never answered 200: {log.read_text()[-3000:]}"
        time.sleep(0.2)


def test_the_signaling_and_worker_containers_run_and_drain(tmp_path: Path) -> None:
    tree = prepared_tree(tmp_path)
    docs = documents(render(tree / "overlays" / "cpu"))
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "jwt-secret").write_text((tree / "base" / "secrets" / "jwt-secret").read_text())
    signaling_spec = container(docs, "render-server-signaling")
    worker_spec = container(docs, "render-server-worker")
    signaling_port, status_port = free_port(), free_port()
    mounts = {m["mountPath"] for m in signaling_spec["volumeMounts"]}
    assert {SECRETS_DIR, SCENES_DIR} <= mounts, mounts
    scenes = tmp_path / "scenes"
    with redis_server() as redis:
        swaps = {
            "redis://render-server-redis:6379/0": redis,
            "ws://render-server-signaling:8080/worker": f"ws://127.0.0.1:{signaling_port}/worker",
            SECRETS_DIR: str(secrets),
            SCENES_DIR: str(scenes),
        }
        env = {k: here([v], swaps)[0] for k, v in environment(docs, signaling_spec).items()}
        args = here(expand(signaling_spec["args"], env), swaps)
        # no path of the cluster's is left to be made or written on this machine
        for value in [*args, *env.values()]:
            assert not value.startswith("/") or value.startswith(str(tmp_path)), value
        assert after(args, "--host") == "0.0.0.0"
        args[args.index("--port") + 1] = str(signaling_port)
        args[args.index("--host") + 1] = "127.0.0.1"  # the test's own loopback, not every address
        assert after(args, "--turn-url").startswith("turn:turn.example.com:3478")
        signaling = spawn(args, env, tmp_path / "signaling.log")
        try:
            probe = signaling_spec["readinessProbe"]["httpGet"]["path"]
            answers(
                f"http://127.0.0.1:{signaling_port}{probe}", signaling, tmp_path / "signaling.log"
            )
            assert scenes.is_dir()  # its uploads' folder: the volume's mount (swapped here)
            env = environment(docs, worker_spec)
            args = here(expand(worker_spec["args"], env), swaps)
            assert after(args, "--worker-id") == "render-server-worker-7d9f8-x2x4q"
            args[args.index("--metrics-port") + 1] = str(status_port)
            args[args.index("--metrics-host") + 1] = "127.0.0.1"
            worker = spawn(args, env, tmp_path / "worker.log")
            try:
                ready = worker_spec["readinessProbe"]["httpGet"]["path"]
                live = worker_spec["livenessProbe"]["httpGet"]["path"]
                answers(f"http://127.0.0.1:{status_port}{live}", worker, tmp_path / "worker.log")
                # ready = registered with signaling (through the Service's URL, swapped here)
                answers(f"http://127.0.0.1:{status_port}{ready}", worker, tmp_path / "worker.log")
                hook = list(worker_spec["lifecycle"]["preStop"]["exec"]["command"])
                assert hook[0] == "render-server"  # the image's entrypoint, on the PATH
                hook[hook.index("--port") + 1] = str(status_port)
                done = subprocess.run(
                    [sys.executable, "-m", "render_server", *hook[1:]],
                    capture_output=True, text=True, timeout=60,
                )  # fmt: skip
                assert done.returncode == 0, done.stdout + done.stderr
                assert worker.wait(30) == 0, (tmp_path / "worker.log").read_text()[-3000:]
            finally:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
            signaling.terminate()
            assert signaling.wait(30) == 0, (tmp_path / "signaling.log").read_text()[-3000:]
        finally:
            if signaling.poll() is None:
                signaling.kill()
                signaling.wait()
    log = (tmp_path / "worker.log").read_text()
    assert "Traceback" not in log, log[-3000:]


def test_the_gpu_workers_command_line_parses(tmp_path: Path) -> None:
    docs = documents(render(prepared_tree(tmp_path) / "overlays" / "gpu"))
    spec = container(docs, "render-server-worker")
    args = expand(spec["args"], environment(docs, spec))
    parsed = build_parser().parse_args(args)
    assert (parsed.renderer, parsed.encoder, parsed.slots) == ("cuda", "auto", 2)
    hook = spec["lifecycle"]["preStop"]["exec"]["command"]
    assert build_parser().parse_args(hook[1:]).command == "drain"
