"""chatterbox's real backend on CPU with random weights: load, voices, streaming, cancel.

    .venv-tts/bin/python -m benchmarks.chatterbox_cpu_smoke \\
        --out benchmarks/results/tts_stream_chatterbox_cpu_random.json

Runs in the TTS environment (torch + chatterbox-tts, `make install-gpu`; CPU is enough)
and downloads nothing. It builds a chatterbox of real size with random weights
(`benchmarks.chatterbox_random`), then drives `ChatterboxEngine` through the real
factory (`load_backend` → `ChatterboxTTS.from_local` → `TorchBackend`, warm-up included):

1. load: device, sample rate, voices (`default` from conds.pt, two espeak clips);
2. stream one sentence: time to first audio, chunks, real-time factor;
3. two concurrent requests with different, not yet conditioned voices: each clip is
   conditioned once, the streams take turns token by token, each speaks with its own;
4. cancel mid-stream: not one token after the flag, no final rendering, the loop closed.

Random T3 weights almost never sample end-of-speech, so every request runs to
`--tokens` steps (steps that sample a non-speech id make no audio). The audio is noise;
the timings are those of the real model's compute at its real sizes. A failed check
is printed, recorded in the JSON, and makes the exit status 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import chatterbox_random
from services.loadtest.report import versions, write
from services.tts.engines.base import AudioF32, SpeechRequest
from services.tts.engines.chatterbox import ChatterboxEngine, load_backend
from services.tts.engines.chatterbox_backend import Sampling, SpeechBackend
from services.tts.settings import TOKEN_MS, ChatterboxSettings

SENTENCE = "Streaming speech starts playing long before the whole sentence is ready."
VOICES = {
    "alice": ("en-us+klatt2", "Alice reads the weather report for the coast every morning."),
    "bob": ("en-gb", "Bob tells a story about a lighthouse keeper and the sea at night."),
}
PACKAGES = ("torch", "torchaudio", "chatterbox-tts", "transformers", "diffusers", "numpy")


@dataclass
class Recorder:
    """The real backend, passed through; notes what the engine asks of it and when."""

    backend: SpeechBackend
    prepared: list[str] = field(default_factory=list)
    conds_of: dict[str, Any] = field(default_factory=dict)
    steps: list[tuple[str, float]] = field(default_factory=list)
    renders: list[tuple[str, int, bool, float]] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    speaking: dict[int, str] = field(default_factory=dict)
    """The text each thread is synthesizing (the engine renders in the consumer's thread)."""
    sample_rate: int = 0
    builtin_conds: Any = None

    def __post_init__(self) -> None:
        self.sample_rate = self.backend.sample_rate
        self.builtin_conds = self.backend.builtin_conds

    def prepare(self, clip: Path, exaggeration: float) -> Any:
        conds = self.backend.prepare(clip, exaggeration)
        self.prepared.append(clip.stem)
        return conds

    def tokens(self, conds: Any, text: str, sampling: Sampling) -> Iterator[int]:
        self.conds_of[text] = conds
        self.speaking[threading.get_ident()] = text
        try:
            for token in self.backend.tokens(conds, text, sampling):
                self.steps.append((text, time.perf_counter()))
                yield token
        finally:
            self.closed.append(text)

    def render(self, conds: Any, tokens: Sequence[int], final: bool) -> AudioF32:
        started = time.perf_counter()
        audio = self.backend.render(conds, tokens, final)
        text = self.speaking.get(threading.get_ident(), "?")
        self.renders.append((text, len(tokens), final, _since(started)))
        return audio

    def tokens_of(self, text: str) -> int:
        return sum(1 for spoken, _ in self.steps if spoken == text)


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 3)


class Checks:
    """Named pass/fail results; every failure is printed as it happens."""

    def __init__(self) -> None:
        self.results: dict[str, bool] = {}

    def __call__(self, name: str, passed: bool, detail: object = "") -> None:
        self.results[name] = bool(passed)
        print(f"{'ok  ' if passed else 'FAIL'} {name} {detail}", flush=True)

    @property
    def failed(self) -> list[str]:
        return [name for name, passed in self.results.items() if not passed]


def stream(engine: ChatterboxEngine, request: SpeechRequest) -> dict[str, Any]:
    """One synthesis, consumed as a client would: chunk sizes and arrival times."""
    started = time.perf_counter()
    arrivals: list[float] = []
    sizes: list[int] = []
    finite = True
    for chunk in engine.synthesize(request):
        arrivals.append(_since(started))
        sizes.append(int(chunk.size))
        finite = finite and bool(np.isfinite(chunk).all())
    wall = time.perf_counter() - started
    audio_s = sum(sizes) / engine.sample_rate
    return {
        "voice": request.voice,
        "chunks": len(sizes),
        "chunk_samples": sizes,
        "chunk_arrival_s": arrivals,
        "audio_s": round(audio_s, 3),
        "wall_s": round(wall, 2),
        "ttfa_ms": round(1000 * arrivals[0], 1) if arrivals else None,
        "rtf": round(wall / audio_s, 2) if audio_s else None,
        "finite": finite,
    }


def single(engine: ChatterboxEngine, recorder: Recorder, check: Checks) -> dict[str, Any]:
    result = stream(engine, SpeechRequest(text=SENTENCE, voice="default"))
    tokens = recorder.tokens_of(SENTENCE)
    per_token = engine.sample_rate * TOKEN_MS // 1000
    samples = sum(result["chunk_samples"])
    check("stream: several chunks", result["chunks"] >= 3, f"{result['chunks']} chunks")
    check("stream: 40 ms of audio per speech token", samples == tokens * per_token, samples)
    check("stream: audio is finite", result["finite"])
    steps = [at for text, at in recorder.steps if text == SENTENCE]
    gaps = np.diff(steps) if len(steps) > 1 else np.zeros(1)
    renders = [seconds for text, _, _, seconds in recorder.renders if text == SENTENCE]
    return {
        **result,
        "speech_tokens": tokens,
        "t3_step_ms_p50": round(1000 * float(np.median(gaps)), 1),
        "render_s": renders,
    }


def concurrent(engine: ChatterboxEngine, recorder: Recorder, check: Checks) -> dict[str, Any]:
    results: dict[str, dict[str, Any]] = {}
    start = threading.Barrier(len(VOICES))

    def run(voice: str) -> None:
        start.wait()
        results[voice] = stream(engine, SpeechRequest(text=VOICES[voice][1], voice=voice))

    threads = [threading.Thread(target=run, args=(voice,)) for voice in VOICES]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = _since(began)
    check("voices: each clip conditioned once", sorted(recorder.prepared) == sorted(VOICES))
    speakers = [recorder.conds_of[text].t3.speaker_emb for _, text in VOICES.values()]
    differ = bool((speakers[0] - speakers[1]).abs().max() > 0)
    check("voices: each stream speaks with its own conditioning", differ)
    longest = longest_run(recorder.steps, [text for _, text in VOICES.values()])
    check("voices: streams take turns token by token", longest <= 3, f"longest run {longest}")
    check("voices: audio is finite", all(r["finite"] for r in results.values()))
    return {"wall_s": wall, "longest_run_of_one_stream": longest, "streams": results}


def longest_run(steps: list[tuple[str, float]], texts: list[str]) -> int:
    """Most tokens in a row of one text while all `texts` were being spoken."""
    spans = [[at for spoken, at in steps if spoken == text] for text in texts]
    begin, end = max(span[0] for span in spans), min(span[-1] for span in spans)
    window = [spoken for spoken, at in steps if spoken in texts and begin <= at <= end]
    longest = run = 0
    for index, spoken in enumerate(window):
        run = run + 1 if index and window[index - 1] == spoken else 1
        longest = max(longest, run)
    return longest


def cancel(engine: ChatterboxEngine, recorder: Recorder, check: Checks) -> dict[str, Any]:
    text = "Alice was about to say something much longer, but she was interrupted."
    stop = threading.Event()
    prepared = len(recorder.prepared)
    chunks = engine.synthesize(SpeechRequest(text=text, voice="alice", should_stop=stop.is_set))
    next(chunks)
    stop.set()
    at_stop = recorder.tokens_of(text)
    stopped = time.perf_counter()
    rest = list(chunks)
    finals = [final for spoken, _, final, _ in recorder.renders if spoken == text and final]
    check("cancel: no token after the flag", recorder.tokens_of(text) == at_stop, at_stop)
    check("cancel: no audio and no final rendering after it", not rest and not finals)
    check("cancel: the token loop is closed", text in recorder.closed)
    check("cancel: the cached voice is not conditioned again", len(recorder.prepared) == prepared)
    return {"tokens_before_stop": at_stop, "stop_to_end_ms": round(1000 * _since(stopped), 1)}


def run(args: argparse.Namespace, folder: Path, voices_dir: Path) -> dict[str, Any]:
    import torch

    check = Checks()
    load_before = [round(x, 2) for x in os.getloadavg()]
    built: dict[str, Any] = {"reused": str(folder)}
    if not chatterbox_random.is_built(folder):
        print(f"building a random chatterbox in {folder} ...", flush=True)
        built = chatterbox_random.build(folder, args.seed)
    for voice, (espeak_voice, text) in VOICES.items():
        chatterbox_random.write_clip(voices_dir / f"{voice}.wav", text, espeak_voice)
    settings = ChatterboxSettings(model=str(folder), device="cpu", max_new_tokens=args.tokens)
    recorders: list[Recorder] = []

    def factory(found: Path | None, device: str, chosen: ChatterboxSettings) -> SpeechBackend:
        recorders.append(Recorder(load_backend(found, device, chosen)))
        return recorders[-1]

    engine = ChatterboxEngine(settings, voices_dir=voices_dir, backend_factory=factory)
    started = time.perf_counter()
    engine.load()
    load_s = _since(started)
    print(f"loaded in {load_s} s (warm-up included)", flush=True)
    check("load: on cpu at 24 kHz", (engine.device, engine.sample_rate) == ("cpu", 24000))
    check("load: voices", engine.voices() == ["alice", "bob", "default"], engine.voices())
    recorder = recorders[0]
    body = {
        "benchmark": "chatterbox_cpu_smoke",
        "weights": "RANDOM (not a trained model: the audio is noise), real sizes",
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "python": sys.executable,
        "load_average_at_start": load_before,
        "model": built,
        "settings": settings.model_dump(mode="json"),
        "versions": versions(*PACKAGES),
        "load_s": load_s,
        "stream": single(engine, recorder, check),
        "concurrent": concurrent(engine, recorder, check),
        "cancel": cancel(engine, recorder, check),
        "render_s_mean": round(statistics.fmean(r[3] for r in recorder.renders), 2),
    }
    return {**body, "checks": check.results, "failed": check.failed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=40, help="T3 steps per request")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--model-dir", type=Path, help="build (or reuse) the model here")
    parser.add_argument("--out", type=Path, help="where to write the JSON results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chatterbox-smoke-") as workdir:
        folder = args.model_dir or Path(workdir) / "chatterbox-random"
        body = run(args, folder, Path(workdir) / "voices")
    stream_ = body["stream"]
    print(
        f"first audio {stream_['ttfa_ms']} ms, RTF {stream_['rtf']}, "
        f"T3 step {stream_['t3_step_ms_p50']} ms, S3Gen render {body['render_s_mean']} s"
    )
    if args.out:
        write(args.out, body)
    if body["failed"]:
        sys.exit(f"failed: {', '.join(body['failed'])}")


if __name__ == "__main__":
    main()
