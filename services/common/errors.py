"""Domain exceptions, raised inside the services and mapped once at the edge.

Each error knows its wire `code` (docs/protocol.md), the WebSocket close code to use
when it is fatal, and the HTTP status for REST endpoints.
"""

from __future__ import annotations


class VoiceAgentError(Exception):
    """Base of every error that reaches a client."""

    code: str = "internal"
    http_status: int = 500
    close_code: int = 1011
    fatal: bool = False
    retry_after_s: float | None = None
    """When trying again may succeed, after how many seconds (capacity, a rate limit); sent
    as the `error` event's `retry_after_s` and a REST answer's Retry-After."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def body(self) -> dict[str, dict[str, str]]:
        """The JSON body of a REST error (OpenAI's shape, our code): every HTTP edge uses it."""
        return {"error": {"message": self.message, "type": self.code, "code": self.code}}


class InvalidMessage(VoiceAgentError):
    """A client message that is not valid JSON or not a known event."""

    code = "invalid_message"
    http_status = 400


class InvalidAudio(VoiceAgentError):
    """Audio that cannot be decoded or has the wrong shape."""

    code = "invalid_audio"
    http_status = 400


class UploadTooLarge(InvalidAudio):
    """An upload over its service's limit: HTTP 413, as OpenAI answers."""

    http_status = 413


class BodyTooLarge(InvalidMessage):
    """A request body (JSON) over its endpoint's limit: HTTP 413."""

    http_status = 413


class UnsupportedSampleRate(VoiceAgentError):
    """A sample rate outside the allowed set."""

    code = "unsupported_sample_rate"
    http_status = 400


class FrameTooBig(VoiceAgentError):
    """A WebSocket frame larger than the contract allows."""

    code = "invalid_audio"
    http_status = 413
    close_code = 1009
    fatal = True


class CapacityError(VoiceAgentError):
    """The service is at capacity; retry later."""

    code = "capacity"
    http_status = 503
    close_code = 1013
    fatal = True

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class InternalError(VoiceAgentError):
    """A failure that is not one of ours to describe (a bug): the client is told only its
    kind; the traceback stays in the log."""

    fatal = True

    @classmethod
    def of(cls, exc: BaseException) -> InternalError:
        return cls(f"internal error ({type(exc).__name__})")


class EngineUnavailable(VoiceAgentError):
    """A model or engine that is not loaded or cannot load. The message names the fix."""

    code = "internal"
    http_status = 503


class AsrUnavailable(VoiceAgentError):
    """No ASR worker answered in time."""

    code = "asr_unavailable"
    http_status = 503


class TtsUnavailable(VoiceAgentError):
    """No TTS worker answered in time."""

    code = "tts_unavailable"
    http_status = 503


class DuplexUnavailable(VoiceAgentError):
    """The full-duplex service behind the gateway cannot be reached, refused the gateway,
    or ended the session (close 1011: reconnect, with `?session_id=` to resume)."""

    code = "duplex_unavailable"
    http_status = 503
    fatal = True


class NotSupported(VoiceAgentError):
    """A request this session's backend does not do (the full-duplex model answers by
    itself: no `response.create`, no typed turns); the session goes on."""

    code = "not_supported"
    http_status = 400


class UnknownVoice(VoiceAgentError):
    """A voice name the TTS engine does not know."""

    code = "invalid_message"
    http_status = 400


class UnknownModel(VoiceAgentError):
    """A `model=` that this service does not serve (the message names those it does)."""

    code = "invalid_message"
    http_status = 400


class AgentFailed(VoiceAgentError):
    """The agent (LLM) failed or timed out; the session goes on."""

    code = "agent_failed"
    http_status = 502


class Unauthorized(VoiceAgentError):
    """No credential, or one that is malformed, wrong, expired or revoked (HTTP 401; on a
    WebSocket the handshake is refused with 401 before any session exists)."""

    code = "unauthorized"
    http_status = 401
    close_code = 1008
    fatal = True


class Forbidden(VoiceAgentError):
    """A valid credential that may not do this: another tenant's session, an Origin not
    allowed, a client token where an API key is needed (HTTP 403)."""

    code = "forbidden"
    http_status = 403
    close_code = 1008
    fatal = True


class RateLimited(VoiceAgentError):
    """A tenant over one of its rate limits (HTTP 429 with Retry-After; close 1008)."""

    code = "rate_limited"
    http_status = 429
    close_code = 1008
    fatal = True

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QuotaExceeded(RateLimited):
    """A tenant whose audio seconds for the day are used up (HTTP 429; close 1008)."""

    code = "quota_exceeded"
