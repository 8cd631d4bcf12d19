"""Sessions survive their gateway: resume by id within the window, on another process."""

from __future__ import annotations

from services.client.stream import StreamClient
from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from tests.conftest import Stack
from tests.servers import ServerThread


async def test_resume_after_gateway_restart(lite_stack: Stack) -> None:
    settings = GatewaySettings(redis=lite_stack.redis)
    with ServerThread(create_app(settings)) as first:
        async with StreamClient(f"{first.ws}/v1/stream") as client:
            session_id = client.session["id"]
            await client.send(
                {
                    "type": "session.update",
                    "session": {
                        "output_sample_rate": 16000,
                        "voice": "default",
                        "instructions": "Speak like a lighthouse keeper.",
                    },
                }
            )
            await client.wait_for("session.updated")
            client.new_turn()
            await client.send({"type": "conversation.text", "text": "Remember the blue door."})
            await client.wait_for("response.done", 20)
    # the first gateway process is gone; a new one (another id) takes the reconnect
    second_app = create_app(settings)
    with ServerThread(second_app) as second:
        async with StreamClient(f"{second.ws}/v1/stream?session_id={session_id}") as client:
            assert client.session["id"] == session_id
            assert client.session["resumed"] is True
            assert client.session["output_sample_rate"] == 16000
            assert client.session["instructions"] == "Speak like a lighthouse keeper."
            history = second_app.state.sessions[session_id].history
            assert [(t.role, t.text) for t in history] == [
                ("user", "Remember the blue door."),
                ("agent", "Remember the blue door."),
            ]
            turn = client.new_turn()
            await client.send({"type": "response.create", "text": "Back again."})
            done = await client.wait_for("response.done", 20)
            assert done["status"] == "completed" and len(turn.audio) > 0


async def test_unknown_session_id_starts_a_new_session(lite_stack: Stack) -> None:
    async with StreamClient(f"{lite_stack.stream_url}?session_id=sess_nonexistent") as client:
        assert client.session["id"] != "sess_nonexistent"
        assert "resumed" not in client.session
