"""Ops surfaces of the running lite stack: /health as seed deployments poll it, /ready, and
every metric the alert rules and the dashboard use, scraped from the real /metrics."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from services.client.stream import StreamClient
from tests.conftest import Stack
from tests.metric_names import exposed, sampled, used_in_alerts, used_in_dashboard
from tests.speech import speak

SEED_FIELDS = {"status", "gpu", "active_connections", "queue_size"}
SEED_GPU_FIELDS = {"id", "name", "available"}


async def turn_then_scrape(stack: Stack) -> dict[str, str]:
    async with StreamClient(stack.stream_url) as client:
        client.new_turn()
        await client.speak(speak("what is the weather like in paris today", 16000), 16000)
        done = await client.silence_until("response.done", timeout_s=20)
        assert done["status"] == "completed"
    async with httpx.AsyncClient(timeout=10) as http:
        return {
            name: (await http.get(f"{s.http}/metrics")).text for name, s in stack.servers.items()
        }


@pytest.fixture(scope="module")
def scraped(lite_stack: Stack) -> dict[str, str]:
    """/metrics of each service after one spoken turn."""
    return asyncio.run(turn_then_scrape(lite_stack))


def test_alert_and_dashboard_metrics_are_on_metrics(scraped: dict[str, str]) -> None:
    offered = set().union(*(exposed(text) for text in scraped.values()))
    for used in (used_in_alerts(), used_in_dashboard()):
        missing = used - offered
        assert not missing, f"not on any /metrics: {sorted(missing)}"


def test_one_turn_fills_the_alerted_series(scraped: dict[str, str]) -> None:
    """Not just declared: the turn produced samples, with the labels the rules group by."""
    asr, tts, gateway = scraped["asr"], scraped["tts"], scraped["gateway"]
    for text in (asr, tts):
        assert "va_request_duration_seconds_bucket" in sampled(text)
        assert "va_requests_total" in sampled(text)
    assert 'va_request_duration_seconds_bucket{le="10.0",route="job",service="asr"}' in asr
    assert 'va_request_duration_seconds_bucket{le="10.0",route="job",service="tts"}' in tts
    assert 'va_requests_total{outcome="ok",route="job",service="asr"}' in asr
    for name in ("asr", "tts", "gateway"):
        text = scraped[name]
        assert f'va_queue_depth{{service="{name}"}}' in text  # refreshed on every scrape
        assert f'va_ready{{service="{name}"}} 1.0' in text
    assert "va_voice_to_voice_seconds_count" in sampled(gateway)
    assert "va_asr_latency_seconds_bucket" in sampled(asr)
    assert "va_tts_first_audio_seconds_bucket" in sampled(tts)


async def test_health_has_the_fields_seed_deployments_poll(lite_stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        for name, server in lite_stack.servers.items():
            health = (await http.get(f"{server.http}/health")).json()
            assert health.keys() >= SEED_FIELDS and health["service"] == name
            assert health["gpu"].keys() >= SEED_GPU_FIELDS
            assert health["gpu"]["available"] is False  # the lite engines run on the CPU
            assert health["status"] == "healthy" and health["model_loaded"] is True
            ready = await http.get(f"{server.http}/ready")
            assert ready.status_code == 200 and ready.json()["ready"] is True
