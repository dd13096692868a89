"""``examples/kubernetes/``: the manifests agree with each other and with what ``kinesumer lag
--serve`` serves. Parsed with PyYAML; no cluster needed. The commands in the containers are
parsed by the real ``kinesumer`` argument parser, with the containers' environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from kinesumer.cli import build_parser
from kinesumer.cli.lag_board import LagBoard, Snapshot
from kinesumer.cli.lag_serve import HEALTH_PATH, LAG_PATH
from kinesumer.core.lag import GroupLag, ShardLag

FOLDER = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"


def documents() -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> manifest, from every YAML file of the folder."""
    found = {}
    for path in sorted(FOLDER.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            found[(document["kind"], document["metadata"]["name"])] = document
    return found


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(only)


def parsed(box: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The container's ``kinesumer`` command as the CLI parses it, in its environment."""
    for variable in box.get("env", []):
        monkeypatch.setenv(variable["name"], variable["value"])
    argv = box["args"]
    assert argv[0] == "kinesumer"
    return build_parser().parse_args(argv[1:])


def test_the_scaled_object_reads_what_the_lag_service_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = documents()
    scaled = found[("ScaledObject", "orders-etl-members")]
    members = found[("Deployment", "orders-etl-members")]
    lag = found[("Deployment", "orders-etl-lag")]
    service = found[("Service", "orders-etl-lag")]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] == members["metadata"]["name"]
    assert spec["minReplicaCount"] == 0 and members["spec"]["replicas"] == 0
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "metrics-api"
    meta = trigger["metadata"]

    # The URL: the Service's name and port, the path the server serves the document at.
    url = urlsplit(meta["url"])
    assert url.scheme == "http" and url.path == LAG_PATH
    assert url.hostname is not None and url.hostname.split(".")[0] == service["metadata"]["name"]
    (port,) = service["spec"]["ports"]
    assert url.port == port["port"]
    box = container(lag)
    (container_port,) = box["ports"]
    assert port["targetPort"] == container_port["name"]
    assert service["spec"]["selector"] == lag["spec"]["template"]["metadata"]["labels"]

    # The command: --serve on every interface, on the container's port, for the members' app.
    args = parsed(box, monkeypatch)
    assert args.serve and args.host == "0.0.0.0" and args.port == container_port["containerPort"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert box[probe]["httpGet"] == {"path": HEALTH_PATH, "port": "http"}
    member_args = parsed(container(members), monkeypatch)
    assert (member_args.app, member_args.table) == (args.app, args.table)
    assert args.stream == member_args.streams

    # The value: a number at that JSON path of the served document.
    board = LagBoard("orders-etl", "kinesumer-state", interval=10)
    rows = [ShardLag("orders", "shardId-000000000000", None, None, 42_000)]
    board.succeeded(Snapshot(GroupLag.of("orders-etl", "kinesumer-state", rows), (), 1, 0.1))
    document = board.lag_document(2)
    assert document is not None
    assert meta.get("format", "json") == "json"
    value = document[meta["valueLocation"]]
    assert isinstance(value, (int, float)) and value == 42.0
    assert 0 < float(meta["activationTargetValue"]) <= float(meta["targetValue"])
    assert spec["maxReplicaCount"] >= 1


# KEDA's own schema for a ScaledObject: the CRD file of kedacore/keda, vendored with its source
# and commit in its header. Validated offline with jsonschema, as the API server would with
# `kubectl apply --validate=strict` (unknown fields refused, not pruned).
KEDA_CRD = Path(__file__).resolve().parent / "schemas" / "keda.sh_scaledobjects.yaml"

# The metrics-api scaler's metadata keys: the `keda:"name=..."` tags of metricsAPIScalerMetadata
# in pkg/scalers/metrics_api_scaler.go at the vendored CRD's commit, the keys KEDA's documentation
# lists (https://keda.sh/docs/2.20/scalers/metrics-api/), and authMode (its authentication).
METRICS_API_KEYS = {
    "url",
    "format",
    "valueLocation",
    "targetValue",
    "activationTargetValue",
    "unsafeSsl",
    "aggregateFromKubeServiceEndpoints",
    "aggregationType",
    "timeout",
    "authMode",
}
METRICS_API_REQUIRED = {"url", "valueLocation"}
METRICS_API_FORMATS = {"json", "xml", "yaml", "prometheus"}

# The CEL rules (x-kubernetes-validations) of the vendored schema, which jsonschema cannot run:
# each is checked below in Python. A new rule in an updated CRD fails the test until it is.
KNOWN_CEL_RULES = {
    "!has(self.minReplicaCount) || self.minReplicaCount <= (has(self.maxReplicaCount)"
    " ? self.maxReplicaCount : 100)",
}


def keda_schema() -> dict[str, Any]:
    """The served version's openAPIV3Schema, as JSON Schema: Kubernetes' extensions translated."""
    crd = yaml.safe_load(KEDA_CRD.read_text())
    assert (
        crd["kind"] == "CustomResourceDefinition" and crd["spec"]["names"]["kind"] == "ScaledObject"
    )
    (version,) = [v for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
    assert version["name"] == "v1alpha1"
    return dict(structural(version["schema"]["openAPIV3Schema"]))


def structural(node: Any) -> Any:
    """Kubernetes' structural schema -> JSON Schema. x-kubernetes-int-or-string: an integer or a
    string. x-kubernetes-preserve-unknown-fields: any field. Otherwise an object with properties
    refuses others (strict validation). The other x-kubernetes-* keys (list types, CEL rules) are
    dropped: the CEL rules are checked apart."""
    if isinstance(node, list):
        return [structural(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        key: structural(value) for key, value in node.items() if not key.startswith("x-kubernetes-")
    }
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def cel_rules(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, list):
        for item in node:
            found |= cel_rules(item)
    elif isinstance(node, dict):
        for rule in node.get("x-kubernetes-validations", []):
            found.add(" ".join(rule["rule"].split()))
        for value in node.values():
            found |= cel_rules(value)
    return found


def keda_errors(document: dict[str, Any]) -> list[str]:
    """What KEDA's schema (and its CEL rule) says against a ScaledObject, [] when it is valid."""
    import jsonschema

    schema = keda_schema()
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(document)
    ]
    spec = document.get("spec", {})
    if "minReplicaCount" in spec and spec["minReplicaCount"] > spec.get("maxReplicaCount", 100):
        errors.append("spec: minReplicaCount must be less than or equal to maxReplicaCount")
    return errors


def test_the_scaled_object_is_valid_against_kedas_own_schema() -> None:
    crd = yaml.safe_load(KEDA_CRD.read_text())
    assert cel_rules(crd) == KNOWN_CEL_RULES
    scaled = documents()[("ScaledObject", "orders-etl-members")]
    assert keda_errors(scaled) == []

    # The check has teeth: a misspelt field, a wrong type, a missing trigger type, a bad range.
    broken = yaml.safe_load(yaml.safe_dump(scaled))
    broken["spec"]["minReplicaCounts"] = 0
    broken["spec"]["pollingInterval"] = "30"
    del broken["spec"]["triggers"][0]["type"]
    broken["spec"]["minReplicaCount"] = 5
    errors = "\n".join(keda_errors(broken))
    assert "'minReplicaCounts' was unexpected" in errors
    assert "pollingInterval: '30' is not of type 'integer'" in errors
    assert "'type' is a required property" in errors
    assert "minReplicaCount must be less than or equal to maxReplicaCount" in errors


def test_the_metrics_api_trigger_uses_the_scalers_documented_keys() -> None:
    scaled = documents()[("ScaledObject", "orders-etl-members")]
    (trigger,) = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    assert set(meta) <= METRICS_API_KEYS, set(meta) - METRICS_API_KEYS
    assert set(meta) >= METRICS_API_REQUIRED
    assert meta.get("format", "json") in METRICS_API_FORMATS
    # Trigger metadata is map[string]string in the CRD: numbers are quoted, and parse as floats.
    for key in ("targetValue", "activationTargetValue"):
        assert isinstance(meta[key], str) and float(meta[key]) >= 0
