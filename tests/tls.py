"""A self-signed certificate for localhost and 127.0.0.1, made with the openssl CLI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def self_signed(folder: Path) -> tuple[Path, Path]:
    """(certificate, key) in `folder`; skips the test when there is no openssl."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl CLI not found (apt-get install openssl)")
    cert, key = folder / "cert.pem", folder / "key.pem"
    command = [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    command += ["-nodes", "-days", "2", "-subj", "/CN=localhost", "-keyout", str(key)]
    command += ["-out", str(cert), "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"]
    subprocess.run(command, check=True, capture_output=True, timeout=60)
    return cert, key
