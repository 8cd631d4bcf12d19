"""Smart Turn v3.2: has the user finished their turn? An audio model asked at each pause.

The model (BSD-2-Clause, by the Pipecat team at Daily) ships in the `pipecat-ai` wheel; it
is located there, checked against the SHA-256 below and loaded with onnxruntime (the
package's own code is never imported). Input: the last 8 s of the utterance at 16 kHz
(zero-padded at the front), normalized to zero mean and unit variance, as Whisper's
80-bin log-Mel features, shape (N, 80, 800); output: the probability that the turn is
complete, one per row.

One model per process. Sessions that ask while the model is busy are answered together
by its next call, on the model's own thread (as the VAD's HearingBatcher does), so the
event loop never waits for an inference.
"""

from __future__ import annotations

import time
from functools import cache
from pathlib import Path
from typing import Final

import numpy as np

from services.common.audio.pcm import AudioF32
from services.common.batching import MicroBatcher
from services.common.errors import EngineUnavailable
from services.common.platform.packaged import PackagedModel
from services.gateway import metrics

SMART_TURN: Final = PackagedModel(
    name="smart-turn-v3.2",
    distribution="pipecat-ai",
    version="1.14.0",
    module="pipecat",
    folder="audio/turn/smart_turn/data",
    files={
        "smart-turn-v3.2-cpu.onnx": (
            "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"
        ),
    },
    licence="BSD-2-Clause (Pipecat, Daily)",
    source="Smart Turn v3.2 (pipecat-ai/smart-turn), the CPU ONNX export",
    extra="smart-turn",
    pull="smart-turn",
)
RATE: Final = 16000
WINDOW_S: Final = 8
FRAMES: Final = 800
"""Log-Mel frames of the 8 s window (hop 160)."""
_NORM_EPS: Final = 1e-7


class SmartTurnModel:
    """The loaded model and its feature extractor; `predict` blocks (run it off the loop)."""

    def __init__(self, threads: int = 1, models_dir: Path | None = None) -> None:
        import onnxruntime
        from faster_whisper.feature_extractor import FeatureExtractor

        path = SMART_TURN.verify(models_dir) / "smart-turn-v3.2-cpu.onnx"
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        try:
            self._session = onnxruntime.InferenceSession(
                str(path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own types
            raise EngineUnavailable(f"cannot load Smart Turn from {path}: {exc}") from exc
        self._features = FeatureExtractor(feature_size=80, sampling_rate=RATE, chunk_length=8)

    def features(self, audio: AudioF32) -> AudioF32:
        """(80, 800) log-Mel features of the last 8 s, zero-padded at the front."""
        window = RATE * WINDOW_S
        tail = np.asarray(audio[-window:], dtype=np.float32)
        padded = np.zeros(window, dtype=np.float32)
        padded[window - tail.size :] = tail
        normalized = (padded - padded.mean()) / np.sqrt(padded.var() + _NORM_EPS)
        mel = self._features(normalized.astype(np.float32), padding=0)
        features: AudioF32 = np.asarray(mel[:, :FRAMES], dtype=np.float32)
        return features

    def predict(self, clips: list[AudioF32]) -> list[float]:
        """The probability that each clip ends a complete turn."""
        batch = np.stack([self.features(clip) for clip in clips])
        (probabilities,) = self._session.run(None, {"input_features": batch})
        return [float(p) for p in np.asarray(probabilities).reshape(-1)]


@cache
def shared_model(threads: int = 1, models_dir: Path | None = None) -> SmartTurnModel:
    """The process's one model (loaded on first use; EngineUnavailable when it cannot be)."""
    return SmartTurnModel(threads, models_dir)


def available(models_dir: Path | None = None) -> bool:
    """Whether the pinned, unchanged model is there: pulled into `models_dir` (what `make
    run` does) or in the installed pipecat-ai wheel (the `smart-turn` extra)."""
    try:
        SMART_TURN.verify(models_dir)
    except EngineUnavailable:
        return False
    return True


class SmartTurnBatcher:
    """Answers every session that asked while the model was busy with one batched call
    (services/common/batching.py)."""

    def __init__(self, model: SmartTurnModel) -> None:
        self.model = model
        self._batcher: MicroBatcher[AudioF32, float] = MicroBatcher(self._timed, "smart-turn")

    async def probability(self, audio: AudioF32) -> float:
        return await self._batcher.submit(audio)

    def _timed(self, clips: list[AudioF32]) -> list[float]:
        started = time.perf_counter()
        found = self.model.predict(clips)
        metrics.TURN_MODEL_SECONDS.observe(time.perf_counter() - started)
        return found

    def close(self) -> None:
        self._batcher.close()
