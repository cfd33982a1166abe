"""The Kubernetes manifests under deploy/k8s as the tests read them: each overlay rendered by the
real `kubectl kustomize` (Debian's kubernetes-client) from a copy of the tree with its Secrets'
files written by the real make-secrets.sh."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("gpu", "cpu", "spot")


def kubectl() -> str | None:
    """$KUBECTL, else the kubectl on the PATH: the manifests keep to what Debian's (kustomize
    v2) reads as well as a current one."""
    return os.environ.get("KUBECTL") or shutil.which("kubectl")


def prepared_tree(into: Path) -> Path:
    """A copy of deploy/k8s with its secrets' files written, as an operator would have it."""
    tree = into / "k8s"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("jwt-secret", "turn-secret"))
    subprocess.run(["sh", str(tree / "make-secrets.sh")], check=True, capture_output=True)
    return tree


def render(directory: Path) -> str:
    kube = kubectl()
    assert kube is not None
    done = subprocess.run(
        [kube, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def of_kind(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = of_kind(docs, kind, name)
    assert len(found) == 1, (kind, name, [d["metadata"]["name"] for d in of_kind(docs, kind)])
    return found[0]


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield d["metadata"]["name"], d["spec"]["template"]["spec"]


def container(docs: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    spec = one(docs, "Deployment", deployment)["spec"]["template"]["spec"]
    containers: list[dict[str, Any]] = spec["containers"]
    assert len(containers) == 1
    return containers[0]


def option(args: list[str], name: str) -> list[str]:
    """Every value of `--name V` in a command line."""
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == name]
