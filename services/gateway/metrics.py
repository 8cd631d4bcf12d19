"""Metrics of the gateway: per-stage latencies of a conversation."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.common.service.process import RecentSamples

STAGE_BUCKETS = (0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)

SESSIONS = Gauge("va_gateway_sessions_active", "Sessions open on this gateway process.")
SESSIONS_REFUSED = Counter(
    "va_gateway_sessions_refused_total", "Sessions refused at admission, by reason.", ["reason"]
)
TWILIO_MESSAGES = Counter(
    "va_gateway_twilio_messages_total",
    "Twilio Media Streams messages received on /v1/twilio, by event (`invalid`: refused).",
    ["event"],
)
ASR_ROUNDTRIP = Histogram(
    "va_gateway_asr_seconds",
    "From the end of the user's speech to the final transcript (Redis round trip and ASR).",
    buckets=STAGE_BUCKETS,
)
TTS_FIRST_AUDIO = Histogram(
    "va_gateway_tts_first_audio_seconds",
    "From a response's first TTS job to its first audio chunk at the gateway.",
    buckets=STAGE_BUCKETS,
)
VOICE_TO_VOICE = Histogram(
    "va_voice_to_voice_seconds",
    "From the end of the user's speech to the first agent audio frame sent.",
    buckets=STAGE_BUCKETS,
)
END_OF_TURN_DELAY = Histogram(
    "va_gateway_end_of_turn_delay_seconds",
    "From the end of the user's speech to the end of turn being decided.",
    buckets=STAGE_BUCKETS,
)
AGENT_FIRST_TOKEN = Histogram(
    "va_gateway_agent_first_token_seconds",
    "From a response's start to the agent's first text.",
    buckets=STAGE_BUCKETS,
)
BARGE_IN_SILENCE = Histogram(
    "va_gateway_barge_in_time_to_silence_seconds",
    "From the user starting to speak over the agent to the agent's audio stopping.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0),
)
INTERRUPTIONS = Counter(
    "va_gateway_interruptions_total", "Responses interrupted by the user speaking (barge-in)."
)
FALSE_INTERRUPTIONS = Counter(
    "va_gateway_false_interruptions_total",
    "User sounds during agent audio too short to interrupt it (coughs, backchannels).",
)
PARTIALS = Counter(
    "va_gateway_partials_total", "Partial transcripts asked for and sent, by outcome.", ["outcome"]
)
RESPONSES = Counter("va_gateway_responses_total", "Responses ended, by status.", ["status"])
STALE_DROPPED = Counter(
    "va_gateway_stale_results_total", "Bus results dropped as stale or repeated.", ["kind"]
)
DUPLEX_AUDIO = Counter(
    "va_gateway_duplex_audio_seconds_total",
    "Audio carried between clients and the full-duplex service (backend duplex), by direction.",
    ["direction"],
)
HEARING = RecentSamples()
"""Audio frame received → its VAD result (the wait for a batched VAD call included)."""
RESULTS_WAIT = RecentSamples()
"""Bus result read from Redis → handled and sent to the client."""
TURN_HOLDS = Counter(
    "va_gateway_turn_holds_total",
    "End-of-turn holds by outcome: the user went on (continued) or the hold ran out (expired).",
    ["outcome"],
)
CUT_OFFS_JOINED = Counter(
    "va_gateway_cut_offs_joined_total",
    "Turns answered at a pause the user went on from (within cut_off_join_ms): the answer "
    "dropped, the two parts joined into one user turn.",
)
TURN_MODEL = Counter(
    "va_gateway_turn_model_total",
    "Answers of a pause end-of-turn policy (smart-turn): complete, incomplete_words (the "
    "transcript ends mid-thought), no_new_words (the speech since the previous pause added "
    "no words), doubted_words (the ASR doubts the transcript), doubt_ended (such a turn, "
    "ended by end_of_turn_doubt_ms), incomplete (the model hears more to come) and "
    "unsure_ended (a turn whose words look finished, ended by end_of_turn_unsure_ms: the "
    "model doubted it, and is not asked again once that silence has passed).",
    ["decision"],
)
TURN_MODEL_SECONDS = Histogram(
    "va_gateway_turn_model_seconds",
    "Wall time of one batched end-of-turn model call.",
    buckets=(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0),
)
SPECULATIVE_ASR = Counter(
    "va_gateway_speculative_asr_total",
    "Transcriptions started at a pause: used as the turn's final, wasted (the user went on) "
    "or failed.",
    ["outcome"],
)
JOBS_RESUBMITTED = Counter(
    "va_gateway_jobs_resubmitted_total",
    "Jobs of a turn in flight (a final transcript, a reply's speech) that Redis lost (it came "
    "back empty, or a replica was promoted without them), submitted again, by kind (asr, tts).",
    ["kind"],
)
HEARD_AGAIN = Counter(
    "va_gateway_utterances_heard_again_total",
    "Resumed sessions whose last utterance was sent for transcription but its words never "
    "taken (its gateway died, or the link dropped, first): its audio read back from its ASR "
    "job and transcribed again.",
)
OWED_ANSWERS = Counter(
    "va_gateway_owed_answers_total",
    "Resumed sessions whose last turn was still to be answered (its gateway died while "
    "answering): answered on the new connection, or refused (an agent not safe to run twice).",
    ["outcome"],
)
PREPARED_REPLIES = Counter(
    "va_gateway_prepared_replies_total",
    "Replies prepared during a pause (agent and first TTS pieces started on the speculative "
    "transcript): used (the turn ended there) or discarded (the user went on).",
    ["outcome"],
)
PREPARED_TTS_SECONDS = Counter(
    "va_gateway_prepared_tts_audio_seconds_total",
    "Seconds of agent audio synthesized for prepared replies, by outcome: the discarded "
    "ones are the TTS work the preparation cost.",
    ["outcome"],
)
TOOL_CALLS = Counter(
    "va_gateway_tool_calls_total",
    "Server-side tool calls by outcome: ok, error (it raised), timeout, bad_arguments, unknown, "
    "busy (no tool thread free, or the session's share taken: not run).",
    ["outcome"],
)
TOOL_CALLS_ABANDONED = Counter(
    "va_gateway_tool_calls_abandoned_total",
    "Plain (sync) tool calls given up on (timed out, or their reply cancelled) while their "
    "thread still ran: each holds a tool thread until the function returns.",
)
TOOL_SECONDS = Histogram(
    "va_gateway_tool_seconds",
    "Wall time of one server-side tool call that answered.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
LLM_REQUESTS = Counter(
    "va_gateway_llm_requests_total",
    "Chat completion requests of the `openai` agent by outcome: ok, cancelled (barge-in or a "
    "dropped reply closed the stream), failed.",
    ["outcome"],
)
