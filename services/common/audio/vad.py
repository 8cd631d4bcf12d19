"""Silero VAD v6 (ONNX, the file shipped in faster-whisper's wheel) for many live streams.

The shipped graph reads its `input` rows, shape (N, 64 + 512), as N consecutive 32 ms
windows of ONE stream: its LSTM state `h`/`c` is fixed at (1, 1, 128). For many streams
at once we also build a second session from the same bytes in which the rows are N
independent streams, each with its own state (1, N, 128): the Transpose before the LSTM
swaps the time and batch axes and the state inputs get a free batch dimension. That
rewrite is checked against the shipped graph at load; if it does not apply, `batched`
is False and `process_many` runs one call per stream.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, Field

from services.common.errors import EngineUnavailable

Audio = npt.NDArray[np.float32]
SAMPLE_RATE = 16_000
WINDOW = 512
"""New samples per model call (32 ms at 16 kHz)."""
CONTEXT = 64
"""Samples of the previous window the model sees before each new window."""
_STATE_SHAPE = (1, 1, 128)
_log = logging.getLogger(__name__)
_LSTM_STATE_NAMES = (b"h", b"c", b"hn", b"cn")


class VadSettings(BaseModel):
    """Voice activity detection and end-of-turn decisions (times at 16 kHz)."""

    threshold: float = Field(default=0.5, gt=0.0, lt=1.0)
    """Speech probability at or above which speech starts."""
    neg_threshold: float | None = Field(default=None, gt=0.0, lt=1.0)
    """Speech continues while the probability stays at or above this; None = threshold - 0.15."""
    min_speech_ms: int = Field(default=250, ge=0, le=5_000)
    """Speech shorter than this is not a turn start."""
    min_silence_ms: int = Field(default=600, ge=32, le=10_000)
    """Silence that ends a turn."""
    pause_ms: int = Field(default=64, ge=32, le=10_000)
    """A shorter silence inside an utterance is reported as a pause (no less than
    `trailing_pad_ms`): a speculative transcript starts, and the reply prepared on it; a
    pause end-of-turn policy is asked (smart-turn first at
    `VA_GATEWAY__END_OF_TURN_FIRST_ASK_MS` of silence). 64 (two 32 ms windows) since
    smart-turn's least silence (`VA_GATEWAY__END_OF_TURN_MIN_SILENCE_MS`) decides when a
    turn may end: against 100 (the previous default), on 2 cores, echo voice-to-voice p50 /
    p95 333 / 389 against 374 / 448 ms, the openai agent's first text 68 ms sooner, and
    long requests cut at a comma as often (10 and 11 in both), for about one more wasted
    speculative transcript per turn (benchmarks/results/issue24_intel/; docs/turn-taking.md).
    Before the least silence, 64 ended 19 of 32 long requests at a comma, against 9."""
    speech_pad_ms: int = Field(default=200, ge=0, le=2_000)
    """Audio kept before the detected start of speech."""
    trailing_pad_ms: int = Field(default=64, ge=0, le=2_000)
    """Audio kept, at most, after the end of speech (what ASR hears past the last word);
    a pause is reported no sooner, so that the speculative transcript hears what the
    final would."""
    max_utterance_s: float = Field(default=30.0, ge=1.0, le=30.0)
    """An utterance this long is split (ASR jobs hold at most 30 s)."""
    model_path: Path | None = None
    """Silero VAD ONNX file; None = the one inside faster-whisper's wheel."""

    @property
    def effective_neg_threshold(self) -> float:
        """The threshold below which audio counts as silence."""
        if self.neg_threshold is not None:
            return min(self.neg_threshold, self.threshold)
        return max(self.threshold - 0.15, 0.01)


def default_model_path() -> Path:
    """Where faster-whisper's wheel keeps Silero VAD v6 (found without importing it)."""
    spec = importlib.util.find_spec("faster_whisper")
    if spec is None or not spec.submodule_search_locations:
        raise EngineUnavailable(
            "Silero VAD model not found: pip install faster-whisper (its wheel ships "
            "assets/silero_vad_v6.onnx), or set VA_VAD__MODEL_PATH"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "assets" / "silero_vad_v6.onnx"


class SileroVad:
    """One loaded Silero VAD model; thread-safe; serves any number of `VadStream`s."""

    def __init__(self, model_path: str | Path | None = None, *, batched: bool = True) -> None:
        path = Path(model_path) if model_path is not None else default_model_path()
        if not path.is_file():
            raise EngineUnavailable(
                f"Silero VAD model not found at {path}: pip install faster-whisper, "
                "or set VA_VAD__MODEL_PATH to an existing silero_vad_v6.onnx"
            )
        data = path.read_bytes()
        try:
            self._session = _session(data)
        except Exception as exc:  # onnxruntime's own error types: not a usable model
            raise EngineUnavailable(
                f"Silero VAD model at {path} could not be loaded ({exc}): set "
                "VA_VAD__MODEL_PATH to a silero_vad_v6.onnx"
            ) from exc
        self._batch_session: Any = None
        if batched:
            try:
                self._batch_session = _session(_batchable(data))
                self._check_batched()
            except Exception as exc:  # any mismatch: the per-stream path stays correct
                _log.warning("Silero VAD: no batched graph (%s); one call per stream", exc)
                self._batch_session = None

    @property
    def batched(self) -> bool:
        """Whether `process_many` runs all streams in one call per window."""
        return self._batch_session is not None

    def new_stream(self) -> VadStream:
        """A fresh stream (zero state) bound to this model."""
        return VadStream(self)

    def process_many(self, streams: Sequence[VadStream]) -> list[Audio]:
        """Run every stream's complete pending windows; one batched call per window depth.

        Returns, per stream, the speech probability of each window (often one, or none).
        """
        work = [s._take_windows() for s in streams]
        if self._batch_session is None:
            return [s._run(rows) for s, rows in zip(streams, work, strict=True)]
        probs: list[list[float]] = [[] for _ in streams]
        for depth in range(max((len(rows) for rows in work), default=0)):
            idx = [i for i, rows in enumerate(work) if len(rows) > depth]
            out, hn, cn = self._batch_session.run(
                None,
                {
                    "input": np.stack([work[i][depth] for i in idx]),
                    "h": np.concatenate([streams[i]._h for i in idx], axis=1),
                    "c": np.concatenate([streams[i]._c for i in idx], axis=1),
                },
            )
            for j, i in enumerate(idx):
                probs[i].append(float(out[j]))
                streams[i]._h, streams[i]._c = hn[:, j : j + 1].copy(), cn[:, j : j + 1].copy()
        return [np.asarray(p, dtype=np.float32) for p in probs]

    def _run_sequence(self, rows: Audio, h: Audio, c: Audio) -> tuple[Audio, Audio, Audio]:
        out, hn, cn = self._session.run(None, {"input": rows, "h": h, "c": c})
        return np.asarray(out, np.float32).reshape(-1), hn, cn

    def _check_batched(self) -> None:
        """The rewritten graph must give what the shipped one gives, stream by stream."""
        rng = np.random.default_rng(0)
        rows = (rng.standard_normal((3, CONTEXT + WINDOW)) * 0.1).astype(np.float32)
        h, c = (rng.standard_normal((2, 1, 3, 128)) * 0.3).astype(np.float32)
        out, hn, _ = self._batch_session.run(None, {"input": rows, "h": h, "c": c})
        for i in range(3):
            ref, ref_h, _ = self._run_sequence(rows[i : i + 1], h[:, i : i + 1], c[:, i : i + 1])
            if not (np.allclose(out[i], ref[0], atol=1e-5) and np.allclose(hn[:, i], ref_h[:, 0])):
                raise ValueError("batched Silero graph disagrees with the shipped one")


class VadStream:
    """One audio stream's VAD state: LSTM state, 64-sample context, samples not yet run."""

    def __init__(self, model: SileroVad) -> None:
        self._model = model
        self._pending = np.zeros(0, dtype=np.float32)
        self.samples_in = 0
        """Samples appended since the stream began (the audio timeline, never reset)."""
        self.reset()

    @property
    def pending_windows(self) -> int:
        """Complete 512-sample windows waiting for the model."""
        return len(self._pending) // WINDOW

    def append(self, samples_16k: npt.ArrayLike) -> None:
        """Queue audio (16 kHz float32 in [-1, 1]) without running the model."""
        samples = np.asarray(samples_16k, dtype=np.float32)
        if samples.ndim != 1:
            raise ValueError(f"expected mono 1-D audio, got shape {samples.shape}")
        self._pending = np.concatenate([self._pending, samples])
        self.samples_in += len(samples)

    def push(self, samples_16k: npt.ArrayLike) -> Audio:
        """Append audio and return the speech probability of each window it completed."""
        self.append(samples_16k)
        return self._run(self._take_windows())

    def reset(self) -> None:
        """Forget the model state; samples waiting for a full window stay (alignment)."""
        self._h = np.zeros(_STATE_SHAPE, dtype=np.float32)
        self._c = np.zeros(_STATE_SHAPE, dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)

    def _take_windows(self) -> Audio:
        """Consume complete windows as model rows: (k, 64 + 512), each with its context."""
        k = self.pending_windows
        if k == 0:
            return np.zeros((0, CONTEXT + WINDOW), dtype=np.float32)
        flat = np.concatenate([self._context, self._pending[: k * WINDOW]])
        self._pending = self._pending[k * WINDOW :]
        self._context = flat[-CONTEXT:]
        if k == 1:  # the usual case in a live stream: no window view needed
            return flat.reshape(1, CONTEXT + WINDOW)
        rows = np.lib.stride_tricks.sliding_window_view(flat, CONTEXT + WINDOW)[::WINDOW]
        return np.ascontiguousarray(rows)

    def _run(self, rows: Audio) -> Audio:
        if len(rows) == 0:
            return np.zeros(0, dtype=np.float32)
        probs, self._h, self._c = self._model._run_sequence(rows, self._h, self._c)
        return probs


def _session(model: bytes) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])


# ---- the graph rewrite, on the protobuf wire format (no `onnx` package needed) ----
# ONNX field numbers: Model.graph=7; Graph.node=1, input=11, output=12, value_info=13;
# Node.input=1, output=2, op_type=4, attribute=5; Attribute.name=1, ints=8;
# ValueInfo.name=1, type=2; Type.tensor_type=1; Tensor.shape=2; Shape.dim=1;
# Dimension.dim_value=1, dim_param=2.
_Msg = list[tuple[int, int, bytes]]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if byte < 0x80:
            return value, pos


def _enc(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _parse(buf: bytes) -> _Msg:
    fields: _Msg = []
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            end = _varint(buf, pos)[1]
        elif wire == 2:
            size, pos = _varint(buf, pos)
            end = pos + size
        elif wire in (1, 5):
            end = pos + (8 if wire == 1 else 4)
        else:
            raise ValueError(f"unexpected protobuf wire type {wire}")
        fields.append((number, wire, buf[pos:end]))
        pos = end
    return fields


def _dump(fields: _Msg) -> bytes:
    parts = []
    for number, wire, payload in fields:
        parts.append(_enc(number << 3 | wire) + (_enc(len(payload)) if wire == 2 else b""))
        parts.append(payload)
    return b"".join(parts)


def _get(msg: _Msg, number: int) -> list[bytes]:
    return [payload for n, _, payload in msg if n == number]


def _edit(msg: _Msg, number: int, fn: Any) -> _Msg:
    """Replace each length-delimited field `number` by fn(parsed) (None drops it)."""
    out: _Msg = []
    for n, wire, payload in msg:
        if n == number:
            new = fn(_parse(payload))
            if new is None:
                continue
            payload = _dump(new)
        out.append((n, wire, payload))
    return out


def _batchable(model: bytes) -> bytes:
    """Rewrite the shipped graph so that input rows are streams with per-row LSTM state."""
    graph = _parse(_get(_parse(model), 7)[0])
    nodes = [_parse(n) for n in _get(graph, 1)]
    lstm = [n for n in nodes if _get(n, 4) == [b"LSTM"]]
    if len(lstm) != 1:
        raise ValueError("expected exactly one LSTM node")
    lstm_input = _get(lstm[0], 1)[0]

    def fix_node(node: _Msg) -> _Msg:
        if _get(node, 4) != [b"Transpose"] or _get(node, 2) != [lstm_input]:
            return node
        return _edit(node, 5, fix_perm)

    def fix_perm(attr: _Msg) -> _Msg:
        ints = [_varint(v, 0)[0] for v in _get(attr, 8)]
        if _get(attr, 1) != [b"perm"] or ints != [0, 2, 1]:
            raise ValueError(f"unexpected Transpose before the LSTM: {ints}")
        return [f for f in attr if f[0] != 8] + [(8, 0, _enc(v)) for v in (2, 0, 1)]

    def fix_state(info: _Msg) -> _Msg:
        if _get(info, 1)[0] not in _LSTM_STATE_NAMES:
            return info
        return _edit(info, 2, lambda t: _edit(t, 1, lambda tt: _edit(tt, 2, fix_shape)))

    def fix_shape(shape: _Msg) -> _Msg:
        dims = _get(shape, 1)
        if len(dims) != 3:
            raise ValueError("LSTM state is not 3-D")
        out: _Msg = []
        for n, wire, payload in shape:
            is_batch = n == 1 and sum(f[0] == 1 for f in out) == 1
            out.append((1, 2, _dump([(2, 2, b"batch")])) if is_batch else (n, wire, payload))
        return out

    graph = _edit(graph, 1, fix_node)
    graph = _edit(_edit(graph, 11, fix_state), 12, fix_state)
    graph = [f for f in graph if f[0] != 13]  # intermediate shapes no longer hold
    return _dump([(n, w, _dump(graph) if n == 7 else p) for n, w, p in _parse(model)])
