"""The operator tools' probes of this host's own services (`up` waiting for /ready, the
container healthcheck, doctor's ports, `drain`) go straight there: an HTTP_PROXY in the
environment cannot reach loopback. IPv6 hosts are bracketed, and a URL that is not one is
a one-line error."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from services.ops.cli import main, wait_ready
from services.ops.doctor_checks import check_port
from services.ops.healthcheck import probe
from services.ops.redis_server import free_port

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


class Service(BaseHTTPRequestHandler):
    """What an ASR service answers on /ready, /health and a gateway on /admin/drain."""

    def do_GET(self) -> None:
        body = {"service": "asr", "engine": "fake"} if self.path == "/health" else {}
        self._reply(json.dumps(body).encode())

    def do_POST(self) -> None:
        self._reply(b'{"closed_1012": 0}')

    def _reply(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class V6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def serving(server: ThreadingHTTPServer) -> Iterator[int]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def service() -> Iterator[int]:
    yield from serving(ThreadingHTTPServer(("127.0.0.1", 0), Service))


@pytest.fixture
def proxied(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy in the environment that nothing answers at (as one for the internet would
    not answer for this host's loopback)."""
    dead = f"http://127.0.0.1:{free_port()}"
    for variable in PROXY_VARIABLES:
        monkeypatch.setenv(variable, dead)
        monkeypatch.setenv(variable.lower(), dead)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)


@pytest.mark.usefixtures("proxied")
def test_up_waits_for_ready_past_a_proxy(service: int) -> None:
    wait_ready({"asr": f"http://127.0.0.1:{service}"}, [], timeout_s=10)  # returns: ready


@pytest.mark.usefixtures("proxied")
def test_the_healthcheck_probes_past_a_proxy(service: int) -> None:
    assert probe(f"http://127.0.0.1:{service}/ready", 3) is None


@pytest.mark.usefixtures("proxied")
def test_doctor_sees_its_service_past_a_proxy(service: int) -> None:
    check = check_port("asr", "127.0.0.1", service)
    assert check.status == "OK" and "serves voice-agent asr" in check.detail, check


@pytest.mark.usefixtures("proxied")
def test_drain_reaches_the_gateway_past_a_proxy(
    service: int, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["drain", "--url", f"http://127.0.0.1:{service}", "--grace", "0", "--wait", "0"])
    assert capsys.readouterr().out.strip() == '{"closed_1012": 0}'


def test_doctor_brackets_an_ipv6_host() -> None:
    try:
        server = V6Server(("::1", 0), Service)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    for port in serving(server):
        check = check_port("asr", "::1", port)
        assert check.status == "OK" and f"[::1]:{port} serves voice-agent asr" in check.detail


@pytest.mark.parametrize(
    ("argv", "status", "line"),
    [
        (["healthcheck", "--url", "http://[::1"], 1, "healthcheck: --url 'http://[::1': "),
        (["drain", "--url", "http://[::1"], 2, "voice-agent drain: error: --url http://[::1: "),
    ],
)
def test_a_url_that_is_not_one_is_one_line(
    argv: list[str], status: int, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == status
    assert err.startswith(line) and len(err.splitlines()) == 1, err
