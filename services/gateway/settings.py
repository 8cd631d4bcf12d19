"""Settings of the gateway."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from services.common.audio.vad import VadSettings
from services.common.service.profiles import with_defaults
from services.common.service.settings import BaseServiceSettings, ServerSettings
from services.gateway.admission import AdmissionSettings
from services.gateway.llm import LlmSettings

END_OF_TURN_POLICIES = ("auto", "smart-turn", "silence", "heuristic")
"""The end-of-turn policies built in (services/gateway/turn_end.py), `auto` included."""


class TwilioSettings(BaseModel):
    """`/v1/twilio`: Twilio Media Streams (docs/telephony.md)."""

    token_parameter: str = Field(default="token", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """The `<Parameter>` of the `<Stream>` (Twilio's `customParameters`) that carries the
    client token or API key when authentication is on (Twilio sends no headers)."""
    auth_token: SecretStr | None = Field(default=None, min_length=1)
    """The Twilio auth token of the account that owns the number: set, every upgrade of
    `/v1/twilio` must carry Twilio's `X-Twilio-Signature` of `public_url`, or it is refused
    with HTTP 403 before any socket is accepted. Recommended wherever the gateway can be
    reached from the internet."""
    public_url: str | None = Field(
        default=None, pattern=r"^wss://[^\s/?#@]+/[^\s?#]*$", max_length=2048
    )
    """The address Twilio connects to, as the `<Stream url>` of your TwiML writes it
    (`wss://voice.example.com/v1/twilio`): what Twilio signs. Needed with `auth_token`; never
    taken from the request's Host or X-Forwarded-* headers."""
    start_timeout_s: float = Field(default=5.0, ge=0.5, le=120)
    """A stream that has not sent `start` after this long is closed (Twilio sends it right
    after the upgrade)."""
    max_unverified: int = Field(default=16, ge=1, le=10_000)
    """Streams whose credential comes in their `start` (authentication on, none at the
    upgrade), not yet started: at most this many at once, and none of them holds a seat of
    `VA_GATEWAY__MAX_SESSIONS` until its credential has passed (an anonymous socket must
    not take a caller's place)."""
    max_unverified_per_address: int = Field(default=4, ge=1, le=10_000)
    """Of those, at most this many from one peer address (an IPv6 address's /64), as the
    server sees it, unless the upgrade carries Twilio's signature (`auth_token`): one host
    cannot fill `max_unverified`."""

    @model_validator(mode="after")
    def _signed_against_a_url(self) -> TwilioSettings:
        if self.auth_token is not None and self.public_url is None:
            raise ValueError(
                "VA_GATEWAY__TWILIO__AUTH_TOKEN needs VA_GATEWAY__TWILIO__PUBLIC_URL: the "
                "wss:// address of your TwiML's <Stream url>, which Twilio signs"
            )
        return self


class GatewaySection(BaseModel):
    """The gateway proper."""

    server: ServerSettings = ServerSettings(port=8000)
    """Where the gateway listens."""
    gateway_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    """This process's id on the bus (results come back to it); random when unset."""
    backend: Literal["cascade", "duplex"] = "cascade"
    """What answers `/v1/stream` and `/v1/realtime`: `cascade` (the gateway's VAD and turns,
    ASR, the agent and TTS through Redis) or `duplex` (the full-duplex service at
    `duplex_url`, one connection per session; docs/duplex.md). The `duplex` profile sets it."""
    duplex_url: str = Field(
        default="ws://127.0.0.1:8003", pattern=r"^wss?://[^\s/?#]+(/[^\s?#]*)?$", max_length=2048
    )
    """The duplex service's WebSocket address (`backend: duplex`); sessions connect to
    `<duplex_url>/v1/stream/duplex`."""
    duplex_open_timeout_s: float = Field(default=10.0, ge=0.5, le=300)
    """A duplex service that has not admitted a session after this long is unavailable."""
    duplex_history_interval_s: float = Field(default=5.0, ge=0.5, le=3600)
    """A duplex session's agent text so far is saved this often (for resume)."""
    duplex_stall_timeout_s: float = Field(default=2.0, ge=0.2, le=300)
    """A duplex service that has answered nothing for this long while the session's audio
    went to it (it answers every 80 ms) is frozen: the session ends (`duplex_unavailable`)."""
    max_sessions: int = Field(default=200, ge=1, le=100_000)
    """Sessions this process admits at most, a phone call waiting for its stream's start
    included (`/health` `admitted`); more are refused with close 1013 and a retry hint (the
    hard cap: `admission` refuses sooner when voice-to-voice says so)."""
    admission: AdmissionSettings = AdmissionSettings()
    """Admission by measured voice-to-voice (docs/capacity.md#admission)."""
    default_voice: str = "default"
    """Voice of new sessions."""
    default_agent: str | None = Field(default=None, min_length=1, max_length=64)
    """Agent of new sessions. Unset: `openai` when an LLM is configured (`VA_LLM__BASE_URL`,
    `OPENAI_BASE_URL` or `OPENAI_API_KEY`) and answers at start-up, else `echo` (the log and
    `session.created`'s `notice` say why)."""
    agents: str = Field(default="", max_length=4096, pattern=r"^[A-Za-z0-9_.:/, -]*$")
    """More agents, as comma-separated `package.module:factory` or `path/to/file.py:factory`
    entries (each factory gets an `AgentContext` and returns an agent; its `name` is what
    sessions pick), e.g. `examples/tools_agent.py:create`."""
    default_language: str | None = "en"
    """Language of new sessions (None: let the ASR engine detect it)."""
    output_frame_ms: int = Field(default=40, ge=10, le=500)
    """Size of the agent audio frames sent to the client."""
    output_lead_ms: int = Field(default=200, ge=0, le=5000)
    """How far ahead of real time agent audio is sent (the client's buffer)."""
    twilio: TwilioSettings = TwilioSettings()
    """Phone calls through Twilio Media Streams (`/v1/twilio`)."""
    asr_timeout_s: float = Field(default=15.0, ge=0.5, le=300)
    """An utterance without a transcript after this long is reported `asr_unavailable`."""
    tts_timeout_s: float = Field(default=15.0, ge=0.5, le=300)
    """A response whose TTS has not answered a piece of its text for this long fails with
    `tts_unavailable` (counted only while a piece sent to TTS waits for its audio: an agent
    slow to say more is bounded by its own timeouts, e.g. `VA_LLM__*`)."""
    agent_idle_timeout_s: float = Field(default=60.0, ge=1, le=3600)
    """A response whose agent has said nothing more for this long, with no audio owed by
    TTS, fails with `agent_failed` (what was said stays): the last bound on an agent that
    stalls without ending (the `openai` agent's own, `VA_LLM__*_TIMEOUT_S`, come first)."""
    first_chunk_words: int = Field(default=6, ge=1, le=100)
    """The first text chunk sent to TTS is cut at a clause once it has this many words."""
    first_chunk_phrase: bool = True
    """English replies: the first text chunk may also be cut before a word that starts a
    phrase ("to", "with", "and"...) once `first_chunk_words` words precede it, so the first
    audio does not wait for the end of a long sentence with no comma."""
    partial_interval_ms: int = Field(default=600, ge=0, le=10_000)
    """While the user speaks, a partial transcript is asked for this often (0: never), in
    sessions that show partials."""
    partials: bool = False
    """Whether a session sends `transcript.partial` unless it says otherwise (`session.update`
    `partials`): each partial is one more ASR pass over the utterance so far, about half of
    a turn's ASR work, and only a client that shows live captions needs them."""
    end_of_turn: str = Field(default="auto", min_length=1, max_length=200)
    """End-of-turn policy: `smart-turn` (an audio model asked at each pause), `silence`
    (the VAD's silence alone), `heuristic` (hold on after a trailing "and", "um",
    "the"...), `auto` (smart-turn when its model is installed, else silence) or
    `package.module:factory` for your own."""

    @field_validator("end_of_turn")
    @classmethod
    def _a_policy(cls, value: str) -> str:
        if value not in END_OF_TURN_POLICIES and ":" not in value:
            choices = ", ".join(END_OF_TURN_POLICIES)
            raise ValueError(
                f"unknown end-of-turn policy {value!r}; choose {choices} or module:factory"
            )
        return value

    cut_off_join_ms: int = Field(default=1000, ge=0, le=10_000)
    """A user who speaks again within this long of the end of their speech, while the
    answer to it has not played to its end (interrupted, or not yet heard), was cut off
    at a pause: the answer is dropped from the history with what was heard of it, and the
    two parts are one user turn, answered whole (0: never; the time includes the VAD's
    ~100-250 ms to hear that speech began)."""
    end_of_turn_hold_ms: int = Field(default=700, ge=0, le=10_000)
    """How long the `heuristic` policy waits for the user to go on."""
    end_of_turn_fallback_ms: int = Field(default=2000, ge=100, le=10_000)
    """`smart-turn`: silence that ends the turn even when the model says it is not over,
    and the wait of a turn whose transcript ends mid-thought or adds no words since the
    previous pause."""
    end_of_turn_unsure_ms: int = Field(default=300, ge=0, le=10_000)
    """`smart-turn`: silence that ends a turn the model calls incomplete when its transcript
    looks finished (the model alone misses some finished sentences: "So, uh, I was
    wondering if you could help me with my order." → 0.01); past it the model is not asked.
    Chosen on the tuning part of the labelled set (docs/turn-taking.md): longer waits
    answered no fewer fragments followed by a 1 s pause, and cost p95. Decided at the asks
    (the pause, then every `end_of_turn_recheck_ms`): keep it on that grid (100 ms + k ×
    200 ms by default)."""
    end_of_turn_doubt_ms: int = Field(default=1300, ge=0, le=10_000)
    """`smart-turn`: silence that ends a turn whose words the ASR doubts (below
    `end_of_turn_transcript_logprob` or `end_of_turn_last_word_logprob`, both unset by
    default), whatever the model says: long enough for a speaker to go on after a misheard
    fragment, shorter than the fallback for a finished sentence heard badly. On the asks'
    grid."""
    end_of_turn_transcript_logprob: float | None = Field(default=None, ge=-100.0, le=0.0)
    """`smart-turn`: a transcript the ASR scores below this mean token log-probability
    (Whisper's avg_logprob) is doubted: the turn waits for `end_of_turn_doubt_ms`,
    whatever the model says (tiny.en mishears fragments into words that look finished:
    "Please remind me to" → "Please remind me", −0.53 to −0.57). Unset (the default): off.
    On voices tiny.en hears badly it doubts finished sentences as often as fragments:
    on the held-out part of the labelled set, −0.6 made 18 % of complete turns wait
    (docs/turn-taking.md)."""
    end_of_turn_last_word_logprob: float | None = Field(default=None, ge=-100.0, le=0.0)
    """`smart-turn`: a transcript whose last word the ASR scores below this log-probability
    is doubted likewise ("...a recipe for a" → "...a recipe for it.", −0.96). Needs an
    ASR that scores it (`VA_ASR__WHISPER__LAST_WORD_CONFIDENCE`, on by default).
    Unset (the default): off; no threshold helped on the tuning part."""
    end_of_turn_no_new_words: bool = False
    """`smart-turn`: a pause whose transcript adds no words to the previous pause's
    (fillers aside: "Can you tell me, um," heard as "Can you tell me?" at both) waits for
    the fallback. Off: it caught fillers the ASR dropped in the tuning part of the labelled
    set, none in the held-out part (docs/turn-taking.md)."""
    end_of_turn_first_ask_ms: int = Field(default=100, ge=0, le=10_000)
    """`smart-turn`: silence before the model is first asked; at or below `VA_VAD__PAUSE_MS`
    it is asked at the pause itself, beside the speculative transcript (it answers before
    the transcript is in, so the turn ends as soon as the words are known). Asked after
    100 ms it calls 2 of 20 finished sentences unfinished that it gets right at 200 ms;
    the recheck catches them (docs/turn-taking.md)."""
    end_of_turn_recheck_ms: int = Field(default=200, ge=32, le=10_000)
    """`smart-turn`: while the pause goes on, the model is asked again this often."""
    end_of_turn_min_silence_ms: int = Field(default=250, ge=0, le=10_000)
    """`smart-turn` (and any policy asked at pauses): the least silence that ends a turn,
    however soon the model and the words agree (0: as soon as they do); a client that
    stops streaming inside it is answered once it has passed on the clock. The decision
    waits for the pause's transcript, so without it a faster ASR (a faster CPU,
    a shorter `VA_VAD__PAUSE_MS`, one CTranslate2 thread) would also end turns sooner at pauses
    inside sentences; 250 ms is where the held-out
    figures of docs/turn-taking.md were measured (the words in at 250 ms of silence). On a
    2-core machine that transcribes in ~80 ms, long requests with commas were answered at
    a comma 12 times in 32 with it, 19 without (held-out: 12 and 16 of 24), for 16-22 ms
    at p50."""
    smart_turn_threshold: float = Field(default=0.5, gt=0.0, lt=1.0)
    """`smart-turn`: the model's probability at or above which the turn is complete."""
    smart_turn_threads: int = Field(default=1, ge=0, le=64)
    """`smart-turn`: onnxruntime threads of the one model per process (0: every core)."""
    models_dir: Path = Path("models")
    """Where pulled models live: Smart Turn in `<models_dir>/smart-turn-v3.2` (`make run`
    extracts it there: `voice-agent models pull smart-turn`), else the `smart-turn` extra's
    pipecat-ai wheel."""
    speculative_asr: bool = True
    """Send the utterance to the ASR at each pause and keep that transcript if the turn
    then ends with no more speech (the transcript is ready sooner); otherwise it is
    dropped (`va_gateway_speculative_asr_total{outcome="wasted"}`)."""
    prepare_replies: bool = True
    """When a pause's speculative transcript arrives, start the agent and the first TTS
    pieces on it, holding everything back: if the turn ends at that pause the reply plays
    at once, if the user goes on it is discarded unseen (agents that are not safe to run
    early, such as ones with side-effecting tools, are never prepared)."""
    barge_in_min_ms: int = Field(default=300, ge=0, le=5000)
    """User speech must last this long during agent audio to interrupt it (a cough does not)."""
    resume_window_s: int = Field(default=300, ge=10, le=86_400)
    """A closed session's settings and history stay this long for `?session_id=` resume."""
    history_max_turns: int = Field(default=200, ge=2, le=10_000)
    """The turns a session keeps (in memory and in Redis for resume); older ones are
    dropped. The LLM is sent the last `VA_LLM__HISTORY_TURNS` of them."""
    batch_vad: bool = True
    """Run the VAD of all sessions that sent audio in the same event-loop turn in one model
    call (less CPU per session at scale; no added wait)."""
    inbox_size: int = Field(default=1024, ge=16, le=100_000)
    """Bus results buffered per session before it counts as stuck."""
    tts_url: str | None = Field(default="http://127.0.0.1:8002", max_length=2048)
    """The TTS service's HTTP address: `GET /v1/voices` on the gateway (the browser page's
    voice picker) is answered from its `/v1/voices`. None: the gateway lists no voices."""
    web_client: bool = True
    """Serve the browser client at `/` (a static page; it talks to `/v1/stream`)."""


class OpenAiEnvironment(PydanticBaseSettingsSource):
    """`OPENAI_BASE_URL` and `OPENAI_API_KEY`, as the LLM's URL and key when `VA_LLM__BASE_URL`
    and `VA_LLM__API_KEY` are unset (the names every OpenAI client reads)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        llm = {
            name: os.environ[variable]
            for name, variable in (("base_url", "OPENAI_BASE_URL"), ("api_key", "OPENAI_API_KEY"))
            if os.environ.get(variable)
        }
        return {"llm": llm} if llm else {}


class GatewaySettings(BaseServiceSettings):
    """All settings of the gateway (env: `VA_GATEWAY__...`, `VA_VAD__...`, `VA_REDIS__...`)."""

    gateway: GatewaySection = GatewaySection()
    """The gateway."""
    vad: VadSettings = VadSettings()
    """Voice activity detection and end-of-turn."""
    llm: LlmSettings = LlmSettings()
    """The OpenAI-compatible chat model of the `openai` agent."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        openai_env = OpenAiEnvironment(settings_cls)
        return init_settings, env_settings, openai_env, dotenv_settings, file_secret_settings

    def agent_plugins(self) -> list[str]:
        """`gateway.agents` as a list of `module:factory` entries."""
        return [spec.strip() for spec in self.gateway.agents.split(",") if spec.strip()]

    @model_validator(mode="after")
    def _apply_profile(self) -> GatewaySettings:
        """`duplex`: sessions answered by the full-duplex service, unless set explicitly."""
        if self.profile == "duplex":
            self.gateway = with_defaults(self.gateway, {"backend": "duplex"})
        return self
