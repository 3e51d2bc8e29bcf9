"""deploy/kserve (ServingRuntime, InferenceService), deploy/monitoring, deploy/prometheus and compose's
monitoring profile: parsed and checked against the Settings, the image and the plain Kubernetes manifests.

KServe's and the Prometheus Operator's kinds are custom resources, which kubernetes-validate does not know;
the runtime's container is validated as the container of a Pod instead (strict, the same Kubernetes
versions as deploy/k8s), and the rest is checked field by field here.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.settings import Settings
from tests.deploy.test_deploy_files import (
    K8S_VERSIONS,
    compose,
    cpu_quantity,
    deployment_container,
    field_of,
    final_stage,
    find_executable,
    resource,
    settings_fields,
    settings_from,
)

REPO = Path(__file__).resolve().parents[2]
KSERVE = REPO / "deploy" / "kserve"
PROMETHEUS = REPO / "deploy" / "prometheus"
MONITORING = REPO / "deploy" / "monitoring"
SERVED_MODELS = {"attention", "softmax"}


def load(path: Path) -> dict[str, Any]:
    (document,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return document


def runtime() -> dict[str, Any]:
    return load(KSERVE / "servingruntime.yaml")


def isvc() -> dict[str, Any]:
    return load(KSERVE / "inferenceservice.yaml")


def grpc_isvc() -> dict[str, Any]:
    return load(KSERVE / "inferenceservice-grpc.yaml")


def runtime_container() -> dict[str, Any]:
    (container,) = runtime()["spec"]["containers"]
    return container


def runtime_env() -> dict[str, str]:
    return {e["name"]: e["value"] for e in runtime_container()["env"] if "value" in e}


def test_kserve_files_are_the_runtime_and_two_inference_services() -> None:
    assert sorted(p.name for p in KSERVE.iterdir()) == [
        "inferenceservice-grpc.yaml",
        "inferenceservice.yaml",
        "servingruntime.yaml",
    ]
    rt, svc = runtime(), isvc()
    assert (rt["apiVersion"], rt["kind"]) == ("serving.kserve.io/v1alpha1", "ServingRuntime")
    assert (svc["apiVersion"], svc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")


def test_runtime_speaks_v2_and_names_its_model_format() -> None:
    spec = runtime()["spec"]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    assert spec.get("multiModel", False) is False
    formats = {f["name"] for f in spec["supportedModelFormats"]}
    assert formats <= SERVED_MODELS and formats, formats


def test_inference_service_uses_the_runtime() -> None:
    svc, rt = isvc(), runtime()
    model = svc["spec"]["predictor"]["model"]
    assert model["runtime"] == rt["metadata"]["name"]
    assert model["protocolVersion"] == "v2"
    assert any(
        f["name"] == model["modelFormat"]["name"] and str(f.get("version")) == str(model["modelFormat"].get("version"))
        for f in rt["spec"]["supportedModelFormats"]
    )
    # The models are built into the image: nothing to download.
    assert "storageUri" not in model and "storage" not in model
    # Named after a served model: its predictor host answers /v2/models/<name>/infer.
    assert svc["metadata"]["name"] in SERVED_MODELS


def test_grpc_inference_service_routes_http2_to_the_grpc_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """KServe exposes one port per predictor: for grpc-v2 it is named h2c and is the runtime's gRPC port."""
    rest, grpc = isvc()["spec"]["predictor"], grpc_isvc()["spec"]["predictor"]
    assert grpc["model"]["protocolVersion"] == "grpc-v2" and grpc["model"]["runtime"] == runtime()["metadata"]["name"]
    assert grpc["model"]["modelFormat"] == rest["model"]["modelFormat"]
    (port,) = grpc["model"]["ports"]
    settings = settings_from(monkeypatch, runtime_env())
    assert port["name"] == "h2c" and port["containerPort"] == settings.grpc_port == 9000 and settings.grpc_enabled
    assert {k: v for k, v in grpc.items() if k != "model"} == {k: v for k, v in rest.items() if k != "model"}


def test_runtime_image_is_the_service_image() -> None:
    image = runtime_container()["image"]
    assert image.split(":")[0] == deployment_container()["image"].split(":")[0]
    assert runtime_container()["args"] == ["serve"]  # the image's ENTRYPOINT is tini -- python -m service


def test_runtime_env_names_and_values_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    names = {e["name"] for e in runtime_container()["env"]}
    unknown = sorted(n for n in names if not n.startswith("ATTN_") or field_of(n) not in settings_fields())
    assert not unknown, f"names with no Settings field: {unknown}"
    settings = settings_from(monkeypatch, runtime_env())
    (port,) = runtime_container()["ports"]
    assert settings.host == "0.0.0.0" and settings.port == port["containerPort"] == 8080
    (keys,) = [e for e in runtime_container()["env"] if e["name"] == "ATTN_API_KEYS"]
    assert "value" not in keys and not keys["valueFrom"]["secretKeyRef"].get("optional", False)


def test_runtime_probes_are_exempt_health_routes() -> None:
    container = runtime_container()
    port = container["ports"][0]["containerPort"]
    ready, live = container["readinessProbe"]["httpGet"], container["livenessProbe"]["httpGet"]
    assert ready["path"] in {"/readyz", "/v2/health/ready"} and live["path"] in {"/healthz", "/v2/health/live"}
    assert ready["port"] == live["port"] == port
    exempt = set(Settings.model_fields["auth_exempt_paths"].default)
    assert {ready["path"], live["path"]} <= exempt
    # The ONNX warm-up happens before the liveness probe may restart the container.
    assert container["livenessProbe"].get("initialDelaySeconds", 0) >= 30


def test_runtime_resources_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    resources = runtime_container()["resources"]
    assert cpu_quantity(resources["requests"]["cpu"]) <= cpu_quantity(resources["limits"]["cpu"])
    assert resources["requests"]["memory"] and resources["limits"]["memory"]
    threads = settings_from(monkeypatch, runtime_env()).onnx_intra_op_threads
    assert 0 < threads <= cpu_quantity(resources["limits"]["cpu"])


def test_runtime_security_matches_the_image() -> None:
    sc = runtime_container()["securityContext"]
    (user,) = [args for instruction, args in final_stage() if instruction == "USER"]
    assert str(sc["runAsUser"]) == user.split(":")[0] and sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]


def test_autoscaling_follows_requests_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    predictor = isvc()["spec"]["predictor"]
    assert predictor["scaleMetric"] == "concurrency"
    settings = settings_from(monkeypatch, runtime_env())
    # One pod processes max_concurrent_requests at once; more in flight queue there.
    assert predictor["scaleTarget"] == settings.max_concurrent_requests
    assert 1 <= predictor["minReplicas"] <= predictor["maxReplicas"]
    assert predictor["terminationGracePeriodSeconds"] >= settings.shutdown_grace_s


def test_metrics_are_scraped() -> None:
    annotations = runtime()["metadata"]["annotations"]
    assert annotations["prometheus.kserve.io/path"] == "/metrics"
    assert int(annotations["prometheus.kserve.io/port"]) == runtime_container()["ports"][0]["containerPort"]
    assert isvc()["metadata"]["annotations"]["serving.kserve.io/enable-prometheus-scraping"] == "true"


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_runtime_container_validates_as_a_pod(tmp_path: Path, version: str) -> None:
    if importlib.util.find_spec("kubernetes_validate") is None:
        pytest.skip("kubernetes-validate is not installed (PyPI package kubernetes-validate, in the test extra)")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "runtime-check"}}
    pod["spec"] = {"containers": [runtime_container()]}
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--kubernetes-version", version, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------- monitoring


def test_service_monitor_selects_the_service() -> None:
    monitor = load(MONITORING / "servicemonitor.yaml")
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    service = resource("Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


def test_pods_carry_scrape_annotations() -> None:
    template = resource("Deployment")["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/path"] == "/metrics"
    assert int(annotations["prometheus.io/port"]) == deployment_container()["ports"][0]["containerPort"]
    assert "/metrics" in Settings.model_fields["auth_exempt_paths"].default


def test_compose_monitoring_profile_scrapes_the_service() -> None:
    services = compose()["services"]
    prometheus = services["prometheus"]
    assert prometheus["profiles"] == ["monitoring"]
    assert "@sha256:" in prometheus["image"], "pinned by digest"
    (volume,) = prometheus["volumes"]
    source, target = volume.split(":")[:2]
    assert (REPO / source).resolve() == PROMETHEUS and target == "/etc/prometheus"
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    (target_host,) = job["static_configs"][0]["targets"]
    host, port = target_host.split(":")
    assert host in services and int(port) == 8000


def promtool() -> str:
    binary = find_executable("promtool")
    if binary is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; .ci/run installs it)")
    return binary


def test_prometheus_config_and_rules_pass_promtool() -> None:
    binary = promtool()
    for args in (
        ["check", "config", str(PROMETHEUS / "prometheus.yml")],
        ["check", "rules", str(PROMETHEUS / "rules.yml")],
    ):
        result = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


def test_recording_rules_name_metrics_the_service_exports() -> None:
    from service.observability.metrics import ServiceMetrics

    exported = {m.name for m in ServiceMetrics().registry.collect()}
    rules = yaml.safe_load((PROMETHEUS / "rules.yml").read_text())
    for rule in rules["groups"][0]["rules"]:
        names = {n for n in exported if n in rule["expr"]}
        assert names, f"{rule['record']} reads no metric the service exports: {rule['expr']}"
