"""Writes or checks deploy/kubernetes/base/prometheusrule.yaml, the
Prometheus Operator's form of deploy/prometheus/alerts.yaml.

    python3 scripts/deploy/prometheusrule.py          # write it
    python3 scripts/deploy/prometheusrule.py --check  # exit 1 if it differs

The rules file is the source: its `groups:` block, comments included, becomes
the resource's `spec:`. --check compares the parsed groups, so a hand edit
of either file that changes a rule is caught.
"""

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/alerts.yaml"
RESOURCE = ROOT / "deploy/kubernetes/base/prometheusrule.yaml"

HEADER = """\
# Generated from deploy/prometheus/alerts.yaml by
# scripts/deploy/prometheusrule.py: edit that file, then run the script.
# For the Prometheus Operator (monitoring.coreos.com/v1); its ruleSelector
# must match these labels (many installations select `release: <name>`:
# add it in an overlay).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: prefill-handoff
  labels:
    app.kubernetes.io/name: prefill-handoff
spec:
"""


def render() -> str:
    lines = RULES.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    body = ["  " + line if line.strip() else "" for line in lines[start:]]
    return HEADER + "\n".join(body) + "\n"


def main() -> int:
    if sys.argv[1:] == ["--check"]:
        want = yaml.safe_load(RULES.read_text())["groups"]
        have = yaml.safe_load(RESOURCE.read_text())["spec"]["groups"]
        if want != have:
            print(f"{RESOURCE.relative_to(ROOT)} differs from {RULES.relative_to(ROOT)}: "
                  "run python3 scripts/deploy/prometheusrule.py", file=sys.stderr)
            return 1
        return 0
    if sys.argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    RESOURCE.write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
