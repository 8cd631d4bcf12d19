"""`VA_VAD__MODEL_PATH`: the Silero VAD file each service loads (default: the one in
faster-whisper's wheel); a path that is missing or not a model stops start-up, named."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from services.asr.app import create_app as asr_app
from services.asr.settings import AsrSettings
from services.common.audio.vad import SileroVad, VadSettings, default_model_path
from services.common.errors import EngineUnavailable
from services.gateway.app import create_app as gateway_app
from services.gateway.settings import GatewaySettings

Build = Callable[[VadSettings], FastAPI]
SERVICES: dict[str, Build] = {
    "asr": lambda vad: asr_app(AsrSettings(profile="fake", vad=vad)),
    "gateway": lambda vad: gateway_app(GatewaySettings(profile="fake", vad=vad)),
}


def test_the_given_file_is_the_one_loaded(tmp_path: Path) -> None:
    copy = tmp_path / "my_vad.onnx"
    shutil.copyfile(default_model_path(), copy)
    audio = (np.random.default_rng(1).standard_normal(8192) * 0.1).astype(np.float32)
    want = SileroVad().new_stream().push(audio)
    np.testing.assert_allclose(SileroVad(copy).new_stream().push(audio), want, atol=1e-6)
    copy.write_bytes(b"not an onnx model")
    with pytest.raises(EngineUnavailable, match=f"{re.escape(str(copy))}.*could not be loaded"):
        SileroVad(copy)


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_each_service_loads_the_vad_file_its_setting_names(tmp_path: Path, service: str) -> None:
    """A file that is not a model stops start-up naming it (the setting used to be read by
    nobody: the packaged model loaded whatever it said)."""
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not an onnx model")
    app = SERVICES[service](VadSettings(model_path=junk))
    with pytest.raises(EngineUnavailable, match=re.escape(str(junk))), TestClient(app):
        pass


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_a_missing_vad_file_names_itself_and_the_setting(tmp_path: Path, service: str) -> None:
    missing = tmp_path / "nope.onnx"
    app = SERVICES[service](VadSettings(model_path=missing))
    wanted = f"not found at {re.escape(str(missing))}.*VA_VAD__MODEL_PATH"
    with pytest.raises(EngineUnavailable, match=wanted), TestClient(app):
        pass
