"""docs/metrics.md, the alert rules and the dashboard against the metrics the code declares."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest

import services.asr.metrics
import services.common.metrics
import services.duplex.metrics
import services.gateway.metrics
import services.tts.metrics  # noqa: F401  (every service's metrics declared in this process)
from tests.metric_names import (
    ALERTS,
    DASHBOARD,
    ROOT,
    alert_rules,
    dashboard_exprs,
    exposed,
    used_in_alerts,
    used_in_dashboard,
)

DOCS = ROOT / "docs" / "metrics.md"
PROMETHEUS = ROOT / "deploy" / "prometheus"
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool")


def declared() -> set[str]:
    return exposed(generate_latest(REGISTRY).decode())


def documented_families() -> set[str]:
    return {name for name in re.findall(r"`(va_[a-z0-9_]+)`", DOCS.read_text())}


def test_docs_list_every_metric() -> None:
    families = {m.name for m in REGISTRY.collect() if m.name.startswith("va_")}
    documented = documented_families()
    missing = {f for f in families if f not in documented and f"{f}_total" not in documented}
    assert not missing, f"add to docs/metrics.md: {sorted(missing)}"


def test_docs_name_no_metric_that_does_not_exist() -> None:
    unknown = documented_families() - declared()
    assert not unknown, sorted(unknown)


def test_alerts_and_dashboard_use_declared_metrics() -> None:
    assert used_in_alerts() and used_in_dashboard()
    assert not used_in_alerts() - declared(), sorted(used_in_alerts() - declared())
    assert not used_in_dashboard() - declared(), sorted(used_in_dashboard() - declared())


def test_alerts_carry_the_thresholds_ops_asked_for() -> None:
    rules = {rule["alert"]: rule for rule in alert_rules()}
    latency = " ".join(rules["VoiceAgentRequestLatencyP99High"]["expr"].split())
    p99 = r"histogram_quantile\(0\.99,.*va_request_duration_seconds_bucket.*>= 10$"
    assert re.search(p99, latency)
    gpu = rules["VoiceAgentGpuUnderutilized"]["expr"].strip()
    assert gpu.endswith("va_gpu_utilization_ratio[15m]) < 0.5")
    assert rules["VoiceAgentQueueDepthHigh"]["expr"].strip().endswith("(va_queue_depth) > 100")
    error_rate = " ".join(rules["VoiceAgentErrorRateHigh"]["expr"].split())
    # one counter on both sides: va_errors_total counts what no request count matches
    assert error_rate == (
        'sum by (service) (rate(va_requests_total{outcome="error"}[5m])) '
        "/ sum by (service) (rate(va_requests_total[5m])) > 0.01"
    )
    responses = " ".join(rules["VoiceAgentGatewayResponsesFailing"]["expr"].split())
    assert responses == (
        'sum by (instance) (rate(va_gateway_responses_total{status="failed"}[5m])) '
        "/ sum by (instance) (rate(va_gateway_responses_total[5m])) > 0.01"
    )
    for rule in rules.values():
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_dashboard_is_importable_json() -> None:
    import json

    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "voice-agent" and dashboard["panels"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"]


@needs_promtool
def test_promtool_checks_config_rules_and_rule_tests() -> None:
    for args in (
        ["check", "config", str(PROMETHEUS / "prometheus.yml")],
        ["check", "rules", str(ALERTS)],
        ["test", "rules", str(PROMETHEUS / "alerts_test.yml")],
    ):
        done = subprocess.run(["promtool", *args], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """promtool parses each dashboard query as a recording rule's expression."""
    rules = [
        f"      - record: dashboard:q{i}\n        expr: '{e.replace('$__rate_interval', '5m')}'"
        for i, e in enumerate(dashboard_exprs())
    ]
    file = tmp_path / "dashboard_rules.yml"
    file.write_text("groups:\n  - name: dashboard\n    rules:\n" + "\n".join(rules) + "\n")
    done = subprocess.run(["promtool", "check", "rules", str(file)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
