"""Fails when an alert rule or the Grafana dashboard names a metric, or a
label value, that the worker does not export.

    python3 scripts/deploy/metric_names.py SCRAPE...

SCRAPE: files holding a live worker's /metrics (scripts/check-deploy.sh
scrapes one in core and one in JetStream mode). Every series name in an
expression of deploy/prometheus/alerts.yaml, the PrometheusRule and
deploy/grafana/prefill-handoff.json must appear in a scrape, and every
`label="value"` matcher on it must match a scraped series.
"""

import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]

# PromQL's functions, aggregations and keywords the files use or may use;
# any other identifier in an expression is a metric name.
PROMQL = set("""
rate irate increase delta idelta deriv changes resets histogram_quantile
sum count min max avg stddev stdvar topk bottomk quantile group count_values
vector scalar time absent absent_over_time clamp_min clamp_max abs ceil floor
round sort sort_desc label_replace label_join
avg_over_time min_over_time max_over_time sum_over_time count_over_time
last_over_time quantile_over_time
by without on ignoring group_left group_right bool and or unless offset
label_values query_result inf nan
""".split())

SERIES = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s')
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|!~|=)\s*"((?:[^"\\]|\\.)*)"')
SELECTOR = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}')


def exported(paths: list) -> dict:
    """Metric name -> list of label dicts, from Prometheus text files."""
    series = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            m = SERIES.match(line)
            if m and not line.startswith("#"):
                labels = {k: v for k, _, v in MATCHER.findall(m.group(2) or "")}
                series.setdefault(m.group(1), []).append(labels)
    return series


def names(expr: str) -> set:
    """The metric names an expression reads."""
    # label_values(METRIC, LABEL): the label is not a metric.
    text = re.sub(r"label_values\(([^,()]*(?:\([^)]*\))?[^,()]*),\s*\w+\s*\)", r"(\1)", expr)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\{?[a-zA-Z_]\w*\}?", " ", text)
    tokens = re.findall(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", text)
    return {t for t in tokens if t not in PROMQL}


def problems(expr: str, where: str, series: dict) -> list:
    found = []
    for name in sorted(names(expr)):
        if name not in series:
            found.append(f"{where}: {name} is not exported by the worker")
    for name, body in SELECTOR.findall(expr):
        for label, op, value in MATCHER.findall(body):
            if op != "=" or name not in series or value.startswith("$"):
                continue
            if not any(s.get(label) == value for s in series[name]):
                found.append(f'{where}: no {name} series has {label}="{value}"')
    return found


def rule_exprs(path: Path, groups: list) -> list:
    return [(f"{path.name}: {r.get('alert') or r.get('record')}", r["expr"])
            for g in groups for r in g["rules"]]


def dashboard_exprs(path: Path) -> list:
    out = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                out.append((f"{path.name}: {node.get('legendFormat') or node['expr'][:40]}",
                            node["expr"]))
            query = node.get("query")
            if node.get("type") == "query" and isinstance(query, (str, dict)):
                q = query if isinstance(query, str) else query.get("query", "")
                out.append((f"{path.name}: variable {node.get('name')}", q))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(path.read_text()))
    return out


def all_exprs() -> list:
    rules = ROOT / "deploy/prometheus/alerts.yaml"
    resource = ROOT / "deploy/kubernetes/base/prometheusrule.yaml"
    dashboard = ROOT / "deploy/grafana/prefill-handoff.json"
    return (rule_exprs(rules, yaml.safe_load(rules.read_text())["groups"])
            + rule_exprs(resource, yaml.safe_load(resource.read_text())["spec"]["groups"])
            + dashboard_exprs(dashboard))


def main(argv: list) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    series = exported(argv)
    exprs = all_exprs()
    found = [p for where, expr in exprs for p in problems(expr, where, series)]
    for line in found:
        print(f"metric_names: {line}", file=sys.stderr)
    if found:
        return 1
    used = sorted({n for _, e in exprs for n in names(e)})
    print(f"metric_names: {len(exprs)} expressions, {len(used)} metrics, all exported: {' '.join(used)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
