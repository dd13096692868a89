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
