"""Units of work and their results as they travel over Redis (ARCHITECTURE.md).

A job is a stream entry with two fields: `meta` (the JSON of one of these models)
and, where there is audio, `audio` (raw PCM16 bytes; never base64).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from services.common.audio.pcm import SampleRate
from services.common.tenancy import DEFAULT_TENANT


class BusMessage(BaseModel):
    """Base of every message on the bus."""

    model_config = ConfigDict(extra="ignore")

    job_id: str
    """Idempotency key: a reclaimed job repeats its job_id, and consumers drop repeats."""

    def dump(self) -> bytes:
        """The `meta` field of a stream entry."""
        return self.model_dump_json().encode()


class AsrJob(BusMessage):
    kind: Literal["asr.job"] = "asr.job"
    tenant: str = DEFAULT_TENANT
    """Whose job it is: the gateway authenticated the session, so workers need no check."""
    session_id: str
    utterance_id: str
    reply_to: str
    mode: Literal["final", "partial"] = "final"
    sample_rate: SampleRate = 16000
    source_rate: SampleRate | None = None
    """The rate the speech was captured at (the session's input rate: a phone's 8 kHz);
    `sample_rate` is the rate of the audio the job carries."""
    language: str | None = None
    enqueued_at: float = 0.0

    @property
    def captured_rate(self) -> int:
        """The rate the speech was captured at: `source_rate`, else the audio's own (audio
        sent at 8 kHz is telephone-band, whoever sent it)."""
        return self.source_rate or self.sample_rate

    def result(
        self,
        text: str,
        language: str | None = None,
        latency_ms: float = 0.0,
        last_word_logprob: float | None = None,
        avg_logprob: float | None = None,
    ) -> AsrResult:
        """This job's transcript, addressed back to its session and utterance."""
        return AsrResult(
            job_id=self.job_id,
            session_id=self.session_id,
            utterance_id=self.utterance_id,
            mode=self.mode,
            text=text,
            language=language,
            latency_ms=latency_ms,
            last_word_logprob=last_word_logprob,
            avg_logprob=avg_logprob,
        )

    def failed(self, code: str, message: str) -> JobFailed:
        """This job's failure, addressed back to its session and utterance."""
        return JobFailed(
            job_id=self.job_id,
            session_id=self.session_id,
            utterance_id=self.utterance_id,
            code=code,
            message=message,
        )


class TtsJob(BusMessage):
    kind: Literal["tts.job"] = "tts.job"
    tenant: str = DEFAULT_TENANT
    """Whose job it is (a library voice must be this tenant's)."""
    session_id: str
    response_id: str
    seq: int = Field(ge=0)
    text: str
    voice: str
    sample_rate: SampleRate
    reply_to: str
    speed: float = 1.0
    exaggeration: float | None = None
    cfg_weight: float | None = None
    temperature: float | None = None
    enqueued_at: float = 0.0
    continues: bool = False
    """The text stops inside a sentence (a reply's first chunk, cut at a comma or before
    "to", "with"...): the response's next job goes on with it, so it ends on a short pause,
    not a sentence's."""

    def chunk(self, index: int) -> TtsChunk:
        """The meta of this job's `index`-th audio chunk."""
        return TtsChunk(
            job_id=self.job_id,
            session_id=self.session_id,
            response_id=self.response_id,
            seq=self.seq,
            index=index,
            sample_rate=self.sample_rate,
        )

    def done(
        self, chunks: int, audio_ms: int, status: Literal["completed", "cancelled"]
    ) -> TtsDone:
        """This job's end: how many chunks and how much audio it sent."""
        return TtsDone(
            job_id=self.job_id,
            session_id=self.session_id,
            response_id=self.response_id,
            seq=self.seq,
            chunks=chunks,
            audio_ms=audio_ms,
            status=status,
        )

    def failed(self, code: str, message: str) -> JobFailed:
        """This job's failure, addressed back to its response chunk."""
        return JobFailed(
            job_id=self.job_id,
            session_id=self.session_id,
            response_id=self.response_id,
            seq=self.seq,
            code=code,
            message=message,
        )


class AsrResult(BusMessage):
    kind: Literal["asr.result"] = "asr.result"
    session_id: str
    utterance_id: str
    mode: Literal["final", "partial"] = "final"
    text: str
    language: str | None = None
    latency_ms: float = 0.0
    last_word_logprob: float | None = None
    """The ASR's log-probability of the text's last word (None: the engine does not say)."""
    avg_logprob: float | None = None
    """The ASR's mean log-probability of the text's tokens (None: the engine does not say)."""


class TtsChunk(BusMessage):
    """Meta of one audio chunk; the PCM16 itself is the entry's `audio` field."""

    kind: Literal["tts.chunk"] = "tts.chunk"
    session_id: str
    response_id: str
    seq: int
    index: int
    sample_rate: int


class TtsDone(BusMessage):
    kind: Literal["tts.done"] = "tts.done"
    session_id: str
    response_id: str
    seq: int
    chunks: int
    audio_ms: int
    status: Literal["completed", "cancelled"]


class JobFailed(BusMessage):
    kind: Literal["job.failed"] = "job.failed"
    session_id: str
    code: str
    message: str
    response_id: str | None = None
    utterance_id: str | None = None
    seq: int | None = None


BusResult = Annotated[AsrResult | TtsChunk | TtsDone | JobFailed, Field(discriminator="kind")]
RESULTS: TypeAdapter[BusResult] = TypeAdapter(BusResult)


def failure_of(meta: bytes, code: str, message: str) -> tuple[str, JobFailed] | None:
    """Where to tell a job's owner that it failed, and the `JobFailed` to tell it, read from
    the job's raw `meta` (which may not validate as its model: that can be why it failed).
    None when the meta does not say where its owner listens."""
    try:
        raw: Any = json.loads(meta)
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, dict):
        return None
    reply_to, job_id, session_id = raw.get("reply_to"), raw.get("job_id"), raw.get("session_id")
    if not (isinstance(reply_to, str) and isinstance(job_id, str) and isinstance(session_id, str)):
        return None

    def text(name: str) -> str | None:
        value = raw.get(name)
        return value if isinstance(value, str) else None

    seq = raw.get("seq")
    failed = JobFailed(
        job_id=job_id,
        session_id=session_id,
        code=code,
        message=message,
        response_id=text("response_id"),
        utterance_id=text("utterance_id"),
        seq=seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
    )
    return reply_to, failed
