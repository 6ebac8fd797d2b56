"""deploy/kubernetes/, validated offline: built-in kinds against Kubernetes' own schemas (kubernetes-validate,
strict: unknown fields fail), the custom resources (InferencePool, HTTPRoute, KEDA ScaledObject) against the
schemas below, which hold the fields these examples use, as their CRDs define them; then what ties the
manifests to the server: probes, drain, resources, labels, metric names."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from edge_llm.config import ENV_PREFIX, Settings
from edge_llm.models.fetch import default_model_path
from edge_llm.testing.server import require_model

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deploy" / "kubernetes"
DEFAULT_MODEL = default_model_path()  # what the Deployment's init container fetches
KUBERNETES_VERSION = "1.30.0"  # the oldest version still commonly run; newer ones accept these manifests too

_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
_PORT = {"type": "integer", "minimum": 1, "maximum": 65535}


def _closed(properties: dict[str, Any], *required: str) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


def _resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return _closed({"apiVersion": {"const": api_version}, "kind": {"const": kind},
                    "metadata": _closed({"name": _NAME, "namespace": _NAME,
                                         "labels": {"type": "object"}, "annotations": {"type": "object"}}, "name"),
                    "spec": spec}, "apiVersion", "kind", "metadata", "spec")


# inference.networking.k8s.io/v1 InferencePool (Gateway API Inference Extension v1).
INFERENCE_POOL = _resource("inference.networking.k8s.io/v1", "InferencePool", _closed({
    "selector": _closed({"matchLabels": {"type": "object", "minProperties": 1,
                                         "additionalProperties": {"type": "string", "maxLength": 63}}},
                        "matchLabels"),
    "targetPorts": {"type": "array", "minItems": 1, "maxItems": 1, "items": _closed({"number": _PORT}, "number")},
    "endpointPickerRef": _closed({"group": {"type": "string"}, "kind": {"type": "string"}, "name": _NAME,
                                  "port": _closed({"number": _PORT}, "number"),
                                  "failureMode": {"enum": ["FailOpen", "FailClose"]}}, "name"),
}, "selector", "targetPorts", "endpointPickerRef"))

# gateway.networking.k8s.io/v1 HTTPRoute, the parts used here.
HTTP_ROUTE = _resource("gateway.networking.k8s.io/v1", "HTTPRoute", _closed({
    "parentRefs": {"type": "array", "minItems": 1, "items": _closed({"name": _NAME, "namespace": _NAME,
                                                                     "sectionName": _NAME}, "name")},
    "rules": {"type": "array", "items": _closed({
        "matches": {"type": "array", "items": _closed({"path": _closed({
            "type": {"enum": ["Exact", "PathPrefix", "RegularExpression"]}, "value": {"type": "string"}})})},
        "backendRefs": {"type": "array", "items": _closed({"group": {"type": "string"}, "kind": {"type": "string"},
                                                           "name": _NAME, "port": _PORT, "weight": {"type": "integer"}},
                                                          "name")},
        "timeouts": _closed({"request": {"type": "string", "pattern": r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"},
                             "backendRequest": {"type": "string"}}),
    })},
}, "parentRefs"))

# keda.sh/v1alpha1 ScaledObject with a prometheus trigger.
SCALED_OBJECT = _resource("keda.sh/v1alpha1", "ScaledObject", _closed({
    "scaleTargetRef": _closed({"name": _NAME, "kind": {"type": "string"}, "apiVersion": {"type": "string"}}, "name"),
    "minReplicaCount": {"type": "integer", "minimum": 0},
    "maxReplicaCount": {"type": "integer", "minimum": 1},
    "pollingInterval": {"type": "integer", "minimum": 1},
    "cooldownPeriod": {"type": "integer", "minimum": 0},
    "advanced": _closed({"horizontalPodAutoscalerConfig": _closed({"behavior": _closed({
        "scaleDown": _closed({"stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600}}),
        "scaleUp": _closed({"stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600}}),
    })})}),
    "triggers": {"type": "array", "minItems": 1, "items": _closed({
        "type": {"const": "prometheus"},
        "metadata": _closed({"serverAddress": {"type": "string", "pattern": "^https?://"},
                             "query": {"type": "string", "minLength": 1},
                             "threshold": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
                             "activationThreshold": {"type": "string"}},
                            "serverAddress", "query", "threshold"),
    }, "type", "metadata")},
}, "scaleTargetRef", "triggers"))

CUSTOM_SCHEMAS = {("inference.networking.k8s.io/v1", "InferencePool"): INFERENCE_POOL,
                  ("gateway.networking.k8s.io/v1", "HTTPRoute"): HTTP_ROUTE,
                  ("keda.sh/v1alpha1", "ScaledObject"): SCALED_OBJECT}


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = [(path.name, doc) for path in sorted(MANIFESTS.glob("*.yaml"))
             for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    assert found
    return found


def by_kind(kind: str) -> dict[str, Any]:
    [doc] = [doc for _, doc in documents() if doc["kind"] == kind]
    return doc


@pytest.mark.parametrize("name,doc", documents(), ids=lambda value: value if isinstance(value, str) else value["kind"])
def test_manifest_is_valid(name: str, doc: dict[str, Any]) -> None:
    schema = CUSTOM_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if schema is not None:
        jsonschema.validate(doc, schema)
        return
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"{name}: {doc['kind']} {error.path}: {error.message}", pytrace=False)


def test_the_custom_schemas_refuse_a_misspelt_field() -> None:
    pool = json.loads(json.dumps(by_kind("InferencePool")))
    pool["spec"]["endpointPickerRefs"] = pool["spec"].pop("endpointPickerRef")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pool, INFERENCE_POOL)


def container() -> dict[str, Any]:
    [main] = by_kind("Deployment")["spec"]["template"]["spec"]["containers"]
    return main


def env() -> dict[str, str]:
    return {item["name"]: item["value"] for item in container()["env"]}


def test_environment_names_real_settings() -> None:
    for name in env():
        assert name.startswith(ENV_PREFIX) and name.removeprefix(ENV_PREFIX).lower() in Settings.model_fields, name


def test_probes_and_the_drain() -> None:
    main = container()
    assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    startup = main["startupProbe"]
    assert startup["httpGet"]["path"] == "/readyz" and startup["periodSeconds"] * startup["failureThreshold"] >= 120
    pause = int(main["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain = float(env()["EDGE_LLM_DRAIN_TIMEOUT"])
    grace = by_kind("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > pause + drain + 10  # + the engine's stop and the last error events


def test_memory_covers_the_model_info_estimate() -> None:
    require_model(DEFAULT_MODEL)
    result = subprocess.run([sys.executable, "-m", "edge_llm", "model", "info", str(DEFAULT_MODEL), "--json",
                             "--ctx", env()["EDGE_LLM_CTX_SIZE"]], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    estimate = json.loads(result.stdout)["memory"]["total_bytes"]
    resources = container()["resources"]
    request, limit = (_bytes(resources[key]["memory"]) for key in ("requests", "limits"))
    assert estimate < request < limit


def _bytes(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()
    return int(number) * {"Mi": 2**20, "Gi": 2**30}[unit]


def test_selectors_ports_and_user_agree() -> None:
    deployment = by_kind("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for kind in ("Service", "PodDisruptionBudget", "InferencePool"):
        spec = by_kind(kind)["spec"]
        selector = spec["selector"].get("matchLabels", spec["selector"])
        assert selector.items() <= labels.items(), kind
    port = container()["ports"][0]["containerPort"]
    assert f"EXPOSE {port}" in (REPO / "Dockerfile").read_text()
    assert by_kind("InferencePool")["spec"]["targetPorts"] == [{"number": port}]
    uid = deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    assert f"USER {uid}:" in (REPO / "Dockerfile").read_text()
    assert by_kind("ScaledObject")["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]


def test_the_autoscaler_reads_a_metric_the_server_exports() -> None:
    query = by_kind("ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]
    assert "vllm:num_requests_waiting" in query and f'model_name="{DEFAULT_MODEL.name.removesuffix(".gguf")}"' in query
    assert '"vllm:num_requests_waiting"' in (REPO / "src" / "edge_llm" / "api" / "metrics.py").read_text()
