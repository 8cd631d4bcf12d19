"""The OpenAI `session` object that `/v1/realtime` reports: GA's shape, or beta's flat one."""

from __future__ import annotations

from typing import Any

from services.common.events import SessionConfig
from services.common.vad import VadSettings

MODEL = "voice-agent"
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


def session_object(config: SessionConfig, vad: VadSettings, beta: bool) -> dict[str, Any]:
    """The session as OpenAI's clients read it, from the native session settings."""
    transcription = {"model": TRANSCRIPTION_MODEL, "language": config.language, "prompt": ""}
    common: dict[str, Any] = {
        "id": config.id,
        "object": "realtime.session",
        "model": MODEL,
        "instructions": config.instructions or "",
        "tools": [],
        "tool_choice": "auto",
    }
    turns = _turn_detection(config, vad)
    if beta:
        return {
            **common,
            "modalities": ["audio", "text"],
            "voice": config.voice,
            "input_audio_format": "pcm16",
            "output_audio_format": "pcm16",
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
                "format": {"type": "audio/pcm", "rate": config.input_sample_rate},
                "transcription": transcription,
                "noise_reduction": None,
                "turn_detection": turns,
            },
            "output": {
                "format": {"type": "audio/pcm", "rate": config.output_sample_rate},
                "voice": config.voice,
                "speed": 1.0,
            },
        },
    }
