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
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

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

T = TypeVar("T")


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


@contextmanager
def launch_chromium(wav: Path) -> Iterator[Any]:
    """Headless Chromium (a fresh temporary profile) with the wav as its microphone."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        chromium = driver.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[*FLAGS, f"--use-file-for-fake-audio-capture={wav}"],
        )
        try:
            yield chromium
        finally:
            chromium.close()


def new_context(chromium: Any, strict: bool = False) -> Any:
    """A fresh context (its own cookies, storage, cache). Not `strict`, it ignores the
    page's CSP, which lets wait_for_function evaluate strings; `strict` enforces it."""
    return chromium.new_context(viewport={"width": 900, "height": 900}, bypass_csp=not strict)


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Chromium for the module's tests (each gets its own context)."""
    with launch_chromium(_wav(tmp_path_factory.mktemp("mic") / "mic.wav")) as launched:
        yield launched


@pytest.fixture
def page(browser: Any) -> Any:
    return browser.new_page()


def wait_on(page: Any, condition: str, timeout_s: float = 30, arg: Any = None) -> Any:
    """`condition`'s first truthy value, evaluated every 50 ms (not on animation frames,
    which a page in the background barely gets)."""
    return page.wait_for_function(
        condition, arg=arg, timeout=timeout_s * 1000, polling=50
    ).json_value()


def in_a_thread(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` to its end beside Playwright's sync API, which holds this thread's
    event loop."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, coroutine).result()


def test_a_spoken_conversation_in_the_browser(lite_stack: Stack, page: Any) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    started = time.monotonic()
    page.goto(f"{lite_stack.gateway.http}/")
    # the voice picker lists the TTS service's voices (through the gateway)
    wait_on(page, "document.querySelectorAll('#voice option').length > 1", 20)
    # the agent picker lists the gateway's agents; without an LLM, echo is the default
    wait_on(page, "window.voiceAgent.agents !== null", 20)
    agents = page.eval_on_selector_all("#agent option", "options => options.map(o => o.value)")
    assert {"echo", "openai"} <= set(agents) and page.input_value("#agent") == "echo"
    assert "no LLM is configured" in page.inner_text("#log")
    page.click("#connect")
    wait_on(page, "window.voiceAgent.state === 'live'", 30)
    assert page.evaluate("window.voiceAgent.agent") == "echo"

    # the fake microphone's sentence comes back as a final transcript...
    heard = wait_on(
        page, "window.voiceAgent.transcripts.find(t => t.toLowerCase().includes('paris'))", 120
    )
    assert "weather" in heard.lower(), heard
    # ...and the agent's answer is played through the worklet
    wait_on(
        page, "window.voiceAgent.counters.playedSamples > 0.5 * window.voiceAgent.sampleRate", 90
    )
    wait_on(page, "window.voiceAgent.latencies.some(l => l.v2v_played_ms !== null)", 30)

    # barge-in: the agent tells a long story; the looping microphone speaks over it
    wait_on(
        page,
        "!window.voiceAgent.userSpeaking && !Object.values(window.voiceAgent.responses)"
        ".some(r => r.status === 'in_progress')",
        60,
    )
    clears = page.evaluate("window.voiceAgent.counters.clears")
    page.evaluate("text => window.voiceAgent.say(text)", LONG_REPLY)
    story = wait_on(
        page,
        "arg => Object.values(window.voiceAgent.responses)"
        ".find(r => r.text.startsWith(arg.slice(0, 20)))?.id",
        30,
        LONG_REPLY,
    )
    wait_on(page, "arg => window.voiceAgent.counters.clears > arg", 90, clears)
    wait_on(page, "window.voiceAgent.lastClear !== null", 10)  # the worklet's answer
    cleared = page.evaluate(
        "id => ({status: window.voiceAgent.responses[id].status,"
        " heard: window.voiceAgent.responses[id].heard, last: window.voiceAgent.lastClear})",
        story,
    )
    wait_on(page, "arg => window.voiceAgent.responses[arg].status === 'cancelled'", 30, story)
    heard_story = page.evaluate("id => window.voiceAgent.responses[id].heard", story)
    assert len(heard_story) < len(LONG_REPLY), heard_story
    # it was a barge-in (the user was speaking), and the player dropped its queue at once
    clear_log = page.evaluate("window.voiceAgent.clearLog")
    assert {"response_id": story, "during_speech": True} in clear_log, clear_log
    assert cleared["last"] is not None and cleared["last"]["dropped"] >= 0

    # the interrupting speech is a turn of its own: a second in-page voice-to-voice
    wait_on(page, "window.voiceAgent.latencies.filter(l => l.v2v_ms !== null).length >= 2", 60)
    state = page.evaluate(
        "({counters: window.voiceAgent.counters, latencies: window.voiceAgent.latencies,"
        " pageToFirstAudioMs: window.voiceAgent.pageToFirstAudioMs,"
        " transcripts: window.voiceAgent.transcripts, errors: window.voiceAgent.errors,"
        " sampleRate: window.voiceAgent.sampleRate})"
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "page.png"), full_page=True)
    page.click("#disconnect")
    wait_on(page, "window.voiceAgent.closes.length > 0", 10)
    closes = page.evaluate("window.voiceAgent.closes")
    cli = in_a_thread(_cli_turns(lite_stack.stream_url, 3))
    _record(state, cleared, closes, cli, time.monotonic() - started)

    assert closes[0]["code"] == 1000, closes
    assert not errors, errors
    assert not [e for e in state["errors"] if e.get("fatal")], state["errors"]


def test_a_token_rides_in_a_subprotocol_and_a_full_gateway_says_so(
    redis_server: RedisProc, chromium: Any, browser: Any
) -> None:
    """A real browser accepts the gateway's subprotocol answer (the token path of auth), and
    a refused session shows the capacity message (close 1013) instead of failing silently.
    Under its own CSP (connect-src 'self') the page still opens its WebSocket to its own
    host, and no other page may frame it."""
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
            _under_its_own_csp(chromium, gateway)


def _token_and_capacity(browser: Any, gateway: ServerThread) -> None:
    """The first page connects with its token; the second is refused (capacity 1)."""
    first = browser.new_page()
    first.goto(f"{gateway.http}/#token=t0k-123")
    assert first.input_value("#token") == "t0k-123"
    assert "t0k" not in first.url  # taken out of the address bar
    first.click("#connect")
    wait_on(first, "window.voiceAgent.state === 'live'", 30)
    # an LLM that answers makes `openai` the default; the picker switches the agent
    assert first.input_value("#agent") == "openai"
    assert first.evaluate("window.voiceAgent.agent") == "openai"
    first.select_option("#agent", "echo")
    wait_on(first, "window.voiceAgent.agent === 'echo'", 10)
    second = browser.new_page()
    second.goto(f"{gateway.http}/")
    second.click("#connect")
    wait_on(second, "window.voiceAgent.closes.length > 0", 30)
    closed = second.evaluate("window.voiceAgent.closes[0]")
    assert closed["code"] == 1013, closed
    assert "capacity" in second.inner_text("#status")
    assert second.evaluate("window.voiceAgent.errors[0].code") == "capacity"
    # no voice list without a TTS service: the page says so and keeps the default
    assert "Voice list unavailable" in first.inner_text("#log")
    first.bring_to_front()  # a page in the background gets few animation frames
    first.click("#disconnect")  # its seat, for the next page
    wait_on(first, "window.voiceAgent.closes.length > 0", 10)


def _under_its_own_csp(chromium: Any, gateway: ServerThread) -> None:
    """A context that enforces the page's CSP (wait_for_function cannot evaluate strings
    there: the waits are on the page's DOM)."""
    context = new_context(chromium, strict=True)
    try:
        page = context.new_page()
        violations: list[str] = []
        page.on(
            "console", lambda m: violations.append(m.text) if "Content Security" in m.text else None
        )
        page.goto(f"{gateway.http}/")
        page.click("#connect")
        page.wait_for_selector("#status.live", timeout=30_000)  # ws:// to its own host
        assert not violations, violations
        page.click("#disconnect")
        page.wait_for_selector("#status.idle", timeout=10_000)
        # another page frames it (with the microphone allowed): the browser refuses
        framing = context.new_page()
        framing.set_content(f'<iframe src="{gateway.http}/" allow="microphone"></iframe>')
        framed = [frame for frame in framing.frames if frame is not framing.main_frame]
        assert len(framed) == 1 and framed[0].query_selector("#connect") is None, framed[0].url
    finally:
        context.close()


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
        "measures; _played: to the first sample out of the player worklet (its jitter buffer: "
        "60 ms, or 1.5 of the largest frame, grown by underruns up to 300 ms). "
        "cli_voice_to_voice_ms: the same sentence from StreamClient (`voice-agent client`): "
        "its last frame sent -> first agent audio received. after_turn_end_ms: speech.stopped "
        "received -> first agent audio received (leaves out the end-of-turn wait, which the "
        "smart-turn policy sometimes stretches to its 2 s fallback on this sentence).",
    }
    (ARTIFACTS / "browser_test.json").write_text(json.dumps(result, indent=2) + "\n")


PLAYER_RUN = """source => {
  // worklet.js as the audio thread runs it (24 kHz, quanta of 128 samples), clocked here:
  // each chunk is handed to the player at its arrival time, between two quanta
  const made = {};
  const Processor = class { constructor() { this.port = { postMessage() {} }; } };
  new Function("AudioWorkletProcessor", "registerProcessor", "sampleRate", source)(
    Processor, (name, processor) => { made[name] = processor; }, 24000);
  const run = (chunkMs, arrivals) => {
    const player = new made["va-player"]({ processorOptions: { jitterMs: 60 } });
    const out = [[new Float32Array(128)]];
    let next = 0;
    for (let q = 0; (q * 128) / 24 <= arrivals[arrivals.length - 1] + 10; q++) {
      while (next < arrivals.length && arrivals[next] <= (q * 128) / 24) {
        player.onMessage({ type: "audio", pcm: new Int16Array(24 * chunkMs).buffer });
        next++;
      }
      player.process([], out);
    }
    return { underruns: player.underruns, prebufferMs: player.prebufferMs };
  };
  const times = (n, every, late = () => 0) =>
    Array.from({ length: n }, (_, k) => every * k + late(k));
  return {
    // a full-duplex model's 80 ms frames, each 0-40 ms late (a fixed spread)
    duplex: run(80, times(125, 80, (k) => (k * 37) % 41)),
    // the cascade's 40 ms frames, on time
    cascade: run(40, times(250, 40)),
    // 40 ms frames every 200 ms: a stream that cannot keep up, an underrun each time
    starved: run(40, times(100, 200)),
  };
}"""


def test_the_player_buffers_more_than_a_frame_and_grows_after_underruns_up_to_a_bound(
    browser: Any,
) -> None:
    """The player's jitter buffer (worklet.js, run with a simulated clock in the browser's
    JavaScript engine): 80 ms frames that arrive up to 40 ms late play without a gap (a
    60 ms buffer, shorter than one frame, ran dry on every late one); the cascade's 40 ms
    frames keep the 60 ms buffer; underruns grow it, never past 300 ms."""
    source = (
        Path(__file__).resolve().parents[2] / "services/gateway/static/worklet.js"
    ).read_text()
    page = browser.new_page()
    runs = page.evaluate(PLAYER_RUN, source)
    assert runs["duplex"] == {"underruns": 0, "prebufferMs": 120}, runs
    assert runs["cascade"] == {"underruns": 0, "prebufferMs": 60}, runs
    assert runs["starved"]["underruns"] > 10 and runs["starved"]["prebufferMs"] == 300, runs
