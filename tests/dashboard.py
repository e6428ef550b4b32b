"""The Grafana dashboard's PromQL, and the series names an exposition declares: shared by
test_grafana_dashboard.py and test_prometheus_scrape.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy/grafana/edgeinfer-dashboard.json"

_NOT_METRICS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
_SERIES_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count", "_created"),
                    "summary": ("", "_sum", "_count", "_created"), "gauge": ("",), "untyped": ("",),
                    "info": ("_info",), "stateset": ("",), "gaugehistogram": ("_bucket", "_gsum", "_gcount")}


def panels() -> list[dict]:
    """Every panel with queries (row panels and their children flattened)."""
    out, todo = [], list(json.loads(DASHBOARD.read_text())["panels"])
    while todo:
        p = todo.pop(0)
        todo += p.get("panels", [])
        if p.get("targets"):
            out.append(p)
    return out


def queries(panel: dict) -> list[str]:
    return [t["expr"] for t in panel["targets"]]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers left once strings, label matchers, range
    selectors and ``by``/``without``/``on``/``ignoring``/``group_*`` label lists are removed, except
    function and aggregation names (followed by ``(``) and the binary keywords."""
    s = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", s):
        if s[m.end():].lstrip().startswith("(") or m.group().lower() in _NOT_METRICS:
            continue
        names.add(m.group())
    return names


def series_names(families: dict[str, str]) -> set[str]:
    """The sample names an exposition has for ``{family: type}`` (a counter's family may already end in
    ``_total``: the text format's ``# TYPE`` line names it so)."""
    return {name.removesuffix("_total") + suffix if kind == "counter" else name + suffix
            for name, kind in families.items() for suffix in _SERIES_SUFFIXES[kind]}


def declared_families(exposition: str) -> dict[str, str]:
    """``{family: type}`` from the ``# TYPE`` lines of a Prometheus text exposition (families without samples
    yet included: a labelled metric nobody has observed is still declared)."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.M))
