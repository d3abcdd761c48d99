"""The Grafana dashboard and the Prometheus alert rules ask for what the proxy exports: every
query parses as PromQL and names only metrics and labels that /metrics has, and only label
values docs/operations.md gives, so a renamed metric, label or value breaks a test rather than a
panel or an alert that never fires. Every metric and every alert is documented."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import proxy.server.app  # noqa: F401  (every module: every error class)
from proxy import errors
from proxy.observability.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy/grafana/compaction-proxy.json"
ALERTS = ROOT / "deploy/prometheus/alerts.yml"
# Labels Prometheus adds to every series it scrapes, and the series it makes itself.
TARGET_LABELS = {"job", "instance"}
SCRAPE_SERIES = {"up": set[str]()}
# Grafana's variables, as Grafana would fill them in.
GRAFANA = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$job": ".+",
    "$instance": ".+",
    "$policy": ".*",
    "$upstream": ".*",
    "$model": ".*",
}
OPERATIONS = ROOT / "docs/operations.md"


def exported() -> dict[str, set[str]]:
    """Every series name of /metrics and its labels, with one sample of each metric."""
    metrics = Metrics()
    for metric in vars(metrics).values():
        labels = getattr(metric, "labelnames", None)  # the counters and histograms
        if labels is None:
            continue
        child = metric.labels(*("x" for _ in labels)) if labels else metric
        child.inc() if hasattr(child, "inc") else child.observe(1)
    found = dict(SCRAPE_SERIES)
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


def documented() -> dict[str, tuple[set[str], str]]:
    """The metric table of docs/operations.md: each series name, its labels and what the row
    says (the label values it names)."""
    rows = {}
    for line in OPERATIONS.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`compaction_proxy_"):
            rows[cells[0].strip("`")] = (set(re.findall(r"`(\w+)`", cells[2])), cells[3])
    return rows


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def queries() -> dict[str, str]:
    """Every PromQL expression of the dashboard and the alerts, by where it is."""
    found = {}
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            found[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            inner = re.fullmatch(r"label_values\((.+), \w+\)", variable["query"]["query"])
            assert inner, variable["query"]
            found[f"variable {variable['name']}"] = inner[1]
    for rule in alerts():
        found[f"alert {rule['alert']}"] = rule["expr"]
    return found


def problems(expr: str, series: dict[str, set[str]]) -> list[str]:
    """What in `expr` is not PromQL, or names a series or label that is not exported."""
    for variable, value in GRAFANA.items():
        expr = expr.replace(variable, value)
    try:
        tree = promql_parser.parse(expr)
    except ValueError as exc:
        return [f"not PromQL: {exc}"]
    found: list[str] = []
    carried: set[str] = set()  # the labels of the series the expression reads
    grouping: set[str] = set()  # the labels its aggregations group by

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name not in series:
                found.append(f"no series {node.name}")
                return
            known = series[node.name] | TARGET_LABELS
            carried.update(known)
            unknown = [m.name for m in node.matchers.matchers if m.name not in known]
            found.extend(f"{node.name} has no label {label}" for label in unknown)
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            grouping.update(node.modifier.labels)

    promql_parser.walk(tree, visit)
    return found + [f"no series has label {label}" for label in sorted(grouping - carried)]


def undocumented_values(expr: str) -> list[str]:
    """The label values `expr` matches on that the metric's row in docs/operations.md does not
    name: a value the proxy never sets makes a panel empty and an alert silent."""
    for variable, value in GRAFANA.items():
        expr = expr.replace(variable, value)
    rows = documented()
    found: list[str] = []

    def visit(node: Any) -> None:
        if not isinstance(node, promql_parser.VectorSelector) or node.name not in rows:
            return
        for matcher in node.matchers.matchers:
            if matcher.name in TARGET_LABELS:
                continue
            # Literal alternatives only: "502|504" is two values, "4.." and ".*" are patterns.
            row = rows[node.name][1]
            for value in matcher.value.split("|"):
                if re.fullmatch(r"\w+", value) and not re.search(rf"\b{value}\b", row):
                    found.append(f"{node.name}: {matcher.name}={value!r} is not documented")

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


@pytest.mark.parametrize(("where", "expr"), sorted(queries().items()))
def test_every_query_asks_for_what_the_proxy_exports(where: str, expr: str) -> None:
    assert problems(expr, exported()) == [], where


@pytest.mark.parametrize(("where", "expr"), sorted(queries().items()))
def test_every_label_value_a_query_asks_for_is_one_the_proxy_sets(where: str, expr: str) -> None:
    assert undocumented_values(expr) == [], where


def test_the_value_check_finds_what_is_not_documented() -> None:
    expr = 'rate(compaction_proxy_upstream_retries_total{reason=~"overflow|overfow"}[5m])'
    assert undocumented_values(expr) == [
        "compaction_proxy_upstream_retries_total: reason='overfow' is not documented"
    ]


def test_every_metric_is_documented_with_its_labels() -> None:
    exposed = {
        name.removesuffix("_sum"): labels
        for name, labels in exported().items()
        if name.startswith("compaction_proxy_") and not name.endswith(("_bucket", "_count"))
    }
    assert {name: labels for name, (labels, _) in documented().items()} == exposed


def refusal_reasons() -> set[str]:
    """Every `reason` of compaction_proxy_refusals_total: the code (else the type) of each of
    the proxy's error classes, and each code the proxy's source gives one of them. A provider's
    error through litellm (ProviderError) is relayed as the upstream's answer, never counted;
    a head too large (HeadTooLarge) is refused by the server before the app, never counted;
    the dashboard's checks (Forbidden) answer its own calls, which are no API's requests and
    counted nowhere, as the admin API's are not."""
    classes = {cls.__name__: cls for cls in _subclasses(errors.APIError)}
    classes.pop(errors.ProviderError.__name__)
    classes.pop(errors.HeadTooLarge.__name__)
    classes.pop(errors.Forbidden.__name__)
    reasons = {cls.code or cls.error_type for cls in classes.values()}
    for path in (ROOT / "proxy").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in classes:
                reasons.update(
                    keyword.value.value
                    for keyword in node.keywords
                    if keyword.arg == "code" and isinstance(keyword.value, ast.Constant)
                )
    return reasons


def _subclasses(cls: type) -> set[type]:
    return {sub for direct in cls.__subclasses__() for sub in {direct, *_subclasses(direct)}}


def test_every_refusal_reason_is_documented() -> None:
    reasons = refusal_reasons()
    assert {"invalid_type", "invalid_encrypted_content", "upstream_timeout"} <= reasons
    _, description = documented()["compaction_proxy_refusals_total"]
    assert reasons - set(re.findall(r"`(\w+)`", description)) == set()


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("sum(rate(compaction_proxy_nothing_total[5m]))", "no series compaction_proxy_nothing"),
        ('compaction_proxy_requests_total{tenant="t1"}', "has no label tenant"),
        ("sum by (tenant) (rate(compaction_proxy_requests_total[5m]))", "no series has label"),
        ("sum(rate(compaction_proxy_requests_total[5m])", "not PromQL"),
    ],
    ids=["metric", "label", "grouping", "syntax"],
)
def test_the_query_check_finds_what_does_not_exist(expr: str, problem: str) -> None:
    (found,) = problems(expr, exported())
    assert problem in found


def test_the_dashboard_is_laid_out_on_grafanas_grid() -> None:
    board = dashboard()
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    taken: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & taken, f"{panel['title']!r} overlaps another panel"
        taken |= cells
        if panel["type"] != "row":
            assert panel["description"] and panel["targets"], panel["title"]
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_alert_is_documented() -> None:
    text = (ROOT / "docs/operations.md").read_text()
    for rule in alerts():
        assert f"`{rule['alert']}`" in text, rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
