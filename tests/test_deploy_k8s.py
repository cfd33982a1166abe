"""deploy/k8s: every overlay renders with the real `kubectl kustomize`, validates against the
Kubernetes schemas (kubernetes-validate, strict), and holds the facts that matter: the GPU
request, probes on the right ports, a preStop drain inside a grace period longer than the drain,
secrets only from Secrets, non-root pods, Redis reachable from signaling alone, an
autoscaling query that divides by the slots the workers really have, and uploads kept on one
ReadWriteMany volume every signaling replica shares, reached through an Ingress that streams
bodies up to --max-scene-bytes."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from render_server.cli.main import build_parser

from .deploy_manifests import (
    OVERLAYS,
    container,
    documents,
    kubectl,
    of_kind,
    one,
    option,
    pod_specs,
    prepared_tree,
    render,
)

pytestmark = pytest.mark.skipif(
    kubectl() is None, reason="kubectl (Debian's kubernetes-client) is not installed"
)

KUBERNETES_VERSION = "1.33.0"  # a recent release; kubernetes-validate carries its schemas
CUSTOM_KINDS = {("keda.sh/v1alpha1", "ScaledObject"), ("cert-manager.io/v1", "Certificate")}
WORKER, SIGNALING = "render-server-worker", "render-server-signaling"
SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|KEY", re.IGNORECASE)
# the ScaledObject's fields (KEDA 2.x's CRD), for the one kind the Kubernetes schemas lack
KEDA_SPEC = {"scaleTargetRef", "pollingInterval", "cooldownPeriod", "minReplicaCount",
             "maxReplicaCount", "idleReplicaCount", "fallback", "advanced", "triggers"}  # fmt: skip
KEDA_TRIGGER = {"type", "name", "metadata", "metricType", "authenticationRef", "useCachedMetrics"}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepared_tree(tmp_path_factory.mktemp("deploy"))


@pytest.fixture(scope="module")
def rendered(tree: Path) -> dict[str, list[dict[str, Any]]]:
    return {name: documents(render(tree / "overlays" / name)) for name in OVERLAYS}


def test_every_overlay_validates_against_the_kubernetes_schemas(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name, docs in rendered.items():
        kinds = {(d["apiVersion"], d["kind"]) for d in docs}
        assert {("apps/v1", "Deployment"), ("keda.sh/v1alpha1", "ScaledObject")} <= kinds
        for doc in docs:
            where = (name, doc["kind"], doc["metadata"]["name"])
            if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
                with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
                continue
            try:
                kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{where}: {exc.message} at {list(exc.path)}")


def test_every_object_lands_in_the_namespace(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name, docs in rendered.items():
        for doc in docs:
            if doc["kind"] != "Namespace":
                assert doc["metadata"].get("namespace") == "render-server", (name, doc["kind"])


def test_the_cert_manager_addon_adds_the_ingress_certificate(tree: Path) -> None:
    overlay = tree / "overlays" / "with-cert"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "bases: [../gpu, ../../addons/cert-manager]\n"
    )
    docs = documents(render(overlay))
    certificate = one(docs, "Certificate", "render-server-tls")
    ingress = one(docs, "Ingress", "render-server")
    tls = ingress["spec"]["tls"][0]
    assert certificate["spec"]["secretName"] == tls["secretName"]
    assert set(certificate["spec"]["dnsNames"]) == set(tls["hosts"])
    assert certificate["metadata"]["namespace"] == ingress["metadata"]["namespace"]


def test_gpu_workers_ask_for_a_gpu_and_the_video_capability(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name in ("gpu", "spot"):
        worker = container(rendered[name], WORKER)
        assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1, name
        env = {e["name"]: e.get("value") for e in worker["env"]}
        assert "video" in env["NVIDIA_DRIVER_CAPABILITIES"].split(","), name
        assert option(worker["args"], "--renderer") == ["cuda"], name
        spec = one(rendered[name], "Deployment", WORKER)["spec"]["template"]["spec"]
        assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"]), name
    cpu = container(rendered["cpu"], WORKER)
    assert "nvidia.com/gpu" not in cpu["resources"].get("limits", {})
    assert option(cpu["args"], "--renderer") == ["cpu"]
    assert option(cpu["args"], "--encoder") == ["x264"]
    assert container(rendered["gpu"], WORKER)["image"].endswith("-gpu:0.1.0")
    assert container(rendered["cpu"], WORKER)["image"].endswith("-cpu:0.1.0")


def test_probes_answer_on_the_ports_the_processes_listen_on(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name, docs in rendered.items():
        signaling = container(docs, SIGNALING)
        ports = {p["name"]: p["containerPort"] for p in signaling["ports"]}
        assert ports["http"] == int(option(signaling["args"], "--port")[0])
        assert signaling["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert signaling["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        worker = container(docs, WORKER)
        ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
        assert ports["status"] == int(option(worker["args"], "--metrics-port")[0]), name
        assert option(worker["args"], "--metrics-host") == ["0.0.0.0"]  # probed from the node
        assert worker["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "status"}
        assert worker["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "status"}


def test_a_stopped_worker_pod_drains_within_its_grace_period(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name, docs in rendered.items():
        worker = container(docs, WORKER)
        hook = worker["lifecycle"]["preStop"]["exec"]["command"]
        assert hook[:2] == ["render-server", "drain"], name
        assert option(hook, "--port") == option(worker["args"], "--metrics-port"), name
        drain_s = float(option(worker["args"], "--drain-timeout")[0])
        hook_s = float(option(hook, "--timeout")[0])
        grace_s = one(docs, "Deployment", WORKER)["spec"]["template"]["spec"][
            "terminationGracePeriodSeconds"
        ]
        # the worker leaves by its drain deadline, the hook waits a little longer, and the
        # kubelet kills nothing before both
        assert drain_s < hook_s < grace_s, (name, drain_s, hook_s, grace_s)


def test_secrets_come_from_the_secret_and_never_from_plain_values(
    rendered: dict[str, list[dict[str, Any]]], tree: Path
) -> None:
    written = {
        key: (tree / "base" / "secrets" / key).read_text() for key in ("jwt-secret", "turn-secret")
    }
    for name, docs in rendered.items():
        (secret,) = of_kind(docs, "Secret")
        assert secret["metadata"]["name"].startswith("render-server-secrets-")  # hashed: rolls
        for key, value in written.items():
            assert base64.b64decode(secret["data"][key]).decode() == value
        text = repr(docs)
        for key, value in written.items():
            assert text.count(value) == 0, (name, key)  # only base64 in the Secret itself
        for deployment, spec in pod_specs(docs):
            for c in spec["containers"]:
                for env in c.get("env", []):
                    if SECRET_NAME.search(env["name"]):
                        assert "value" not in env, (name, deployment, env["name"])
                        assert (
                            env["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
                        )
                args = c.get("args", []) + c.get("command", [])
                assert "--secret" not in args and "--token" not in args, (name, deployment)
                for volume in spec.get("volumes", []):
                    if "secret" in volume and volume["name"] == "secrets":
                        assert volume["secret"]["secretName"] == secret["metadata"]["name"]


def test_every_pod_runs_as_non_root_without_privilege(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name, docs in rendered.items():
        specs = dict(pod_specs(docs))
        assert {SIGNALING, WORKER, "render-server-redis", "render-server-coturn"} <= set(specs)
        for deployment, spec in specs.items():
            pod = spec.get("securityContext", {})
            for c in spec["containers"]:
                own = {**pod, **c.get("securityContext", {})}
                assert own.get("runAsNonRoot") is True, (name, deployment)
                assert own.get("runAsUser", 0) > 0, (name, deployment)
                assert own.get("allowPrivilegeEscalation") is False, (name, deployment)
                assert own.get("capabilities", {}).get("drop") == ["ALL"], (name, deployment)
            assert spec.get("automountServiceAccountToken") is False, (name, deployment)


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_only_signaling_reaches_redis(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name, docs in rendered.items():
        (policy,) = of_kind(docs, "NetworkPolicy")
        selector = policy["spec"]["podSelector"]["matchLabels"]
        pods = {
            d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
            for d in of_kind(docs, "Deployment")
        }
        assert [p for p, labels in pods.items() if _matches(selector, labels)] == [
            "render-server-redis"
        ]
        (rule,) = policy["spec"]["ingress"]
        assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
        (source,) = rule["from"]
        allowed = [
            p
            for p, labels in pods.items()
            if _matches(source["podSelector"]["matchLabels"], labels)
        ]
        assert allowed == [SIGNALING], name
        signaling = container(docs, SIGNALING)
        assert option(signaling["args"], "--registry") == ["redis://render-server-redis:6379/0"]
        assert one(docs, "Service", "render-server-redis")["spec"]["ports"][0]["port"] == 6379


def test_workers_scale_on_slots_and_queue_with_the_slots_they_have(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name, docs in rendered.items():
        scaled = one(docs, "ScaledObject", WORKER)
        spec = scaled["spec"]
        assert set(spec) <= KEDA_SPEC, set(spec) - KEDA_SPEC
        assert spec["scaleTargetRef"]["name"] == WORKER
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        (trigger,) = spec["triggers"]
        assert set(trigger) <= KEDA_TRIGGER
        assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
        assert trigger["metadata"]["threshold"] == "1"  # the query's value is the replica count
        query = trigger["metadata"]["query"]
        for metric in ("worker_slots", "worker_slots_free", "scheduler_queue_length"):
            assert f"max({metric})" in query, (name, metric)
        divisor = re.search(r"\)\s*/\s*(\d+)\s*\)\s*$", query)
        assert divisor is not None, query
        slots = option(container(docs, WORKER)["args"], "--slots")
        assert slots == [divisor.group(1)], (name, slots, query)
        assert spec["fallback"]["replicas"] >= spec["minReplicaCount"]


def test_the_spot_overlay_wires_the_interruption_notice_to_the_drain(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    def preemption_url(docs: list[dict[str, Any]]) -> str:
        worker = container(docs, WORKER)
        (env,) = [e for e in worker["env"] if e["name"] == "RENDER_SERVER_PREEMPTION_URL"]
        ref = env["valueFrom"]["configMapKeyRef"]
        (config,) = of_kind(docs, "ConfigMap", ref["name"])
        return str(config["data"][ref["key"]])

    assert preemption_url(rendered["spot"]).endswith("/latest/meta-data/spot/instance-action")
    assert preemption_url(rendered["gpu"]) == "" and preemption_url(rendered["cpu"]) == ""
    spec = one(rendered["spot"], "Deployment", WORKER)["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = {t["matchExpressions"][0]["key"] for t in terms["nodeSelectorTerms"]}
    assert {"karpenter.sh/capacity-type", "cloud.google.com/gke-spot"} <= keys
    assert "affinity" not in one(rendered["gpu"], "Deployment", WORKER)["spec"]["template"]["spec"]


def test_coturn_shares_signalings_turn_secret_on_the_host_network(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["gpu"]
    spec = one(docs, "Deployment", "render-server-coturn")["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    turn = spec["containers"][0]
    assert "--use-auth-secret" in turn["args"]
    assert "--static-auth-secret=$(TURN_SECRET)" in turn["args"]
    (coturn_env,) = [e for e in turn["env"] if e["name"] == "TURN_SECRET"]
    (signaling_env,) = [
        e for e in container(docs, SIGNALING)["env"] if e["name"] == "RENDER_SERVER_TURN_SECRET"
    ]
    assert coturn_env["valueFrom"] == signaling_env["valueFrom"]
    listening = [a for a in turn["args"] if a.startswith("--listening-port=")]
    urls = option(container(docs, SIGNALING)["args"], "--turn-url")
    port = listening[0].split("=")[1]
    assert urls and all(f":{port}?transport=" in u for u in urls), urls


SCENES_CLAIM = "render-server-scenes"
SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def nginx_size(text: str) -> int:
    """An nginx size (`64k`, `256m`) in bytes."""
    number, unit = re.fullmatch(r"(\d+)([kmg]?)", text.lower()).groups()  # type: ignore[union-attr]
    return int(number) * SIZE_UNITS[unit]


def test_signaling_replicas_share_the_scene_folder_on_a_read_write_many_claim(
    rendered: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, docs in rendered.items():
        claim = one(docs, "PersistentVolumeClaim", SCENES_CLAIM)
        # every replica (up to the HPA's maximum, on any node) mounts it read-write at once
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"], name
        assert claim["spec"]["resources"]["requests"]["storage"], name
        spec = one(docs, "Deployment", SIGNALING)["spec"]["template"]["spec"]
        (volume,) = [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
        assert volume["persistentVolumeClaim"] == {"claimName": SCENES_CLAIM}, name
        signaling = container(docs, SIGNALING)
        (mount,) = [m for m in signaling["volumeMounts"] if m["name"] == volume["name"]]
        assert not mount.get("readOnly"), name
        # the folder the replica keeps uploads in is the mounted one (the option or its variable)
        env = {e["name"]: e.get("value") for e in signaling["env"]}
        monkeypatch.delenv("RENDER_SERVER_SCENE_DIR", raising=False)
        if "RENDER_SERVER_SCENE_DIR" in env:
            monkeypatch.setenv("RENDER_SERVER_SCENE_DIR", env["RENDER_SERVER_SCENE_DIR"])
        args = build_parser().parse_args(signaling["args"])
        assert args.scene_dir == Path(mount["mountPath"]), (name, args.scene_dir)
        # writable by the non-root user: the volume is given the pod's group
        pod = spec["securityContext"]
        assert pod["fsGroup"] == pod["runAsGroup"] > 0, name
        # workers fetch the files over HTTP: no other pod mounts the claim
        for deployment, other in pod_specs(docs):
            claims = [v for v in other.get("volumes", []) if "persistentVolumeClaim" in v]
            assert deployment == SIGNALING or not claims, (name, deployment)


def test_the_ingress_streams_uploads_and_keeps_other_bodies_small(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name, docs in rendered.items():
        by_path = {
            path["path"]: ingress
            for ingress in of_kind(docs, "Ingress")
            for rule in ingress["spec"]["rules"]
            for path in rule["http"]["paths"]
        }
        site, uploads = by_path["/"], by_path["/api/scenes"]
        assert site is not uploads, "annotations apply per Ingress: uploads need their own"
        notes = uploads["metadata"]["annotations"]
        limit = nginx_size(notes["nginx.ingress.kubernetes.io/proxy-body-size"])
        assert notes["nginx.ingress.kubernetes.io/proxy-request-buffering"] == "off", name
        assert int(notes["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 300, name
        # the largest upload signaling takes passes the controller; other routes stay small
        args = build_parser().parse_args(container(docs, SIGNALING)["args"])
        assert limit >= args.max_scene_bytes == 256 * 1024**2, (name, limit)
        small = site["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-body-size"]
        assert nginx_size(small) <= 1024**2, (name, small)
        # the same host, certificate and Service as the rest of the site
        assert uploads["spec"]["tls"] == site["spec"]["tls"], name
        assert uploads["spec"]["ingressClassName"] == site["spec"]["ingressClassName"]
        (rule,) = uploads["spec"]["rules"]
        assert rule["host"] == site["spec"]["rules"][0]["host"], name
        (path,) = rule["http"]["paths"]
        assert path["pathType"] == "Prefix", name
        assert path["backend"] == site["spec"]["rules"][0]["http"]["paths"][0]["backend"], name
