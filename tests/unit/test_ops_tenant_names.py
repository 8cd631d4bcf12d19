"""A tenant name is the whole string: `acme` followed by a newline is no tenant (with `$`,
it passed, and became a tenant of its own beside `acme`)."""

from __future__ import annotations

import pytest

from services.common.tenancy import TENANT
from services.ops import cli
from tests.conftest import RedisProc


@pytest.mark.parametrize("name", ["acme\n", "acme\r\n", "\nacme", "", "a" * 65, "bad tenant"])
def test_not_a_tenant_name(name: str) -> None:
    assert TENANT.match(name) is None


@pytest.mark.parametrize("name", ["acme", "a", "A.b_c-9", "a" * 64])
def test_a_tenant_name(name: str) -> None:
    assert TENANT.match(name) is not None


def test_keys_create_refuses_a_tenant_with_a_newline(
    redis_server: RedisProc, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    redis = redis_server.settings()
    monkeypatch.setenv("VA_REDIS__URL", redis.url)
    monkeypatch.setenv("VA_REDIS__PREFIX", redis.prefix)
    with pytest.raises(SystemExit, match="tenant"):
        cli.main(["keys", "create", "--tenant", "acme\n"])
    assert capsys.readouterr().out == ""  # no key printed
