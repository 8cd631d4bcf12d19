"""A Twilio voice webhook that answers each call with the TwiML of examples/twilio/twiml.xml,
a fresh client token in it (docs/telephony.md). Standard library only:

    VOICE_AGENT_URL=https://voice.example.com VOICE_AGENT_KEY=va_... \\
    TWILIO_AUTH_TOKEN=... WEBHOOK_URL=https://hooks.example.com/answer \\
        python examples/twilio/answer.py        # then point the number's webhook at :8080

Every request must carry a valid `X-Twilio-Signature` (HMAC-SHA1 of the webhook's URL and
its sorted form fields, keyed by the account's auth token: Twilio's own scheme): a token
for the voice agent goes to Twilio only, never to whoever finds the webhook. `WEBHOOK_URL`
is the address Twilio posts to, as the number's settings say it (behind a proxy, the
request's own URL differs). Behind TLS in production.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import sys
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from xml.sax.saxutils import quoteattr

GATEWAY = os.environ.get("VOICE_AGENT_URL", "http://127.0.0.1:8000").rstrip("/")
KEY = os.environ.get("VOICE_AGENT_KEY", "")
TWILIO_AUTH_TOKEN = os.environ.get("TWILIO_AUTH_TOKEN", "")
WEBHOOK_URL = os.environ.get("WEBHOOK_URL", "")


def signature(url: str, fields: dict[str, str], auth_token: str) -> str:
    """Twilio's request signature: the URL, then each form field's name and value in the
    order of the names, HMAC-SHA1 with the auth token, in base64."""
    signed = url + "".join(name + fields[name] for name in sorted(fields))
    digest = hmac.new(auth_token.encode(), signed.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def signed_by_twilio(url: str, fields: dict[str, str], given: str, auth_token: str) -> bool:
    return bool(auth_token) and hmac.compare_digest(signature(url, fields, auth_token), given)


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
        length = int(self.headers.get("Content-Length") or 0)
        form = urllib.parse.parse_qsl(self.rfile.read(length).decode(), keep_blank_values=True)
        url = WEBHOOK_URL or f"http://{self.headers.get('Host', '')}{self.path}"
        given = self.headers.get("X-Twilio-Signature", "")
        if not signed_by_twilio(url, dict(form), given, TWILIO_AUTH_TOKEN):
            self.send_error(403, "not signed by Twilio")
            return
        body = twiml().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


if __name__ == "__main__":
    if not TWILIO_AUTH_TOKEN:
        sys.exit("set TWILIO_AUTH_TOKEN (the account's auth token): requests are checked with it")
    HTTPServer(("0.0.0.0", 8080), Answer).serve_forever()
