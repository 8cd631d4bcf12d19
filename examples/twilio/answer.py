"""A Twilio voice webhook that answers each call with the TwiML of examples/twilio/twiml.xml,
a fresh client token in it (docs/telephony.md). Standard library only:

    VOICE_AGENT_URL=https://voice.example.com VOICE_AGENT_KEY=va_... \\
        python examples/twilio/answer.py        # then point the number's webhook at :8080

Behind TLS in production, and check Twilio's `X-Twilio-Signature` before answering (Twilio's
helper library does it); this example leaves that to the proxy in front.
"""

from __future__ import annotations

import json
import os
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from xml.sax.saxutils import quoteattr

GATEWAY = os.environ.get("VOICE_AGENT_URL", "http://127.0.0.1:8000").rstrip("/")
KEY = os.environ.get("VOICE_AGENT_KEY", "")


def client_token() -> str:
    """A client token for one call (60 s to connect: it is checked when the stream starts)."""
    request = urllib.request.Request(  # noqa: S310 (the gateway's own URL)
        f"{GATEWAY}/v1/sessions",
        data=json.dumps({"expires_in": 60}).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        return str(json.load(response)["token"])


def twiml() -> str:
    stream = GATEWAY.replace("https://", "wss://").replace("http://", "ws://") + "/v1/twilio"
    parameter = f'<Parameter name="token" value={quoteattr(client_token())} />' if KEY else ""
    return (
        '<?xml version="1.0" encoding="UTF-8"?><Response><Connect>'
        f"<Stream url={quoteattr(stream)}>{parameter}</Stream>"
        "</Connect></Response>"
    )


class Answer(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = twiml().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


if __name__ == "__main__":
    HTTPServer(("0.0.0.0", 8080), Answer).serve_forever()
