"""The Grafana dashboard (dashboards/kinesumer.json) against the metrics the library exports.

The exported names are not copied from metrics.py: every method of the engine's
:class:`~kinesumer.observability.metrics.Metrics` is called on a
:class:`~kinesumer.observability.metrics.PrometheusMetrics`
with its own registry, and the samples it then serves are collected (``_total``, ``_bucket``...
as Prometheus sees them). Every query of the dashboard (panels and variables) must name only
those, with labels they carry; every exported family must be shown somewhere; and the JSON
must round-trip through Grafana's own typed dashboard models (grafana-foundation-sdk) unchanged,
the panels well placed on Grafana's 24-column grid.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard
from support.dashboard import exported

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "kinesumer.json"

PROMQL_FUNCTIONS = {
    "sum", "max", "min", "avg", "count", "rate", "irate", "increase", "delta",
    "histogram_quantile", "label_values", "topk", "bottomk", "quantile", "abs", "clamp_min",
}  # fmt: skip
PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "le", "inf",
}  # fmt: skip


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # a collapsed row holds its panels
    return out


def queries(dashboard: dict[str, Any]) -> list[str]:
    found = [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            found.append(query["query"] if isinstance(query, dict) else query)
    return found


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names matched) for every series selector in ``expr``."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values may hold anything
    text = re.sub(r"label_values\(([^,]*),\s*\w+\)", r"\1", text)  # a variable's query
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors, [$__rate_interval]
    out = []
    for match in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?", text):
        name, matchers = match.group(1), match.group(2) or ""
        if text[: match.start()].endswith("$") or name.lower() in PROMQL_WORDS:
            continue  # a dashboard variable, a keyword
        if name in PROMQL_FUNCTIONS or _inside_grouping(text, match.start()):
            continue
        labels = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
        out.append((name, labels))
    return out


def _inside_grouping(text: str, at: int) -> bool:
    """Whether position ``at`` is inside ``by (...)``/``without (...)``/``on (...)``."""
    opened = text.rfind("(", 0, at)
    if opened < 0 or ")" in text[opened:at]:
        return False
    head = text[:opened].rstrip()
    return bool(re.search(r"\b(by|without|on|ignoring|group_left|group_right)$", head))


def grouping_labels(expr: str) -> set[str]:
    found: set[str] = set()
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        found.update(x.strip() for x in group.split(",") if x.strip())
    for group in re.findall(r"label_values\([^,]*,\s*([A-Za-z_]+)\)", expr):
        found.add(group)
    return found


def test_the_selector_parser_sees_metrics_not_functions_or_labels() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (handler, le) (rate(kinesumer_handler_seconds_bucket"
        '{app=~"$app", outcome!~"ok|x"}[$__rate_interval]))) / on (app) kinesumer_leader == 1'
    )
    assert selectors(expr) == [
        ("kinesumer_handler_seconds_bucket", {"app", "outcome"}),
        ("kinesumer_leader", set()),
    ]
    assert grouping_labels(expr) == {"handler", "le", "app"}
    assert selectors("label_values(kinesumer_owned_shards, app)") == [
        ("kinesumer_owned_shards", set())
    ]


def test_every_query_names_only_exported_metrics_and_their_labels() -> None:
    samples = exported()
    dashboard = load()
    used: set[str] = set()
    for expr in queries(dashboard):
        found = selectors(expr)
        assert found, f"no metric in {expr!r}"
        names = {name for name, _ in found}
        for name, labels in found:
            assert name in samples, f"{name} (in {expr!r}) is not a metric kinesumer exports"
            assert labels <= samples[name], f"{name} has no label {labels - samples[name]}"
        known = set().union(*(samples[n] for n in names)) | {"le"}
        assert grouping_labels(expr) <= known, expr
        used |= names
    families = {re.sub(r"_(total|bucket|count|sum|created)$", "", n) for n in samples}
    shown = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in used}
    assert families - shown == set(), "exported but shown nowhere on the dashboard"


def test_the_dashboard_is_well_formed_for_grafana() -> None:
    dashboard = load()
    every = panels(dashboard)
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    cells: set[tuple[int, int]] = set()
    for panel in every:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] >= 1 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps another panel"
                cells.add((x, y))
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel.get("description"), panel["id"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            for name in re.findall(r"\$(\w+)", target["expr"]):
                assert name in variables or name.startswith("__"), f"${name} is not defined"


def test_the_dashboard_round_trips_through_grafanas_models() -> None:
    """Grafana's generated models (grafana-foundation-sdk) decode the dashboard and encode it
    back: a key they do not know (a typo, a field of another schema) would be dropped."""
    register_default_plugins()  # panels' options and Prometheus queries decode typed too
    dashboard = load()
    again = json.loads(json.dumps(Dashboard.from_json(dashboard).to_json(), default=_encode))
    _assert_contained(dashboard, again, "dashboard")


def _encode(value: Any) -> Any:
    if hasattr(value, "to_json"):
        return value.to_json()
    if hasattr(value, "value"):
        return value.value
    raise TypeError(f"cannot encode {value!r}")


def _assert_contained(given: Any, decoded: Any, where: str) -> None:
    if isinstance(given, dict):
        assert isinstance(decoded, dict), where
        for key, value in given.items():
            assert key in decoded, f"{where}.{key} is not in Grafana's dashboard schema"
            _assert_contained(value, decoded[key], f"{where}.{key}")
    elif isinstance(given, list):
        assert isinstance(decoded, list) and len(decoded) == len(given), where
        for index, (a, b) in enumerate(zip(given, decoded, strict=True)):
            _assert_contained(a, b, f"{where}[{index}]")
    else:
        assert given == decoded, f"{where}: {given!r} became {decoded!r}"
