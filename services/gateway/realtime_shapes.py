"""The JSON shapes `/v1/realtime` sends: OpenAI's session (GA's, or beta's flat one), items,
responses, content references and errors. Pure functions of their inputs."""

from __future__ import annotations

import uuid
from typing import Any

from services.common.audio.vad import VadSettings
from services.common.protocol.events import SessionConfig

MODEL = "voice-agent"
"""What a Realtime client may send as `model` to keep the gateway's default agent."""
TRANSCRIPTION_MODEL = "whisper-1"


def _turn_detection(config: SessionConfig, vad: VadSettings) -> dict[str, Any] | None:
    turns = config.turn_detection
    if turns is not None and turns.type == "manual":
        return None
    threshold = turns.threshold if turns and turns.threshold is not None else vad.threshold
    silence = turns.silence_ms if turns and turns.silence_ms is not None else vad.min_silence_ms
    padding = (
        turns.prefix_padding_ms
        if turns and turns.prefix_padding_ms is not None
        else vad.speech_pad_ms
    )
    return {
        "type": "server_vad",
        "threshold": threshold,
        "prefix_padding_ms": padding,
        "silence_duration_ms": silence,
        "create_response": True,
        "interrupt_response": True,
        "idle_timeout_ms": None,
    }


def _tool_choice(config: SessionConfig) -> Any:
    choice = config.tool_choice or "auto"
    return choice if isinstance(choice, str) else choice.model_dump()


_GA_FORMATS = {"pcm16": "audio/pcm", "pcmu": "audio/pcmu", "pcma": "audio/pcma"}
_BETA_FORMATS = {"pcm16": "pcm16", "pcmu": "g711_ulaw", "pcma": "g711_alaw"}


def _format(coding: str, rate: int) -> dict[str, Any]:
    """GA's format object: PCM with its rate; G.711 (8 kHz only) without one."""
    kind = _GA_FORMATS[coding]
    return {"type": kind, "rate": rate} if coding == "pcm16" else {"type": kind}


def session_object(config: SessionConfig, vad: VadSettings, beta: bool) -> dict[str, Any]:
    """The session as OpenAI's clients read it, from the native session settings."""
    transcription = {"model": TRANSCRIPTION_MODEL, "language": config.language, "prompt": ""}
    common: dict[str, Any] = {
        "id": config.id,
        "object": "realtime.session",
        "model": config.agent,
        "instructions": config.instructions or "",
        "tools": [
            {"type": "function", **tool.model_dump(exclude={"type"})} for tool in config.tools or []
        ],
        "tool_choice": _tool_choice(config),
    }
    turns = _turn_detection(config, vad)
    if beta:
        return {
            **common,
            "modalities": ["audio", "text"],
            "voice": config.voice,
            "input_audio_format": _BETA_FORMATS[config.input_format],
            "output_audio_format": _BETA_FORMATS[config.output_format],
            "input_audio_transcription": transcription,
            "turn_detection": turns,
            "max_response_output_tokens": "inf",
        }
    return {
        **common,
        "type": "realtime",
        "output_modalities": ["audio"],
        "max_output_tokens": "inf",
        "audio": {
            "input": {
                "format": _format(config.input_format, config.input_sample_rate),
                "transcription": transcription,
                "noise_reduction": None,
                "turn_detection": turns,
            },
            "output": {
                "format": _format(config.output_format, config.output_sample_rate),
                "voice": config.voice,
                "speed": 1.0,
            },
        },
    }


BETA_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
}
"""GA event names → the beta names (`OpenAI-Beta: realtime=v1` clients)."""

_CLIENT_CODES = (
    "invalid",
    "unsupported",
    "input_audio",
    "response_cancel",
    "conversation_already_has_active_response",
    "item_",  # item_truncate_invalid_item_id, item_retrieve_invalid_item_id
)
"""Prefixes of the codes of the client's mistakes (`invalid_request_error`)."""


def framed(event: dict[str, Any], beta: bool) -> dict[str, Any]:
    """A server event with its `event_id`, under the beta name where the client wants it."""
    kind = BETA_NAMES.get(event["type"], event["type"]) if beta else event["type"]
    return {"event_id": f"event_{uuid.uuid4().hex[:20]}", **event, "type": kind}


def error_event(
    code: str, message: str, param: str | None, event_id: str | None, fatal: bool = False
) -> dict[str, Any]:
    """OpenAI's `error` event; `invalid_request_error` for the client's mistakes. A fatal
    error (the connection closes next) says so in `fatal`, a field OpenAI's clients ignore."""
    error: dict[str, Any] = {
        "type": "invalid_request_error" if code.startswith(_CLIENT_CODES) else "server_error",
        "code": code,
        "message": message,
        "param": param,
        "event_id": event_id,
    }
    if fatal:
        error["fatal"] = True
    return {"type": "error", "error": error}


def message_item(
    item_id: str, role: str, status: str, content: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": role,
        "status": status,
        "content": content,
    }


def assistant_item(item_id: str, status: str, transcript: str | None, beta: bool) -> dict[str, Any]:
    """The agent's audio message; its content once the transcript is known."""
    part = {"type": "audio" if beta else "output_audio", "transcript": transcript}
    return message_item(item_id, "assistant", status, [part] if transcript is not None else [])


def function_call_item(
    item_id: str, status: str, call: dict[str, Any], arguments: str
) -> dict[str, Any]:
    """A call of one of the client's functions (`call` holds `call_id` and `name`)."""
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "function_call",
        "status": status,
        **call,
        "arguments": arguments,
    }


def function_output_item(item_id: str, call_id: str, output: str) -> dict[str, Any]:
    """The client's result of a call, as the conversation holds it."""
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "function_call_output",
        "call_id": call_id,
        "output": output,
    }


def content_ref(response_id: str, item_id: str) -> dict[str, Any]:
    """Where a delta belongs: the response's one item, its one content part."""
    return {"response_id": response_id, "item_id": item_id, "output_index": 0, "content_index": 0}


def response_object(
    response_id: str,
    status: str,
    output: list[Any],
    details: dict[str, Any] | None,
    conversation_id: str | None,
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "status_details": details,
        "output": output,
        "output_modalities": ["audio"],
        "conversation_id": conversation_id,
        "usage": None,
    }


def status_details(status: str, client_cancelled: bool) -> dict[str, Any] | None:
    """Why a response ended other than completed: a cancel (the client's, or the user's
    speech) or a failure."""
    if status == "cancelled":
        reason = "client_cancelled" if client_cancelled else "turn_detected"
        return {"type": "cancelled", "reason": reason}
    if status == "failed":
        return {"type": "failed", "error": {"type": "server_error", "code": "failed"}}
    return None
