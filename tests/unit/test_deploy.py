"""The nginx template and its renderer (services/ops/deploy.py), without starting nginx."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from services.ops import deploy
from services.ops.deploy import NginxSite, check_nginx, prepare_dirs, render, render_nginx
from tests.tls import self_signed

WS_ROUTES = {"/v1/stream": "va_gateway", "/v1/realtime": "va_gateway"}
WS_ROUTES |= {"/v1/stream/asr": "va_asr", "/v1/stream/tts": "va_tts"}
REST_ROUTES = {
    "= /v1/audio/transcriptions": "http://va_asr",
    "= /v1/audio/translations": "http://va_asr",
    "/v1/models": "http://va_asr",
    "= /v1/audio/speech": "http://va_tts",
    "/v1/voices": "http://va_tts",
    "= /": "http://va_gateway",  # the browser client
    "/static/": "http://va_gateway",
    "= /v1/agents": "http://va_gateway",  # the browser page's agent list
    "= /health": "http://va_gateway/health",
    "= /ready": "http://va_gateway/ready",
    "= /health/asr": "http://va_asr/health",
    "= /health/tts": "http://va_tts/health",
}


def block(text: str, opening: str) -> str:
    """The body of the first `opening { ... }` block (blocks we look into do not nest)."""
    start = text.index(opening + " {") + len(opening) + 2
    return text[start : text.index("}", start)]


def directives(body: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for statement in re.sub(r"#[^\n]*", "", body).split(";"):
        words = statement.split(None, 1)
        if words:
            found.setdefault(words[0], []).append(words[1].strip() if len(words) > 1 else "")
    return found


@pytest.fixture(scope="module")
def conf() -> str:
    return render_nginx(
        NginxSite(
            gateways=("127.0.0.1:8000", "127.0.0.1:8010", "10.0.0.5:8000"),
            asr=("127.0.0.1:8001", "127.0.0.1:8011"),
            tts=("127.0.0.1:8002", "127.0.0.1:8012"),
            tls_cert=Path("/etc/ssl/va/cert.pem"),
            tls_key=Path("/etc/ssl/va/key.pem"),
            conn_per_ip=7,
            conn_per_server=900,
        )
    )


def test_render_replaces_template_variables_only() -> None:
    text = "proxy_set_header Upgrade $http_upgrade; listen ${PORT}; x ${PORT}"
    rendered = render(text, {"PORT": 443})
    assert rendered == "proxy_set_header Upgrade $http_upgrade; listen 443; x 443"
    with pytest.raises(ValueError, match="PORT, ZONE"):
        render("${ZONE} ${PORT}", {})


def test_every_variable_is_rendered(conf: str) -> None:
    statements = re.sub(r"#[^\n]*", "", conf)
    assert not re.search(r"\$\{", statements)


def test_upstreams_use_least_conn_over_every_instance(conf: str) -> None:
    for name, servers in {
        "va_gateway": ["127.0.0.1:8000", "127.0.0.1:8010", "10.0.0.5:8000"],
        "va_asr": ["127.0.0.1:8001", "127.0.0.1:8011"],
        "va_tts": ["127.0.0.1:8002", "127.0.0.1:8012"],
    }.items():
        found = directives(block(conf, f"upstream {name}"))
        assert "least_conn" in found and found["zone"] == [f"{name} 64k"]
        assert [s.split()[0] for s in found["server"]] == servers


def test_main_context_and_tls(conf: str) -> None:
    top = directives(conf[: conf.index("events {")])
    assert top["worker_shutdown_timeout"] == ["60s"]
    https = conf[conf.index("ssl_certificate ") - 400 :]
    assert "listen 0.0.0.0:443 ssl" in https and "listen [::]:443 ssl" in https
    assert "ssl_certificate /etc/ssl/va/cert.pem;" in conf
    assert "ssl_certificate_key /etc/ssl/va/key.pem;" in conf
    assert "return 301 https://$host:443$request_uri;" in conf  # port 80 redirects


def test_websocket_upgrade_limits_and_timeouts(conf: str) -> None:
    mapping = directives(block(conf, "map $http_upgrade $va_connection"))
    assert mapping == {"default": ["upgrade"], "''": ["''"]}
    assert "proxy_set_header Connection $va_connection;" in conf
    assert "proxy_set_header Upgrade $http_upgrade;" in conf
    assert 'proxy_set_header Sec-WebSocket-Extensions "";' in conf  # no permessage-deflate
    assert "limit_conn_zone $binary_remote_addr zone=va_per_ip:10m;" in conf
    assert "limit_conn_zone $server_name zone=va_per_server:1m;" in conf
    for route, upstream in WS_ROUTES.items():
        found = directives(block(conf, f"location = {route}"))
        assert found["proxy_pass"] == [f"http://{upstream}"]
        assert found["limit_conn"] == ["va_per_ip 7", "va_per_server 900"]
        timeout = int(found["proxy_read_timeout"][0].rstrip("s"))
        assert timeout > deploy.WS_PING_INTERVAL_S and timeout == 3600


def test_rest_and_health_routes(conf: str) -> None:
    for route, target in REST_ROUTES.items():
        found = directives(block(conf, f"location {route}"))
        assert found["proxy_pass"] == [target], route
        if "health" in route or "ready" in route:
            assert "limit_conn" not in found, route  # probes pass when clients are refused
    https = conf[conf.index("ssl_certificate ") :]
    assert "return 404" in block(https, "location /")  # /metrics and the rest stay private


def page_fetches() -> set[str]:
    """The paths the browser page asks for with fetch() (services/gateway/static/app.js)."""
    script = Path(__file__).resolve().parents[2] / "services/gateway/static/app.js"
    return set(re.findall(r"""fetch\(\s*["'`](/[^"'`?]*)""", script.read_text()))


def test_every_path_the_browser_page_fetches_is_routed(conf: str) -> None:
    """Each reaches a service, not the catch-all 404 (`GET /v1/agents` used to)."""
    https = conf[conf.index("ssl_certificate ") :]
    exact = set(re.findall(r"location = (\S+) \{", https))
    prefixes = set(re.findall(r"location (/\S+) \{", https)) - {"/"}
    fetched = page_fetches()
    assert {"/v1/agents", "/v1/voices"} <= fetched
    for path in fetched:
        assert path in exact or any(path.startswith(p) for p in prefixes), path


def test_access_log_has_no_query_string_or_headers(conf: str) -> None:
    log_format = conf[conf.index("log_format va_access") : conf.index("access_log ")]
    assert "$uri" in log_format
    for leaky in ("$request_uri", "$request ", "$args", "$query_string", "$http_", '$request"'):
        assert leaky not in log_format, leaky
    assert re.search(r"access_log \S+/voice-agent\.access\.log va_access;", conf)


@pytest.mark.parametrize(
    "bad",
    [
        {"ws_timeout_s": 20},
        {"conn_per_ip": 0},
        {"gateways": ("127.0.0.1:8000; include /etc/passwd",)},
        {"gateways": ()},
        {"server_name": "a;b"},
    ],
)
def test_bad_sites_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        render_nginx(NginxSite(**bad))  # type: ignore[arg-type]


def test_cli_renders_to_a_file(tmp_path: Path) -> None:
    out = tmp_path / "nginx.conf"
    args = ["nginx", "--gateway", "127.0.0.1:8000", "--gateway", "127.0.0.1:8010"]
    deploy.main([*args, "--https-port", "8443", "--conn-per-ip", "5", "--out", str(out)])
    text = out.read_text()
    assert "server 127.0.0.1:8010 max_fails=3" in text and "listen 0.0.0.0:8443 ssl;" in text
    assert "limit_conn va_per_ip 5;" in text


@pytest.mark.skipif(deploy.nginx_binary() is None, reason="nginx is not installed")
def test_rendered_config_passes_nginx_t(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    site = NginxSite(tls_cert=cert, tls_key=key, gateways=("127.0.0.1:8000", "127.0.0.1:8010"))
    sandboxed = site.sandboxed(tmp_path)
    prepare_dirs(sandboxed)
    (tmp_path / "nginx.conf").write_text(render_nginx(sandboxed))
    passed, said = check_nginx(tmp_path / "nginx.conf", tmp_path)
    assert passed, said
    (tmp_path / "broken.conf").write_text(render_nginx(sandboxed).replace("least_conn;", "lc;"))
    passed, said = check_nginx(tmp_path / "broken.conf", tmp_path)
    assert not passed and "unknown directive" in said
