"""numpy's BLAS threads: held to what each service's settings say, when its app is built."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from services.asr.app import create_app as asr_app
from services.asr.settings import AsrSettings
from services.common.platform.threads import limit_blas_threads
from services.gateway.app import create_app as gateway_app
from services.gateway.settings import GatewaySettings
from services.tts.app import create_app as tts_app
from services.tts.settings import TtsSettings


def blas() -> dict[str, int]:
    return {
        i["internal_api"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"
    }


@pytest.fixture(autouse=True)
def as_it_was() -> Iterator[None]:
    """Each test's limits are undone: the other tests run with the process's own."""
    before = blas()
    assert before, "numpy loaded no BLAS library that threadpoolctl can see"
    yield
    threadpool_limits(limits=before)


def test_blas_is_held_to_the_threads_asked_for() -> None:
    np.ones((64, 64)) @ np.ones((64, 64))
    assert set(limit_blas_threads(3).values()) == {3}
    assert set(limit_blas_threads(1).values()) == {1}
    assert set(blas().values()) == {1}
    assert set(limit_blas_threads(0).values()) == {1}  # 0 leaves it as it is


@pytest.mark.parametrize(
    "build",
    [
        lambda threads: asr_app(AsrSettings(profile="fake", blas_threads=threads)),
        lambda threads: tts_app(TtsSettings(profile="fake", blas_threads=threads)),
        lambda threads: gateway_app(GatewaySettings(profile="fake", blas_threads=threads)),
    ],
    ids=["asr", "tts", "gateway"],
)
def test_each_service_holds_blas_to_its_setting(build: Callable[[int], object]) -> None:
    limit_blas_threads(3)
    build(1)
    assert set(blas().values()) == {1}
    build(0)
    assert set(blas().values()) == {1}


def test_one_thread_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VA_BLAS_THREADS", raising=False)
    assert GatewaySettings().blas_threads == 1
    monkeypatch.setenv("VA_BLAS_THREADS", "0")
    assert AsrSettings().blas_threads == 0
