"""The shipped nginx config in front of a gateway with authentication on: credentials pass
through (a key in `Authorization`, a browser's token as a subprotocol, whose answer comes
back), refusals keep their status, the token endpoint is rate-limited per address, and
neither log holds a key or a token."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import websockets
from pydantic import SecretStr
from websockets.exceptions import InvalidStatus

from services.common.auth.credentials import APP_SUBPROTOCOL, TOKEN_SUBPROTOCOL
from services.common.auth.settings import AuthSettings
from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from services.ops.deploy import NginxSite, nginx_binary, nginx_command, prepare_dirs, render_nginx
from services.ops.redis_server import free_port
from tests.conftest import RedisProc
from tests.e2e.test_auth import new_key
from tests.e2e.test_nginx import Front, wait_until_serving
from tests.servers import ServerThread
from tests.tls import self_signed

AUTH = AuthSettings(required=True, token_secret=SecretStr("nginx-auth-secret-" + "n" * 32))


@dataclass
class Site:
    front: Front
    key: str

    def log(self) -> str:
        return self.front.log("voice-agent.access.log") + self.front.log("error.log")


@pytest.fixture(scope="module")
def site(redis_server: RedisProc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    if nginx_binary() is None:
        pytest.skip("nginx is not installed and could not be (scripts/system_deps.sh)")
    redis = redis_server.settings()
    _, key = asyncio.run(new_key(redis, "acme"))
    workdir = tmp_path_factory.mktemp("nginx-auth")
    cert, tls_key = self_signed(workdir)
    app = create_app(GatewaySettings(profile="fake", redis=redis, auth=AUTH))
    with ServerThread(app) as gateway:
        upstream = (f"127.0.0.1:{gateway.port}",)
        nginx = NginxSite(
            gateways=upstream,
            asr=upstream,
            tts=upstream,
            bind=("127.0.0.1",),
            https_port=free_port(),
            http_port=free_port(),
            tls_cert=cert,
            tls_key=tls_key,
            token_rate=6,
            worker_processes="1",
        ).sandboxed(workdir)
        prepare_dirs(nginx)
        conf = workdir / "nginx.conf"
        conf.write_text(render_nginx(nginx))
        tls = ssl.create_default_context(cafile=str(cert))
        front = Front(nginx.https_port, nginx.http_port, tls, {"gw": app}, workdir, nginx)
        with (workdir / "nginx.out").open("wb") as out:
            proc = subprocess.Popen(
                nginx_command(conf, workdir, "-g", "daemon off;"), stdout=out, stderr=out
            )
        try:
            wait_until_serving(front, proc)
            yield Site(front, key)
        finally:
            proc.terminate()
            proc.wait(timeout=15)


async def test_credentials_pass_through_and_tokens_are_rate_limited(site: Site) -> None:
    front = site.front
    url = f"{front.https}/v1/sessions"
    async with httpx.AsyncClient(verify=front.tls, timeout=10) as http:
        auth = {"Authorization": f"Bearer {site.key}"}
        first = await http.post(url, json={}, headers=auth)
        assert first.status_code == 200, first.text
        token = first.json()["token"]
        assert (await http.post(url, json={}, headers=auth)).status_code == 200  # the burst
        assert (await http.post(url, json={}, headers=auth)).status_code == 429  # nginx's
        assert (await http.post(url, json={})).status_code in (401, 429)
    protocols = [APP_SUBPROTOCOL, TOKEN_SUBPROTOCOL + token]
    async with websockets.connect(
        f"{front.wss}/v1/stream",
        ssl=front.tls,
        subprotocols=protocols,  # type: ignore[arg-type]
    ) as ws:
        assert ws.subprotocol == APP_SUBPROTOCOL
        assert json.loads(await ws.recv())["type"] == "session.created"
    with pytest.raises(InvalidStatus) as refused:
        async with websockets.connect(f"{front.wss}/v1/stream?access_token=nope", ssl=front.tls):
            pass
    assert refused.value.response.status_code == 401
    logs = site.log()
    assert "/v1/sessions" in logs and "/v1/stream" in logs
    for secret in (site.key, token, "access_token"):
        assert secret not in logs


def test_the_token_endpoint_is_limited_in_the_template(tmp_path: Path) -> None:
    conf = render_nginx(NginxSite(token_rate=30))
    assert "zone=va_tokens:10m rate=30r/m" in conf
    block = conf.split("location = /v1/sessions {")[1].split("}")[0]
    assert "limit_req zone=va_tokens burst=3 nodelay;" in block
    assert "proxy_pass http://va_gateway;" in block
