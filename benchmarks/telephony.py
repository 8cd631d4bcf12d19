"""Phone audio against wideband audio: word error rate and voice-to-voice over G.711 mu-law
at 8 kHz, against PCM16 at 16 kHz, on the same sentences.

    python -m benchmarks.telephony --out benchmarks/results/telephony_lite.json

The lite stack as processes (`voice-agent up`'s layout: faster-whisper tiny.en, Piper,
Silero VAD, the echo agent). Each sentence, in each voice, is spoken four ways, one turn
on a fresh connection each, alternating so the machine's drift falls on all alike:
- `pcm16k`: `/v1/stream`, PCM16 at 16 kHz both ways (the reference);
- `pcm8k`: `/v1/stream`, PCM16 at 8 kHz both ways: the same speech resampled to 8 kHz, no
  companding (what the telephone band alone costs);
- `mulaw8k`: `/v1/stream` with `session.update` `input_format`/`output_format` `pcmu`: the
  same speech resampled to 8 kHz and mu-law coded (what a phone line carries), the agent's
  reply coming back in mu-law at 8 kHz;
- `twilio`: `/v1/twilio`, a simulated Twilio Media Stream (tests/twilio_call.py) with the
  same mu-law audio: voice-to-voice only (Twilio gets no transcript events).
A warm-up turn on each native path goes first, unmeasured. Speech goes out at real-time
pace in 20 ms frames, silence after it as a line sends; voice-to-voice = the end of the
speech sent -> the first agent audio received. WER is of `transcript.final` against the
script (jiwer, lower-cased words); `reply_recovered` is the
share of the transcript's words the ASR finds again in the agent's spoken reply, decoded
(how intelligible the reply stays through mu-law). Targets (issue 27): WER over mu-law
within 0.05 of the 16 kHz figure; voice-to-voice within 30 ms (paired per sentence).

    python -m benchmarks.telephony --offline --out benchmarks/results/telephony_asr_offline.json

runs the ASR alone on the same sentences (tiny.en in process): wideband, the 8 kHz band
alone, with mu-law, mu-law upsampled by soxr instead of the polyphase filter, and mu-law
as the ASR service hears a phone (its band folded: services/common/audio/bandwidth.py), to
say where a WER gap comes from.

    python -m benchmarks.telephony --offline --sets --out telephony_band_fold.json

the same on the three sets the band fold was chosen and judged on: a tuning set and two
held-out ones (`_sets`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jiwer
import numpy as np
import websockets

from benchmarks.stack import lite_stack
from benchmarks.voices import Voice, espeak, piper
from services.common.audio import g711
from services.common.audio.pcm import (
    float_to_pcm16,
    pcm16_to_float,
    resample,
    speech_end,
)
from services.common.stats import summary
from services.loadtest.corpus import SENTENCES
from services.loadtest.report import write
from services.loadtest.stats import words
from tests.speech import transcribed
from tests.twilio_call import TwilioCall

VOICES: dict[str, Voice] = {
    "espeak en-us 160 wpm": espeak("en-us", 160),
    "piper joe 1.0": piper(1.0),
}
PATHS = ("pcm16k", "pcm8k", "mulaw8k", "twilio")
NATIVE = ("pcm16k", "pcm8k", "mulaw8k")
FRAME_MS = 20
LEAD_S = 0.3
TAIL_S = 4.0  # more than the smart-turn policy's 2 s fallback
FORMATS: dict[str, dict[str, Any]] = {
    "pcm16k": {"input_sample_rate": 16000, "output_sample_rate": 16000},
    "pcm8k": {"input_sample_rate": 8000, "output_sample_rate": 8000},
    "mulaw8k": {"input_format": "pcmu", "output_format": "pcmu"},
}


def frames(audio16k: np.ndarray[Any, Any], path: str) -> tuple[list[bytes], int]:
    """The turn as the path's 20 ms frames (lead silence, speech, tail silence), and how
    many frames hold the speech up to its end."""
    rate = 16000 if path == "pcm16k" else 8000
    audio = audio16k if rate == 16000 else resample(audio16k, 16000, 8000)
    lead, tail = np.zeros(int(LEAD_S * rate), np.float32), np.zeros(int(TAIL_S * rate), np.float32)
    audio = np.concatenate([lead, audio, tail])
    pcm = float_to_pcm16(audio)
    data = g711.encode(pcm, "pcmu") if path == "mulaw8k" else pcm
    step = (len(data) // audio.size) * rate * FRAME_MS // 1000
    chunks = [data[i : i + step] for i in range(0, len(data), step)]
    spoken = -(-speech_end(audio) // (rate * FRAME_MS // 1000))
    return chunks, spoken


async def paced(send: Any, chunks: list[bytes], spoken: int, done: asyncio.Event) -> float:
    """Send the frames on the clock (stopping once `done`); when the speech's end went out."""
    start = time.monotonic()
    ended = start
    for i, chunk in enumerate(chunks):
        if done.is_set():
            break
        await send(chunk)
        if i + 1 == spoken:
            ended = time.monotonic()
        delay = start + (i + 1) * FRAME_MS / 1000 - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
    return ended


async def native_turn(url: str, path: str, audio16k: np.ndarray[Any, Any]) -> dict[str, Any]:
    chunks, spoken = frames(audio16k, path)
    async with websockets.connect(url, open_timeout=30, max_size=None) as ws:
        await ws.recv()  # session.created
        await ws.send(json.dumps({"type": "session.update", "session": FORMATS[path]}))
        while json.loads(await ws.recv())["type"] != "session.updated":
            pass
        done = asyncio.Event()
        seen: dict[str, Any] = {"audio": bytearray(), "audio_at": []}

        async def read() -> None:
            async for message in ws:
                now = time.monotonic()
                if isinstance(message, bytes):
                    seen["audio"] += message
                    seen["audio_at"].append(now)
                    continue
                event = json.loads(message)
                seen.setdefault(event["type"], event)
                if event["type"] == "response.done":
                    done.set()
                    return

        reader = asyncio.create_task(read())
        ended = await paced(ws.send, chunks, spoken, done)
        await asyncio.wait_for(reader, 30)
    first = next((t for t in seen["audio_at"] if t >= ended), None)
    reply = bytes(seen["audio"])
    if path == "mulaw8k":
        reply16k = _from_mulaw(reply)
    else:
        reply16k = resample(pcm16_to_float(reply), FORMATS[path]["output_sample_rate"], 16000)
    return {
        "transcript": seen.get("transcript.final", {}).get("text", ""),
        "voice_to_voice_ms": None if first is None else round((first - ended) * 1000, 1),
        "reply": reply16k,
    }


def _from_mulaw(data: bytes) -> np.ndarray[Any, Any]:
    return resample(pcm16_to_float(g711.decode(data, "pcmu")), 8000, 16000)


async def twilio_turn(url: str, audio16k: np.ndarray[Any, Any]) -> dict[str, Any]:
    audio = resample(audio16k, 16000, 8000)
    async with TwilioCall(url) as call:
        await asyncio.sleep(LEAD_S)  # the line's silence first
        await call.say(audio)
        ended = call.speech_ended_at or time.monotonic()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            media = call.heard.media_at
            if media and time.monotonic() - media[-1] > 1.5:
                break
            await asyncio.sleep(0.05)
        await call.stop()
    first = call.first_audio_after(ended)
    return {
        "voice_to_voice_ms": None if first is None else round((first - ended) * 1000, 1),
        "reply": _from_mulaw(bytes(call.heard.audio)),
    }


def wer(said: list[str], heard: list[str]) -> float:
    return round(float(jiwer.wer([words(s) for s in said], [words(h) for h in heard])), 4)


def recovered(reference: list[str], heard: list[str]) -> float:
    out = jiwer.process_words([words(r) for r in reference], [words(h) for h in heard])
    return round(out.hits / max(1, out.hits + out.substitutions + out.deletions), 4)


async def run(urls: dict[str, str], sentences: list[str]) -> list[dict[str, Any]]:
    ws = urls["gateway"].replace("http", "ws")
    warm = VOICES["espeak en-us 160 wpm"]("hello there")
    for path in NATIVE:  # first turns load what loads lazily: not measured
        await native_turn(f"{ws}/v1/stream", path, warm)
    rows = []
    for voice, say in VOICES.items():
        for sentence in sentences:
            audio = say(sentence)
            for path in PATHS:
                if path == "twilio":
                    row = await twilio_turn(f"{ws}/v1/twilio", audio)
                else:
                    row = await native_turn(f"{ws}/v1/stream", path, audio)
                row["reply_heard"] = await asyncio.to_thread(
                    transcribed, urls["asr"], row.pop("reply"), 16000
                )
                rows.append({"voice": voice, "sentence": sentence, "path": path, **row})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def codec_costs(frames_n: int = 2000) -> dict[str, Any]:
    """What the telephone path adds in process, per frame: mu-law 20 ms in -> PCM16, 8 ->
    16 kHz (plus the filter's group delay, the one delay it adds), and 40 ms out -> mu-law."""
    from services.common.audio.listener import to_vad_rate

    rng = np.random.default_rng(7)
    pcm_in = (rng.standard_normal(160) * 3000).astype("<i2").tobytes()
    pcm_out = (rng.standard_normal(320) * 3000).astype("<i2").tobytes()
    coded = g711.encode(pcm_in, "pcmu")
    resampler = to_vad_rate(8000)
    timings: dict[str, list[float]] = {"decode_20ms": [], "upsample_20ms": [], "encode_40ms": []}
    for _ in range(frames_n):
        t0 = time.perf_counter()
        pcm = g711.decode(coded, "pcmu")
        t1 = time.perf_counter()
        resampler.process(pcm16_to_float(pcm))
        t2 = time.perf_counter()
        g711.encode(pcm_out, "pcmu")
        t3 = time.perf_counter()
        timings["decode_20ms"].append(t1 - t0)
        timings["upsample_20ms"].append(t2 - t1)
        timings["encode_40ms"].append(t3 - t2)
    out: dict[str, Any] = {
        f"{name}_us": {
            "p50": round(statistics.median(v) * 1e6, 1),
            "p99": round(sorted(v)[int(0.99 * len(v))] * 1e6, 1),
        }
        for name, v in timings.items()
    }
    out["upsample_group_delay_ms"] = round(getattr(resampler, "delay_ms", 0.0), 2)
    return out


def _deltas(rows: list[dict[str, Any]], path: str, voice: str | None) -> list[float]:
    base = {
        (r["voice"], r["sentence"]): r["voice_to_voice_ms"] for r in rows if r["path"] == "pcm16k"
    }
    return [
        r["voice_to_voice_ms"] - base[(r["voice"], r["sentence"])]
        for r in rows
        if r["path"] == path
        and (voice is None or r["voice"] == voice)
        and r["voice_to_voice_ms"] is not None
        and base.get((r["voice"], r["sentence"])) is not None
    ]


def paired_delta(rows: list[dict[str, Any]], path: str) -> dict[str, Any]:
    """Voice-to-voice of `path` minus pcm16k's, sentence by sentence (same voice): all
    pairs, and each voice's median."""
    deltas = _deltas(rows, path, None)
    if not deltas:
        return {}
    by_voice = {v: _deltas(rows, path, v) for v in VOICES}
    return {
        "median_ms": round(statistics.median(deltas), 1),
        "mean_ms": round(statistics.fmean(deltas), 1),
        "pairs": len(deltas),
        "median_ms_by_voice": {v: round(statistics.median(d), 1) for v, d in by_voice.items() if d},
    }


def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_path = {p: [r for r in rows if r["path"] == p] for p in PATHS}
    out: dict[str, Any] = {}
    for path, found in by_path.items():
        v2v = [float(r["voice_to_voice_ms"]) for r in found if r["voice_to_voice_ms"] is not None]
        entry: dict[str, Any] = {"voice_to_voice_ms": summary(v2v), "turns": len(found)}
        if path != "twilio":
            entry["transcript_wer"] = wer(
                [r["sentence"] for r in found], [r["transcript"] for r in found]
            )
            entry["transcript_wer_by_voice"] = {
                voice: wer(
                    [r["sentence"] for r in found if r["voice"] == voice],
                    [r["transcript"] for r in found if r["voice"] == voice],
                )
                for voice in VOICES
            }
            entry["reply_recovered"] = recovered(
                [r["transcript"] for r in found], [r["reply_heard"] for r in found]
            )
        else:
            entry["reply_recovered_of_script"] = recovered(
                [r["sentence"] for r in found], [r["reply_heard"] for r in found]
            )
        out[path] = entry
    wer_gap = out["mulaw8k"]["transcript_wer"] - out["pcm16k"]["transcript_wer"]
    return {
        **out,
        "mulaw8k_minus_pcm16k": {
            "transcript_wer": round(wer_gap, 4),
            "voice_to_voice": paired_delta(rows, "mulaw8k"),
        },
        "pcm8k_minus_pcm16k": {
            "transcript_wer": round(
                out["pcm8k"]["transcript_wer"] - out["pcm16k"]["transcript_wer"], 4
            ),
            "voice_to_voice": paired_delta(rows, "pcm8k"),
        },
        "twilio_minus_pcm16k": {"voice_to_voice": paired_delta(rows, "twilio")},
        "targets": {"wer_gap_max": 0.05, "voice_to_voice_gap_max_ms": 30},
    }


def _upsampled(audio8k: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """8 -> 16 kHz as the gateway hears a phone: the streaming polyphase filter, 20 ms a time."""
    from services.common.audio.listener import to_vad_rate

    resampler = to_vad_rate(8000)
    step = 160
    parts = [resampler.process(audio8k[i : i + step]) for i in range(0, audio8k.size, step)]
    return np.concatenate([*parts, resampler.process(np.zeros(step, np.float32))])


def _mulaw(audio8k: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return pcm16_to_float(g711.decode(g711.encode(float_to_pcm16(audio8k), "pcmu"), "pcmu"))


OFFLINE: dict[str, tuple[Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]], int]] = {
    "pcm16k": (lambda a: a, 16000),
    "pcm8k_polyphase": (lambda a: _upsampled(resample(a, 16000, 8000)), 16000),
    "mulaw8k_polyphase": (lambda a: _upsampled(_mulaw(resample(a, 16000, 8000))), 16000),
    "mulaw8k_soxr": (lambda a: resample(_mulaw(resample(a, 16000, 8000)), 8000, 16000), 16000),
    # what the ASR service hears from a phone: the same audio, its job saying "8 kHz"
    "mulaw8k_folded": (lambda a: _upsampled(_mulaw(resample(a, 16000, 8000))), 8000),
}
"""The ASR alone (in process, no stack, no VAD): where a telephone WER gap comes from.
way -> (the audio the engine gets, the source rate its input says)."""


def _sets() -> dict[str, tuple[list[str], dict[str, Voice]]]:
    """The sets the band fold (services/common/audio/bandwidth.py) was chosen and judged on:
    `tuning` (its gain and band were chosen here), `benchmark` (this benchmark's sentences and
    voices, the issue's figure) and `held_out` (other sentences, other voices and rates);
    neither of the last two was looked at before the gain was fixed."""
    from benchmarks.turn_taking import HELD_OUT, LONG_HELD_OUT, SET, TUNING_MORE

    return {
        "tuning": ([s for s, *_ in SET + TUNING_MORE], VOICES),
        "benchmark": (list(SENTENCES), VOICES),
        "held_out": (
            [s for s, *_ in HELD_OUT] + LONG_HELD_OUT,
            {
                "espeak en-gb-x-rp 160 wpm": espeak("en-gb-x-rp", 160),
                "espeak en-us 190 wpm": espeak("en-us", 190),
                "piper joe 1.2": piper(1.2),
            },
        ),
    }


def offline(
    sentences: list[str],
    model: str = "tiny.en",
    beam: int = 1,
    voices: dict[str, Voice] = VOICES,
    fold: float = 0.5,
) -> dict[str, Any]:
    """Each sentence in each voice through `model` five ways: wideband; the 8 kHz band
    alone; mu-law too; mu-law upsampled by soxr instead of the polyphase filter; mu-law
    with its band folded (`fold`: the engine's `phone_band_fold`)."""
    from services.asr.engines.base import AsrInput
    from services.asr.engines.whisper import FasterWhisperEngine
    from services.asr.settings import WhisperSettings

    engine = FasterWhisperEngine(WhisperSettings(model=model, beam_size=beam, phone_band_fold=fold))
    engine.load()
    pad, tail = np.zeros(4800, np.float32), np.zeros(8000, np.float32)
    heard: dict[str, dict[str, list[str]]] = {way: {v: [] for v in voices} for way in OFFLINE}
    for voice, say in voices.items():
        for sentence in sentences:
            audio = say(sentence)
            items = [
                AsrInput(np.concatenate([pad, way(audio), tail]).astype(np.float32), "en", rate)
                for way, rate in OFFLINE.values()
            ]
            for way, out in zip(OFFLINE, engine.transcribe_batch(items), strict=True):
                heard[way][voice].append(out.text)
    return {
        way: {
            "wer": wer(sentences * len(voices), [t for v in voices for t in found[v]]),
            "wer_by_voice": {v: wer(sentences, found[v]) for v in voices},
        }
        for way, found in heard.items()
    }


def _gaps(heard: dict[str, Any]) -> dict[str, float]:
    """Each mu-law way's WER minus the wideband one."""
    wide = heard["pcm16k"]["wer"]
    return {
        f"{way}_minus_pcm16k": round(heard[way]["wer"] - wide, 4)
        for way in ("mulaw8k_polyphase", "mulaw8k_folded")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=len(SENTENCES))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--summarize", type=Path, help="recompute a results file's summary")
    parser.add_argument(
        "--offline", action="store_true", help="the ASR alone, in process (OFFLINE's four ways)"
    )
    parser.add_argument(
        "--model", default="tiny.en", help="--offline: the Whisper model (`base`: multilingual)"
    )
    parser.add_argument("--beam", type=int, default=1, help="--offline: the beam size (1: greedy)")
    parser.add_argument(
        "--sets",
        action="store_true",
        help="--offline: the tuning, benchmark and held-out sets of the band fold",
    )
    parser.add_argument(
        "--fold", type=float, default=0.5, help="--offline: the band fold's gain (0: off)"
    )
    args = parser.parse_args()
    sentences = list(SENTENCES[: args.sentences])
    if args.summarize:  # the summary again from a results file's turns (no new run)
        done = json.loads(args.summarize.read_text())
        done["summary"] = {**report(done["turns"]), "in_process": done["summary"]["in_process"]}
        args.summarize.write_text(json.dumps(done, indent=2) + "\n")
        print(json.dumps(done["summary"], indent=2))
        return
    if args.offline and args.sets:
        body = {"benchmark": "telephony_band_fold", "model": args.model, "fold": args.fold}
        for name, (said, voices) in _sets().items():
            heard = offline(said, args.model, args.beam, voices, args.fold)
            body[name] = {"sentences": len(said), "voices": list(voices), **heard, **_gaps(heard)}
        print(json.dumps(body, indent=2))
        if args.out:
            write(args.out, body)
        return
    if args.offline:
        heard = offline(sentences, args.model, args.beam, fold=args.fold)
        body = {
            "benchmark": "telephony_asr_offline",
            "model": args.model,
            "beam_size": args.beam,
            **heard,
            **_gaps(heard),
        }
        print(json.dumps(body, indent=2))
        if args.out:
            write(args.out, body)
        return
    with lite_stack() as urls:
        rows = asyncio.run(run(urls, sentences))
    result = {
        "benchmark": "telephony",
        "profile": "lite (faster-whisper tiny.en int8 + Piper joe + Silero VAD, echo agent)",
        "settings": {
            "end_of_turn": os.environ.get("VA_GATEWAY__END_OF_TURN", "auto"),
            "output_lead_ms": 200,
            "frame_ms": FRAME_MS,
            "input_8k_to_vad": "polyphase, 4 ms group delay",
        },
        "summary": {**report(rows), "in_process": codec_costs()},
        "turns": rows,
    }
    print(json.dumps(result["summary"], indent=2))
    if args.out:
        write(args.out, result)


if __name__ == "__main__":
    main()
