"""The page at `/` in a real headless Chromium (Debian's `chromium`, driven by Playwright),
against the lite stack (Whisper tiny.en, Piper): a fake microphone plays an espeak-ng wav
in a loop, and the test waits on the page's own state (window.voiceAgent).

Artefacts, each run: var/artifacts/browser/page.png (the page after the conversation) and
var/artifacts/browser/browser_test.json (page load → first agent audio, in-page
voice-to-voice per turn, counters). Timings are recorded, never asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import subprocess
import time
import wave
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.llm_server import LlmServer
from services.client.stream import StreamClient
from services.common.audio.pcm import float_to_pcm16
from tests.conftest import RedisProc, Stack
from tests.servers import ServerThread
from tests.speech import speak

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "artifacts" / "browser"
SENTENCE = "what is the weather like in paris today"
RATE = 48000
LONG_REPLY = " ".join(
    [
        # a clause first: the story's first audio is a 4-word piece, playing long before
        # the microphone's next loop speaks over it, however busy the machine
        "Once upon a time, there was a lighthouse keeper who lived alone on a rock.",
        "Every night he climbed the stairs, lit the great lamp and watched the ships.",
        "The sea was wide and dark and cold, and the wind sang in the windows.",
        "One night a storm came from the west, and the waves were as tall as houses.",
    ]
)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Debian's chromium (scripts/system_deps.sh)"
)


def _wav(path: Path) -> Path:
    """The fake microphone: 0.5 s of quiet, the sentence, 8 s of quiet (it loops): the reply
    ends within the gap, and the next loop's speech talks over the long story."""
    quiet = np.zeros(int(0.5 * RATE), np.float32)
    gap = np.zeros(int(8.0 * RATE), np.float32)
    audio = np.concatenate([quiet, speak(SENTENCE, RATE), gap])
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        wav.writeframes(float_to_pcm16(audio))
    return path


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """A headless Chromium context with a fresh profile and the wav as its microphone."""
    from playwright.sync_api import sync_playwright

    wav = _wav(tmp_path / "mic.wav")
    with sync_playwright() as driver:
        context = driver.chromium.launch_persistent_context(
            user_data_dir=str(tmp_path / "profile"),  # fresh every run
            executable_path=CHROMIUM,
            headless=True,
            args=[*FLAGS, f"--use-file-for-fake-audio-capture={wav}"],
            viewport={"width": 900, "height": 900},
            bypass_csp=True,  # lets wait_for_function evaluate strings; the page keeps its CSP
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(browser: Any) -> Any:
    return browser.pages[0] if browser.pages else browser.new_page()


def _wait(page: Any, condition: str, timeout_s: float, arg: Any = None) -> Any:
    return page.wait_for_function(condition, arg=arg, timeout=timeout_s * 1000).json_value()


def test_a_spoken_conversation_in_the_browser(lite_stack: Stack, page: Any) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    started = time.monotonic()
    page.goto(f"{lite_stack.gateway.http}/")
    # the voice picker lists the TTS service's voices (through the gateway)
    _wait(page, "document.querySelectorAll('#voice option').length > 1", 20)
    # the agent picker lists the gateway's agents; without an LLM, echo is the default
    _wait(page, "window.voiceAgent.agents !== null", 20)
    agents = page.eval_on_selector_all("#agent option", "options => options.map(o => o.value)")
    assert {"echo", "openai"} <= set(agents) and page.input_value("#agent") == "echo"
    assert "no LLM is configured" in page.inner_text("#log")
    page.click("#connect")
    _wait(page, "window.voiceAgent.state === 'live'", 30)
    assert page.evaluate("window.voiceAgent.agent") == "echo"

    # the fake microphone's sentence comes back as a final transcript...
    heard = _wait(
        page, "window.voiceAgent.transcripts.find(t => t.toLowerCase().includes('paris'))", 120
    )
    assert "weather" in heard.lower(), heard
    # ...and the agent's answer is played through the worklet
    _wait(page, "window.voiceAgent.counters.playedSamples > 0.5 * window.voiceAgent.sampleRate", 90)
    _wait(page, "window.voiceAgent.latencies.some(l => l.v2v_played_ms !== null)", 30)

    # barge-in: the agent tells a long story; the looping microphone speaks over it
    _wait(
        page,
        "!window.voiceAgent.userSpeaking && !Object.values(window.voiceAgent.responses)"
        ".some(r => r.status === 'in_progress')",
        60,
    )
    clears = page.evaluate("window.voiceAgent.counters.clears")
    page.evaluate("text => window.voiceAgent.say(text)", LONG_REPLY)
    story = _wait(
        page,
        "arg => Object.values(window.voiceAgent.responses)"
        ".find(r => r.text.startsWith(arg.slice(0, 20)))?.id",
        30,
        LONG_REPLY,
    )
    _wait(page, "arg => window.voiceAgent.counters.clears > arg", 90, clears)
    _wait(page, "window.voiceAgent.lastClear !== null", 10)  # the worklet's answer
    cleared = page.evaluate(
        "id => ({status: window.voiceAgent.responses[id].status,"
        " heard: window.voiceAgent.responses[id].heard, last: window.voiceAgent.lastClear})",
        story,
    )
    _wait(page, "arg => window.voiceAgent.responses[arg].status === 'cancelled'", 30, story)
    heard_story = page.evaluate("id => window.voiceAgent.responses[id].heard", story)
    assert len(heard_story) < len(LONG_REPLY), heard_story
    # it was a barge-in (the user was speaking), and the player dropped its queue at once
    clear_log = page.evaluate("window.voiceAgent.clearLog")
    assert {"response_id": story, "during_speech": True} in clear_log, clear_log
    assert cleared["last"] is not None and cleared["last"]["dropped"] >= 0

    # the interrupting speech is a turn of its own: a second in-page voice-to-voice
    _wait(page, "window.voiceAgent.latencies.filter(l => l.v2v_ms !== null).length >= 2", 60)
    state = page.evaluate(
        "({counters: window.voiceAgent.counters, latencies: window.voiceAgent.latencies,"
        " pageToFirstAudioMs: window.voiceAgent.pageToFirstAudioMs,"
        " transcripts: window.voiceAgent.transcripts, errors: window.voiceAgent.errors,"
        " sampleRate: window.voiceAgent.sampleRate})"
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page.png"), full_page=True)
    page.click("#disconnect")
    _wait(page, "window.voiceAgent.closes.length > 0", 10)
    closes = page.evaluate("window.voiceAgent.closes")
    with ThreadPoolExecutor(1) as thread:  # Playwright's sync API holds this thread's loop
        cli = thread.submit(asyncio.run, _cli_turns(lite_stack.stream_url, 3)).result()
    _record(state, cleared, closes, cli, time.monotonic() - started)

    assert closes[0]["code"] == 1000, closes
    assert not errors, errors
    assert not [e for e in state["errors"] if e.get("fatal")], state["errors"]


def test_a_token_rides_in_a_subprotocol_and_a_full_gateway_says_so(
    redis_server: RedisProc, browser: Any
) -> None:
    """A real browser accepts the gateway's subprotocol answer (the token path of auth), and
    a refused session shows the capacity message (close 1013) instead of failing silently."""
    from services.gateway.app import create_app
    from services.gateway.settings import GatewaySection, GatewaySettings

    settings = GatewaySettings(
        profile="fake",
        redis=redis_server.settings(),
        gateway=GatewaySection(max_sessions=1, tts_url=None, end_of_turn="silence"),
    )
    with ServerThread(LlmServer().app) as llm:
        settings.llm.base_url = f"{llm.http}/v1"
        with ServerThread(create_app(settings)) as gateway:
            _token_and_capacity(browser, gateway)


def _token_and_capacity(browser: Any, gateway: ServerThread) -> None:
    """The first page connects with its token; the second is refused (capacity 1)."""
    first, second = (
        browser.pages[0] if browser.pages else browser.new_page(),
        browser.new_page(),
    )
    first.goto(f"{gateway.http}/#token=t0k-123")
    assert first.input_value("#token") == "t0k-123"
    assert "t0k" not in first.url  # taken out of the address bar
    first.click("#connect")
    _wait(first, "window.voiceAgent.state === 'live'", 30)
    # an LLM that answers makes `openai` the default; the picker switches the agent
    assert first.input_value("#agent") == "openai"
    assert first.evaluate("window.voiceAgent.agent") == "openai"
    first.select_option("#agent", "echo")
    _wait(first, "window.voiceAgent.agent === 'echo'", 10)
    second.goto(f"{gateway.http}/")
    second.click("#connect")
    _wait(second, "window.voiceAgent.closes.length > 0", 30)
    closed = second.evaluate("window.voiceAgent.closes[0]")
    assert closed["code"] == 1013, closed
    assert "capacity" in second.inner_text("#status")
    assert second.evaluate("window.voiceAgent.errors[0].code") == "capacity"
    # no voice list without a TTS service: the page says so and keeps the default
    assert "Voice list unavailable" in first.inner_text("#log")


async def _cli_turns(url: str, turns: int) -> list[dict[str, float]]:
    """The same sentence through `voice-agent client`'s StreamClient, for comparison."""
    measured = []
    for _ in range(turns):
        async with StreamClient(url) as client:
            turn = client.new_turn()
            await client.speak(speak(SENTENCE, 24000), 24000)
            await client.silence_until("response.done", timeout_s=60)
        stopped = turn.time_of("speech.stopped")
        if turn.voice_to_voice_ms is not None and turn.first_audio_at and stopped:
            after = (turn.first_audio_at - stopped) * 1000
            measured.append(
                {"v2v_ms": round(turn.voice_to_voice_ms, 1), "after_turn_end_ms": round(after, 1)}
            )
    return measured


def _record(
    state: dict[str, Any], cleared: Any, closes: Any, cli: list[dict[str, float]], wall_s: float
) -> None:
    version = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True, check=False)
    turns = state["latencies"]
    v2v = [t["v2v_ms"] for t in turns if t["v2v_ms"] is not None]
    played = [t["v2v_played_ms"] for t in turns if t["v2v_played_ms"] is not None]
    result = {
        "test": "tests/e2e/test_browser.py::test_a_spoken_conversation_in_the_browser",
        "browser": version.stdout.strip(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "page_load_to_first_agent_audio_ms": state["pageToFirstAudioMs"],
        "voice_to_voice_ms": v2v,
        "voice_to_voice_p50_ms": float(np.median(v2v)) if v2v else None,
        "voice_to_voice_played_ms": played,
        "after_turn_end_ms": [t["after_turn_end_ms"] for t in turns if t["v2v_ms"] is not None],
        "cli_voice_to_voice_ms": [t["v2v_ms"] for t in cli],
        "cli_voice_to_voice_p50_ms": float(np.median([t["v2v_ms"] for t in cli])) if cli else None,
        "cli_after_turn_end_ms": [t["after_turn_end_ms"] for t in cli],
        "barge_in": cleared,
        "counters": state["counters"],
        "transcripts": state["transcripts"],
        "sample_rate": state["sampleRate"],
        "closes": closes,
        "wall_s": round(wall_s, 1),
        "notes": "voice_to_voice: the frame holding the end of speech (speech.stopped's "
        "audio_end_ms) sent -> the first agent audio frame received, as `voice-agent client` "
        "measures; _played: to the first sample out of the player worklet (60 ms jitter buffer). "
        "cli_voice_to_voice_ms: the same sentence from StreamClient (`voice-agent client`): "
        "its last frame sent -> first agent audio received. after_turn_end_ms: speech.stopped "
        "received -> first agent audio received (leaves out the end-of-turn wait, which the "
        "smart-turn policy sometimes stretches to its 2 s fallback on this sentence).",
    }
    (ARTIFACTS / "browser_test.json").write_text(json.dumps(result, indent=2) + "\n")
