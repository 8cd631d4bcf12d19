"""The gateway: `create_app(settings)` wires sessions, VAD, the bus and ops routes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Query, Request, WebSocket
from fastapi.responses import JSONResponse

from services.common.audio.listener import HearingBatcher, Listener
from services.common.audio.vad import SileroVad
from services.common.auth.browser import local_caller
from services.common.auth.credentials import app_subprotocol
from services.common.auth.guard import late_admission, meter_of, principal_of, refuse_handshake
from services.common.auth.relay import relay_headers
from services.common.auth.tokens_api import install_auth
from services.common.bus.connection import connect
from services.common.bus.messages import BusResult
from services.common.errors import CapacityError, Forbidden, VoiceAgentError
from services.common.platform.threads import limit_blas_threads
from services.common.protocol.events import SessionConfig, SessionCreated
from services.common.service.lifecycle import Background
from services.common.service.routes import ServiceState, install_ops
from services.common.service.ws import Channel, failing_typed
from services.gateway import metrics, tools, twilio_events
from services.gateway.admission import Admission
from services.gateway.agent import AGENTS, Agent, AgentContext, can_prepare, load_agents
from services.gateway.bus import GatewayBus
from services.gateway.codec import Codec, NativeCodec, SessionChannel
from services.gateway.drain import CLOSE_WAIT_S, Drainer
from services.gateway.duplex_session import DuplexSession, open_duplex_session
from services.gateway.handshake import read_handshake
from services.gateway.hearing import new_id
from services.gateway.llm import LlmEndpoint, OpenAiAgent
from services.gateway.realtime import REALTIME_SESSION, RealtimeCodec
from services.gateway.session import Session, SessionServices
from services.gateway.settings import GatewaySettings
from services.gateway.static import static_router
from services.gateway.store import Resumable, SessionStore, Unheard
from services.gateway.turn_end import EndOfTurn, create_policy, listening
from services.gateway.twilio import TWILIO_SESSION, TwilioCodec, WaitingRoom, wait_for_start

log = logging.getLogger(__name__)

TAKE_OVER_S = 10.0
"""How long a session resumed on another connection gets to end on its old one (its
handling finishing an input, its save)."""

Restored = Resumable | None
"""A stored session being resumed (its settings, history and owed answer), or None."""


def token_settings(
    config: SessionConfig, asked: Mapping[str, Any], agents: Mapping[str, object]
) -> SessionConfig:
    """A new session's settings with those its client token carries (an agent this gateway
    does not have is left at the default)."""
    update = {k: v for k, v in asked.items() if k in ("voice", "language", "instructions")}
    if asked.get("agent") in agents:
        update["agent"] = asked["agent"]
    return config.model_copy(update=update) if update else config


class AgentChoice:
    """The agent of new sessions, settled at start-up: the configured one, else `openai`
    when an LLM is configured and answers, else `echo` with a notice saying why."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.notice: str | None = None

    async def settle(
        self, configured: str | None, llm: LlmEndpoint, agents: Mapping[str, object]
    ) -> None:
        reason = await llm.probe() if llm.configured else None
        if reason is not None:
            log.warning("the LLM at %s does not answer: %s", llm.url, reason)
        if configured is not None:
            return
        if not llm.configured or "openai" not in agents:
            self.notice = (
                "no LLM is configured (VA_LLM__BASE_URL, OPENAI_BASE_URL or OPENAI_API_KEY): "
                "the echo agent answers"
            )
        elif reason is not None:
            self.notice = f"the LLM at {llm.url} did not answer ({reason}): the echo agent answers"
        else:
            self.agent = "openai"
            log.info("new sessions get the openai agent (model %s at %s)", llm.model, llm.url)
            return
        log.info("new sessions get the echo agent: %s", self.notice)


FINAL_SAVE_WAIT_S = 10.0
"""How long a session's last save may take once it has ended (a frozen Redis would hold its
handler, and a process's shutdown, for as long as its retries last)."""


def create_app(
    settings: GatewaySettings,
    agents: dict[str, Callable[[], Agent]] | None = None,
    end_of_turn: EndOfTurn | None = None,
    admission: Admission | None = None,
) -> FastAPI:
    """The gateway app. VAD loads in `lifespan`, never at import.

    `agents`, `end_of_turn` and `admission` replace the built-in responders, turn policy
    and admission (services/gateway/admission.py).
    """
    limit_blas_threads(settings.blas_threads)
    section = settings.gateway
    end_of_turn = end_of_turn or create_policy(section)
    vad = listening(end_of_turn, settings.vad, section)
    llm = LlmEndpoint(settings.llm)
    if agents is None:
        openai_agent = OpenAiAgent(llm)
        agents = {**AGENTS, "openai": lambda: openai_agent}
        agents |= load_agents(settings.agent_plugins(), AgentContext(llm, settings))
    if section.default_agent is not None and section.default_agent not in agents:
        known = ", ".join(sorted(agents))
        raise ValueError(f"VA_GATEWAY__DEFAULT_AGENT={section.default_agent!r}: choose {known}")
    chosen = AgentChoice(section.default_agent or "echo")
    gateway_id = section.gateway_id or f"gw-{uuid.uuid4().hex[:12]}"
    redis = connect(settings.redis)
    retry_s = min(section.asr_timeout_s, section.tts_timeout_s)
    bus = GatewayBus(redis, settings.redis, gateway_id, retry_s=retry_s)
    sessions: dict[str, Session | DuplexSession] = {}
    session_ended: dict[str, asyncio.Event] = {}
    """Set when a session's connection has ended and the session is saved (take_over)."""
    admitted: set[WebSocket] = set()
    """Connections admitted and not yet ended, what `max_sessions` counts: a phone call
    waiting for its stream's start has no session yet, but holds its place."""
    unverified = WaitingRoom(
        section.twilio.max_unverified, section.twilio.max_unverified_per_address
    )
    """Phone streams whose credential is still to come (in their `start`): no seat yet."""
    store = SessionStore(
        redis,
        settings.redis.prefix,
        section.resume_window_s,
        settings.redis,
        owner=f"{gateway_id}.{uuid.uuid4().hex[:12]}",
    )
    admission = admission or Admission(section.admission, section.max_sessions)
    services = SessionServices(
        bus,
        section,
        agents,
        end_of_turn,
        store,
        voice_to_voice=admission.observe,
    )
    max_frame = section.server.ws_max_frame_bytes
    state = ServiceState(service="gateway", redis=redis, engine="silero-vad", model="silero_vad_v6")
    vad_holder: dict[str, SileroVad] = {}
    hearing: dict[str, HearingBatcher] = {}

    def extra() -> dict[str, object]:
        batcher = hearing.get("batcher")
        mean = batcher.streams_run / batcher.calls if batcher and batcher.calls else None
        return {
            "gateway_id": gateway_id,
            "sessions": len(sessions),
            "admitted": len(admitted),  # what max_sessions counts: calls not started too
            "vad_batch_mean": mean,
            "end_of_turn": end_of_turn.name,
            "admission": admission.reading(len(admitted)).model_dump(),
            "backend": section.backend,
        }

    state.extra = extra
    state.timings = {"hearing": metrics.HEARING, "results": metrics.RESULTS_WAIT}
    background = Background()
    state.background_ok = background.healthy

    async def save(session: Session | DuplexSession) -> None:
        """A session's save by its gateway (its last, or a drain's)."""
        if isinstance(session, Session):
            await store.save(
                session.config, session.history, session.tenant, session.owed, session.taken
            )
        else:
            await store.save(session.config, session.history, session.tenant)

    drainer = Drainer(sessions, state, busy=lambda session: session.busy(), save=save)

    def deliver(result: BusResult, audio: bytes | None) -> None:
        session = sessions.get(result.session_id)
        if session is None:
            metrics.STALE_DROPPED.labels("no_session").inc()
        else:
            session.deliver(result, audio)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        vad_holder["vad"] = await asyncio.to_thread(SileroVad, settings.vad.model_path)
        await asyncio.to_thread(end_of_turn.load)
        if section.batch_vad:
            hearing["batcher"] = HearingBatcher(vad_holder["vad"])
        try:
            await bus.reset()
        except Exception as exc:
            log.warning("redis unreachable at start-up (%s): will keep trying", exc)
        background.start(lambda: bus.route_results(deliver), "gateway-results")
        background.start(lambda: store.keep_alive(sessions), "session-keep-alive")
        await chosen.settle(section.default_agent, llm, agents)
        state.model_loaded = True
        log.info("gateway %s ready", gateway_id)
        try:
            yield
        finally:
            state.draining = True
            await background.stop()
            if "batcher" in hearing:
                hearing["batcher"].close()
            await llm.aclose()
            await redis.aclose()

    app = FastAPI(title="voice-agent gateway", lifespan=lifespan)
    install_ops(app, state)
    keys = install_auth(app, settings.auth, redis, settings.redis.prefix, "gateway", False)

    @app.post("/admin/drain")
    async def drain(
        request: Request,
        grace_s: float = Query(30.0, ge=0, le=3600, description="time a turn gets to end"),
        wait_s: float = Query(10.0, ge=0, le=600, description="wait after closing with 1012"),
    ) -> JSONResponse:
        """Drain this gateway (docs/kubernetes.md): loopback callers only."""
        if not local_caller(request.scope):
            refused = Forbidden("drain is for local callers only")
            return JSONResponse(refused.body(), refused.http_status)
        report = await drainer.drain(grace_s, wait_s)
        return JSONResponse(report.model_dump(), 200 if report.remaining == 0 else 504)

    async def admit(
        ws: WebSocket,
        codec: Codec,
        session_id: str | None,
        verified: bool = True,
        signed: bool = False,
    ) -> tuple[SessionChannel, Restored] | None:
        """The one handshake and admission of every session endpoint (`/v1/stream`,
        `/v1/realtime`, `/v1/twilio`). The auth guard has checked the credential before
        this runs, unless not `verified` (a phone stream's comes in its `start`: it waits in
        `unverified`, a few per address unless Twilio `signed` its upgrade, and takes no
        seat until `seat` says it passed); a session id of another tenant is refused here,
        before the accept. None when the client was refused (already told and closed)."""
        principal = principal_of(ws)
        peer = ws.client.host if ws.client else None
        try:
            restored = await store.load(session_id, principal.tenant) if session_id else None
        except Forbidden as exc:  # another tenant's id: no session, not even an accept
            await refuse_handshake(ws, exc, "gateway")
            return None
        offered = ws.scope.get("subprotocols")
        await ws.accept(subprotocol=app_subprotocol(offered) or read_handshake(ws).subprotocol)
        channel = SessionChannel(Channel(ws, "gateway", max_frame), codec)
        try:
            if state.draining:
                metrics.SESSIONS_REFUSED.labels("draining").inc()
                raise CapacityError("gateway draining; retry after 1 s")
            if verified:
                admission.admit(len(admitted))
            elif (reason := unverified.refusal(peer, signed)) is not None:
                metrics.SESSIONS_REFUSED.labels(reason).inc()
                raise CapacityError("too many phone streams waiting for their start; retry")
        except CapacityError as exc:
            await channel.fail(exc)
            return None
        # counted from here: a phone call's start, a handshake may take a while
        if verified:
            admitted.add(ws)
        else:
            unverified.enter(ws, peer, signed)
        return channel, restored

    async def seat(ws: WebSocket, channel: SessionChannel) -> bool:
        """A stream admitted unverified whose credential has now passed takes its seat
        (False: refused for capacity, told and closed)."""
        unverified.leave(ws)
        try:
            admission.admit(len(admitted))
        except CapacityError as exc:
            await channel.fail(exc)
            return False
        admitted.add(ws)
        return True

    async def run_session(
        ws: WebSocket,
        channel: SessionChannel,
        restored: Restored,
        initial: dict[str, object] | None = None,
    ) -> None:
        """One conversation on an admitted channel, until the client leaves."""
        principal = principal_of(ws)
        given: dict[str, Any] = {
            "id": new_id("sess"),
            "voice": section.default_voice,
            "agent": chosen.agent,
            "language": section.default_language,
            "partials": section.partials,
        }
        config = SessionConfig.model_validate({**given, **(initial or {})})
        config = token_settings(config, principal.session, agents)
        stored = Resumable(config, [])
        unheard: Unheard | None = None
        resumed_notice: str | None = None
        if restored is not None:
            resumed_id = restored[0].id
            if resumed_id in sessions and not await take_over(resumed_id):
                restored = None
            else:  # this process now writes it, and gets it as its last writer left it
                with contextlib.suppress(Forbidden):  # `admit` checked the tenant already
                    restored = await store.claim(resumed_id, principal.tenant, restored)
        if restored is not None and restored[0].id not in sessions:
            stored, unheard = restored, await store.unheard(restored.config.id)
            config = stored.config.model_copy(update={"resumed": True})
            if config.agent not in agents:  # saved by a gateway with an agent this one lacks
                resumed_notice = (
                    f"the agent {config.agent!r} is not on this gateway: {chosen.agent} answers"
                )
                config = config.model_copy(update={"agent": chosen.agent})
        listener = Listener(
            vad_holder["vad"], vad, config.input_sample_rate, hearing.get("batcher")
        )
        state.connection_opened()
        metrics.SESSIONS.inc()
        saved = asyncio.Event()
        tools.SESSION.set(config.id)  # its tasks inherit it: one share of the tool threads
        try:
            failing = failing_typed(channel.fail, f"session {config.id}")
            async with failing, asyncio.TaskGroup() as tasks:
                begun = stored._replace(config=config)
                session = await new_session(ws, channel, listener, tasks, begun, unheard)
                sessions[config.id] = session
                session_ended[config.id] = saved
                drainer.opened()
                notice = chosen.notice if config.agent == chosen.agent else None
                await channel.send(SessionCreated(session=config, notice=resumed_notice or notice))
                await session.serve()
        finally:
            ended = sessions.pop(config.id, None)
            # closed now, whatever its save meets: a drain waits for closes, not for Redis
            drainer.closed()
            metrics.SESSIONS.dec()
            state.connection_closed()
            try:
                if ended is not None:
                    async with asyncio.timeout(FINAL_SAVE_WAIT_S):
                        await save(ended)
            except Exception:  # a frozen Redis included: the session is over either way
                log.exception("session %s could not be saved", config.id)
            finally:
                if session_ended.get(config.id) is saved:
                    del session_ended[config.id]
                saved.set()

    async def take_over(session_id: str) -> bool:
        """A reconnect with the id of a session still open here (its client's network
        changed before this side saw the old socket die): the old connection is closed and
        its session saved, for the new one to claim. False (a new session) when it does not
        end in time."""
        old, ended = sessions.get(session_id), session_ended.get(session_id)
        if old is None or ended is None:
            return False
        log.info("session %s resumed on another connection: the old one is closed", session_id)
        await old.take_over()
        try:
            await asyncio.wait_for(ended.wait(), TAKE_OVER_S)
        except TimeoutError:
            log.warning("session %s did not end in %.0f s: a new session", session_id, TAKE_OVER_S)
            return False
        return True

    async def new_session(
        ws: WebSocket,
        channel: SessionChannel,
        listener: Listener,
        tasks: asyncio.TaskGroup,
        begun: Resumable,
        unheard: Unheard | None,
    ) -> Session | DuplexSession:
        """The session of the configured backend (a duplex one holds its slot already), with
        its settings and history (a resumed one's as stored, with what they still owe)."""
        config, history = begun.config, begun.history
        tenant, meter = principal_of(ws).tenant, meter_of(ws)
        if section.backend == "duplex":
            headers = await relay_headers(ws, keys)
            return await open_duplex_session(
                config,
                channel,
                listener,
                section,
                store,
                tasks,
                headers,
                tenant=tenant,
                meter=meter,
                history=history,
            )
        return Session(
            config,
            channel,
            listener,
            services,
            tasks,
            tenant=tenant,
            meter=meter,
            history=history,
            owed=begun.owed,
            taken=begun.taken,
            unheard=unheard,
        )

    @app.websocket("/v1/stream")
    async def stream(ws: WebSocket, session_id: str | None = Query(None, max_length=64)) -> None:
        opened = await admit(ws, NativeCodec(), session_id)
        if opened is not None:
            try:
                await run_session(ws, *opened)
            finally:
                admitted.discard(ws)

    @app.websocket("/v1/realtime")
    async def realtime(ws: WebSocket, model: str | None = Query(None, max_length=128)) -> None:
        beta = "realtime=v1" in ws.headers.get("openai-beta", "") or (
            "openai-beta.realtime-v1" in read_handshake(ws).offered
        )
        duplex = section.backend == "duplex"
        codec = RealtimeCodec(beta=beta, vad=vad, agents=frozenset(agents), duplex=duplex)
        opened = await admit(ws, codec, None)
        if opened is not None:
            initial = {**REALTIME_SESSION, **({"agent": model} if model in agents else {})}
            try:
                await run_session(ws, *opened, initial)
            finally:
                admitted.discard(ws)

    def signed_by_twilio(ws: WebSocket) -> bool | None:
        """Whether a `/v1/twilio` upgrade carries Twilio's signature of the configured
        `public_url` (never the Host or X-Forwarded-* headers: a proxy changes those), None
        when no Twilio auth token is configured."""
        token, url = section.twilio.auth_token, section.twilio.public_url
        if token is None or url is None:
            return None
        query = ws.scope.get("query_string", b"").decode("latin-1")
        requested = f"{url}?{query}" if query else url
        given = ws.headers.get(twilio_events.SIGNATURE_HEADER)
        return twilio_events.signed_by_twilio(token.get_secret_value(), requested, given)

    @app.websocket("/v1/twilio")
    async def twilio(ws: WebSocket) -> None:
        """A phone call: Twilio Media Streams (`<Connect><Stream url=".../v1/twilio">`). The
        upgrade must carry Twilio's signature when its auth token is configured (HTTP 403,
        no accept, otherwise); the credential, when authentication is on, comes in the
        stream's `start` (a custom parameter): no session before it is checked."""
        signed = signed_by_twilio(ws)
        if signed is False:
            refused = Forbidden("this upgrade does not carry Twilio's signature")
            await refuse_handshake(ws, refused, "gateway")
            return
        codec = TwilioCodec()
        late = late_admission(ws)  # None: checked at the upgrade (or authentication is off)
        opened = await admit(ws, codec, None, verified=late is None, signed=bool(signed))
        if opened is None:
            return
        channel, restored = opened
        try:
            if not await wait_for_start(channel, codec, section.twilio.start_timeout_s):
                await channel.close(1000, "no stream started")
                return
            token = codec.parameters.get(section.twilio.token_parameter)
            door = late(token) if late is not None else contextlib.nullcontext()
            async with door:
                if late is None or await seat(ws, channel):
                    await run_session(ws, channel, restored, TWILIO_SESSION)
        except VoiceAgentError as exc:  # refused at the late door (already counted)
            log.warning("twilio stream %s refused: %s", codec.stream_sid, exc.message)
            await channel.fail(exc)
        finally:
            admitted.discard(ws)
            unverified.leave(ws)

    @app.get("/v1/agents")
    async def list_agents() -> dict[str, Any]:
        """The agents a session may pick (`session.update` `agent`; Realtime's `model`)."""
        listed = [
            {"id": name, "prepare_safe": can_prepare(make())} for name, make in agents.items()
        ]
        return {"agents": listed, "default": chosen.agent, "notice": chosen.notice}

    app.include_router(static_router(section, keys))

    app.state.sessions = sessions
    # SIGTERM runs it before uvicorn's own shutdown (services/common/service/server.py)
    app.state.drain_on_stop = lambda: drainer.drain(section.server.drain_timeout_s, CLOSE_WAIT_S)
    app.state.gateway_id = gateway_id
    return app
