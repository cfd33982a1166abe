"""docker/: the images' Dockerfiles pass hadolint, and what they run is real (their build-time
Python snippets and their entrypoint and command, with --help); the Compose file is accepted by
Debian's docker-compose and its render-server commands parse; Prometheus's configuration passes
promtool, and every query of the Grafana dashboard parses (promtool) and names metrics the
server exports; uploads go to one volume both replicas mount, made in the images for the
non-root user, and nginx streams them up to --max-scene-bytes while other bodies stay small.
No Docker engine runs here: images are not built."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from render_server.cli.main import build_parser
from render_server.metrics import Metrics

from .deploy_manifests import ROOT, documents, kubectl, one, prepared_tree, render

DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("Dockerfile*"))
COMPOSE = DOCKER / "compose.yaml"
NGINX = DOCKER / "nginx.conf"
SCENE_DIR = "/var/lib/render-server/scenes"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "render-server.json"


def tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip(f"{name} is not installed")
    return found


def final_stage(dockerfile: Path) -> str:
    """The text of the last stage (what the image runs), line continuations joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    return text[text.rindex("\nFROM ") :]


def instruction(stage: str, name: str) -> list[str]:
    found = re.findall(rf"^{name} (\[.*\])$", stage, re.M)
    assert len(found) == 1, (name, found)
    return list(json.loads(found[0]))


def test_there_are_a_cpu_a_signaling_and_a_gpu_image() -> None:
    assert [p.name for p in DOCKERFILES] == [
        "Dockerfile",
        "Dockerfile.signaling",
        "Dockerfile.worker",
    ]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile: Path) -> None:
    done = subprocess.run([tool("hadolint"), str(dockerfile)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_image_runs_as_non_root_with_a_health_check_and_no_compiler(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    assert text.count("\nFROM ") + text.startswith("FROM ") >= 2, "multi-stage: build, then run"
    stage = final_stage(dockerfile)
    users = re.findall(r"^USER (\S+)$", stage, re.M)
    assert users and users[-1] not in ("root", "0"), users
    assert re.search(r"^HEALTHCHECK .*/healthz", stage, re.M)
    installs = " ".join(re.findall(r"apt-get install[^&]*", stage))
    for compiler in ("g++", "gcc", "build-essential", "-dev", "cuda-toolkit", "nvcc"):
        assert compiler not in installs, (dockerfile.name, compiler)
    assert "-devel-" not in stage.split("\n", 2)[1], "the runtime stage is not on a devel base"
    assert instruction(stage, "ENTRYPOINT") == ["render-server"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_images_command_and_build_snippets_run(dockerfile: Path) -> None:
    stage = final_stage(dockerfile)
    command = instruction(stage, "CMD")
    done = subprocess.run(
        [sys.executable, "-m", "render_server", *command, "--help"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    build_parser().parse_args(command)  # the options exist as written
    # the Python the build runs (numba's warm-up): the same text, run here
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    for snippet in re.findall(r'python3? -c "([^"]+)"', text):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RENDER_SERVER_")}
        done = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True,
                              timeout=600, env=env, cwd=ROOT)  # fmt: skip
        assert done.returncode == 0, (snippet, done.stderr[-2000:])
    for module in re.findall(r"python -m (render_server\.[\w.]+)", text):
        assert (ROOT / (module.replace(".", "/") + ".py")).exists(), module


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.signaling"])
def test_the_images_that_take_uploads_make_the_scene_folder_for_their_user(name: str) -> None:
    stage = final_stage(DOCKER / name)
    (user,) = re.findall(r"^USER (\S+)$", stage, re.M)
    made = re.search(r"useradd .*--uid (\d+) .*?--gid (\S+) .*?(\w+)\s*(?:&&|$)", stage)
    assert made is not None and made.group(1) == user, stage
    group = re.search(rf"groupadd .*--gid (\d+) {made.group(2)}\b", stage)
    assert group is not None, "the user's group has a fixed id (the pods' runAsGroup/fsGroup)"
    # a folder of the user's own: a fresh named volume mounted there takes its owner
    owner = made.group(3)
    assert re.search(rf"install -d -o {owner} -g {made.group(2)} -m 07\d0 {SCENE_DIR}\b", stage)
    assert re.search(rf"^ENV .*\bRENDER_SERVER_SCENE_DIR={SCENE_DIR}\b", stage, re.M), name


def compose_config(
    *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("docker-compose"), "-f", str(COMPOSE), *extra, "config"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_docker_compose_accepts_the_stack_and_its_commands_parse() -> None:
    done = compose_config("--profile", "cpu", env={"PUBLIC_HOST": "203.0.113.7"})
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    services = config["services"]
    assert {"redis", "coturn", "signaling-1", "signaling-2", "proxy", "worker-gpu", "worker-cpu",
            "prometheus", "grafana"} <= set(services)  # fmt: skip
    gpu = services["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "video" in gpu["capabilities"]
    assert services["worker-cpu"]["profiles"] == ["cpu"]
    assert services["coturn"]["network_mode"] == "host"
    for name in ("signaling-1", "signaling-2", "worker-gpu", "worker-cpu"):
        args = build_parser().parse_args(services[name]["command"])
        assert "jwt-secret" in {s["source"] for s in services[name]["secrets"]}, name
        if name.startswith("signaling"):
            assert args.turn_url == [
                "turn:203.0.113.7:3478?transport=udp",
                "turn:203.0.113.7:3478?transport=tcp",
            ]
        else:  # SIGTERM drains: Docker waits longer than the drain before it kills
            grace = services[name]["stop_grace_period"]
            assert float(grace.rstrip("s")) > args.drain_timeout, (name, grace)
    # the proxy passes WebSocket upgrades to both replicas
    conf = (DOCKER / "nginx.conf").read_text()
    assert "server signaling-1:8080" in conf and "server signaling-2:8080" in conf
    assert "proxy_set_header Upgrade $http_upgrade" in conf
    # uploads: one named volume both replicas mount where their --scene-dir points; the
    # workers fetch files over HTTP and mount nothing
    assert "scenes" in config["volumes"]
    for name in ("signaling-1", "signaling-2"):
        args = build_parser().parse_args(services[name]["command"])
        mounts = [volume_mount(v) for v in services[name].get("volumes", [])]
        assert ("scenes", str(args.scene_dir)) in mounts, (name, mounts)
        assert str(args.scene_dir) == SCENE_DIR  # the folder the image makes for its user
        assert args.max_scene_bytes <= nginx_limits()["/api/scenes"], name
    for name in ("worker-gpu", "worker-cpu"):
        assert not services[name].get("volumes"), name
    # the TURN URLs need the host's public address: no silent default
    missing = compose_config(env={"PUBLIC_HOST": ""})
    assert missing.returncode != 0 and "PUBLIC_HOST" in missing.stderr


def volume_mount(volume: str | dict[str, Any]) -> tuple[str, str]:
    """(source, target) of a service's volume, in either of Compose's spellings."""
    if isinstance(volume, dict):
        return volume.get("source", ""), volume["target"]
    source, target = volume.split(":")[:2]
    return source, target


SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def nginx_blocks() -> dict[str, str]:
    """nginx.conf's server block (key "") and each location's text (by its path), comments
    dropped."""
    text = re.sub(r"#[^\n]*", "", NGINX.read_text())
    server = text[text.index("server {") :]
    blocks = dict(re.findall(r"location\s+(\S+)\s*\{([^}]*)\}", server))
    blocks[""] = re.sub(r"location\s+\S+\s*\{[^}]*\}", "", server)
    return blocks


def nginx_limits() -> dict[str, int]:
    """Each location's client_max_body_size in bytes (the server's where it sets none)."""
    blocks = nginx_blocks()

    def limit(text: str) -> int | None:
        found = re.search(r"client_max_body_size\s+(\d+)([kmg]?);", text, re.I)
        return None if found is None else int(found.group(1)) * SIZE_UNITS[found.group(2).lower()]

    server = limit(blocks.pop(""))
    assert server is not None
    return {path: limit(text) or server for path, text in blocks.items()}


def test_nginx_streams_uploads_to_the_replicas_and_keeps_other_bodies_small() -> None:
    blocks = nginx_blocks()
    limits = nginx_limits()
    uploads = blocks["/api/scenes"]
    assert limits["/api/scenes"] == 256 * 1024**2
    assert build_parser().parse_args(["signaling"]).max_scene_bytes <= limits["/api/scenes"]
    assert all(size <= 1024**2 for path, size in limits.items() if path != "/api/scenes")
    # streamed as it arrives (HTTP/1.1 to the replica: a chunked body too), not spooled
    assert re.search(r"proxy_request_buffering\s+off;", uploads)
    assert re.search(r"proxy_http_version\s+1\.1;", uploads)
    assert re.search(r"proxy_pass\s+http://signaling;", uploads)
    # a big upload on a slow link is not cut off
    for directive, at_least in (("client_body_timeout", 60), ("proxy_read_timeout", 300),
                                ("proxy_send_timeout", 300)):  # fmt: skip
        found = re.search(rf"{directive}\s+(\d+)s;", uploads)
        assert found is not None and int(found.group(1)) >= at_least, directive
    assert "X-Forwarded-For $proxy_add_x_forwarded_for" in uploads  # --trusted-proxy reads it


def test_prometheus_scrapes_every_replica_and_worker() -> None:
    done = subprocess.run([tool("promtool"), "check", "config", str(DOCKER / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    config = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    targets = {
        t for job in config["scrape_configs"] for s in job["static_configs"] for t in s["targets"]
    }
    assert targets == {"signaling-1:8080", "signaling-2:8080", "worker-gpu:9100", "worker-cpu:9100"}


def exported_metrics() -> set[str]:
    metrics = Metrics()
    metrics.worker_status()
    names = {"render_state_store_up", "up"}
    for family in text_string_to_metric_families(metrics.render().decode()):
        names.update(family.name + suffix for suffix in ("", "_total", "_bucket", "_sum", "_count"))
    return names


def test_every_dashboard_query_parses_and_names_exported_metrics(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(exprs)]}]}  # fmt: skip
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    done = subprocess.run([tool("promtool"), "check", "rules", str(path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    known = exported_metrics()
    functions = {"max", "min", "sum", "ceil", "rate", "histogram_quantile", "by", "le"}
    for expr in exprs:
        for name in re.findall(r"\b([a-z_]+_[a-z_]+|sessions_active)\b(?!\s*\()", expr):
            if name not in functions and not expr.count(f"{{{{{name}}}}}"):
                assert name in known, (name, expr)
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("sessions", "queue", "slots", "stage", "frame rate", "freezes"):
        assert topic in titles, topic


@pytest.mark.skipif(kubectl() is None, reason="kubectl (Debian's kubernetes-client) is missing")
def test_the_dashboards_wanted_workers_is_the_autoscaling_query(tmp_path: Path) -> None:
    docs = documents(render(prepared_tree(tmp_path) / "overlays" / "cpu"))
    (trigger,) = one(docs, "ScaledObject", "render-server-worker")["spec"]["triggers"]
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert trigger["metadata"]["query"] in exprs
