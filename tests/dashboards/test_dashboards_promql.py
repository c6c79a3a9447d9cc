"""Every PromQL expression of the dashboards parses: promtool checks them as recording rules.

Grafana variables are substituted first, the way Grafana does before it sends a query (All is `.+`), so
what promtool reads is what Prometheus will be asked.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.conftest import require_tool
from tests.dashboards.grafana import Context, all_dashboards, all_queries, interpolate


def expressions() -> dict[str, str]:
    """Rule name -> expression, for every query and every variable's series selector."""
    out = {}
    context = Context(values={})
    for i, query in enumerate(all_queries()):
        out[f"dashboard:query_{i}"] = interpolate(query.expr, context)
    for name, dashboard in all_dashboards().items():
        for v in dashboard["templating"]["list"]:
            match = re.fullmatch(r"label_values\((.+), \w+\)", v.get("definition", ""))
            if match:
                out[f"dashboard:{name.split('.')[0].replace('-', '_')}_{v['name']}"] = interpolate(
                    f"count({match.group(1)})", context
                )
    return out


def test_every_expression_parses(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    exprs = expressions()
    names = {f"dashboard:query_{i}": str(q) for i, q in enumerate(all_queries())}
    rules = {"groups": [{"name": "dashboards", "rules": [{"record": n, "expr": e} for n, e in exprs.items()]}]}
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False, width=1000))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    failed = re.findall(r'"(dashboard:\w+)"', result.stdout + result.stderr)
    where = "\n".join(names.get(n, n) for n in failed)
    assert result.returncode == 0, f"{where}\n{result.stdout}{result.stderr}"
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_interpolation_matches_grafana() -> None:
    # Multi-value variables become an escaped regex alternation; All becomes the allValue.
    context = Context(values={"instance": ["10.0.0.1:9481", "10.0.0.2:9481"], "gpu": ["3"]}, rate_interval="4s")
    expr = 'rate(x_total{job=~"$job",instance=~"$instance",gpu=~"$gpu"}[$__rate_interval])'
    assert interpolate(expr, context) == (
        'rate(x_total{job=~".+",instance=~"(10\\\\.0\\\\.0\\\\.1:9481|10\\\\.0\\\\.0\\\\.2:9481)",gpu=~"3"}[4s])'
    )
