"""Metric names: those the alert rules and the dashboard use, and those a service exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "voice-agent.json"
_NAME = re.compile(r"\bva_[a-z0-9_]+\b")
_SERIES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def used_in_alerts() -> set[str]:
    return {name for rule in alert_rules() for name in _NAME.findall(rule["expr"])}


def used_in_dashboard() -> set[str]:
    return {name for expr in dashboard_exprs() for name in _NAME.findall(expr)}


def exposed(text: str) -> set[str]:
    """Series names a /metrics page offers: its samples, and what its `# TYPE` lines declare
    (a labelled metric shows only those until something is counted)."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.add(name)
            names.update(name + suffix for suffix in _SERIES.get(kind, ()))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def sampled(text: str) -> set[str]:
    """Series names with at least one sample on a /metrics page."""
    return {
        re.split(r"[{ ]", line, maxsplit=1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
