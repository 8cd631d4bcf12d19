"""How late the VAD hears the end of speech at each input rate, by resampler: soxr's
stream resampler against the low-delay polyphase filter, on the same sentences.

    python -m benchmarks.input_resampling --out benchmarks/results/input_resampling.json

Each sentence (espeak-ng and Piper, made at 16 kHz and brought to the wire rate once,
offline, by soxr's best quality) is followed by 1.2 s of silence and fed to
the gateway's `Listener` in 20 ms frames, as a client streams it. The time of the first
`SpeechPause` on the wire's clock (input fed so far) is compared with the same sentence fed
at 16 kHz, where nothing is resampled: the difference is what the resampler holds back,
and it is added to every turn's answer. Also the CPU time per 20 ms frame.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import soxr

from benchmarks.voices import RATE, espeak, piper
from services.common.audio.listener import VAD_RATE, Listener
from services.common.audio.pcm import StreamResampler
from services.common.audio.polyphase import PolyphaseResampler
from services.common.audio.turns import SpeechPause
from services.common.audio.vad import SileroVad, VadSettings
from services.common.stats import summary
from services.loadtest.report import write

SENTENCES = (
    "what is the weather going to be like in paris tomorrow morning",
    "turn off the lights in the kitchen and lock the front door",
    "remind me to buy milk and bread on my way home tonight",
    "how many people live in the largest city of australia",
)
VOICES = {"espeak en-us 150 wpm": espeak("en-us", 150), "piper joe 1.0": piper(1.0)}
RESAMPLERS = {"soxr": StreamResampler, "polyphase": PolyphaseResampler}
FRAME_MS = 20


def pause_at_ms(vad: SileroVad, audio: np.ndarray, rate: int, resampler: str | None) -> float:
    """Wire time (ms of input fed) at which the listener reports the first pause: 20 ms
    frames through the resampler (none at 16 kHz) to the listener's VAD (`hear`)."""
    listener = Listener(vad, VadSettings(), VAD_RATE)
    convert = RESAMPLERS[resampler](rate, VAD_RATE).process if resampler else lambda a: a
    step = rate * FRAME_MS // 1000
    for i in range(0, audio.size, step):
        if any(isinstance(e, SpeechPause) for e in listener.hear(convert(audio[i : i + step]))):
            return (i + step) * 1000 / rate
    return float("nan")


def frame_cpu_us(rate: int, resampler: str, audio: np.ndarray) -> float:
    """CPU microseconds per 20 ms frame, the resampler alone."""
    step = rate * FRAME_MS // 1000
    converter = RESAMPLERS[resampler](rate, VAD_RATE)
    frames = [audio[i : i + step] for i in range(0, audio.size - step, step)]
    started = time.process_time()
    for frame in frames:
        converter.process(frame)
    return (time.process_time() - started) / len(frames) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", type=int, nargs="+", default=[8000, 24000, 48000])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    vad = SileroVad()
    tail = np.zeros(RATE * 6 // 5, np.float32)
    clips = {
        (voice, sentence): np.concatenate([np.zeros(RATE // 2, np.float32), say(sentence), tail])
        for voice, say in VOICES.items()
        for sentence in SENTENCES
    }
    reference = {key: pause_at_ms(vad, clip, RATE, None) for key, clip in clips.items()}
    rates: dict[str, Any] = {}
    for rate in args.rates:
        wire = {key: soxr.resample(clip, RATE, rate, "VHQ") for key, clip in clips.items()}
        rates[str(rate)] = {
            name: {
                "pause_later_than_16k_ms": summary(
                    [pause_at_ms(vad, wire[key], rate, name) - reference[key] for key in clips]
                ),
                "cpu_us_per_frame": round(frame_cpu_us(rate, name, next(iter(wire.values()))), 1),
            }
            for name in RESAMPLERS
        }
        print(rate, rates[str(rate)], flush=True)
    body = {
        "benchmark": "input_resampling",
        "frame_ms": FRAME_MS,
        "sentences": len(clips),
        "rates": rates,
    }
    if args.out:
        write(args.out, body)


if __name__ == "__main__":
    main()
