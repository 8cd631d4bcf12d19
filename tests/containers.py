"""Podman for the container tests: whether it can run here, and the images they use.

The images are built from this checkout by the same script a user runs
(scripts/build_images.sh), on a Debian base made offline (scripts/debian_base.sh): podman's
layer cache makes every build after the first one cheap. On these VMs podman needs `runc`
(crun refuses their hybrid cgroups) and no rlimits raised (`default_ulimits = []`): both
are in deploy/containers/containers.conf, used whenever runc is installed.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONTAINERS_CONF = REPO / "deploy" / "containers" / "containers.conf"
BASE = "localhost/debian:bookworm"
REDIS = "localhost/voice-agent-test/redis:bookworm"
REDIS_DOCKERFILE = REPO / "tests" / "fixtures" / "containers" / "redis.Dockerfile"
IMAGE_REPOSITORY = "ghcr.io/voice-agent/voice-agent"
BUILD_TIMEOUT_S = 1200


def version() -> str:
    """The project's version: the images' tag is `<version>-<variant>`."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return str(project["version"])


def image(variant: str) -> str:
    return f"{IMAGE_REPOSITORY}:{version()}-{variant}"


def podman_env() -> dict[str, str]:
    """The environment podman runs in (its configuration for these VMs where runc is here)."""
    env = dict(os.environ)
    if shutil.which("runc"):
        env["CONTAINERS_CONF"] = str(CONTAINERS_CONF)
    return env


@functools.cache
def podman_problem() -> str | None:
    """Why the container tests cannot run here, or None."""
    if shutil.which("podman") is None:
        return "podman is not installed (make test installs it on Debian: scripts/system_deps.sh)"
    info = subprocess.run(
        ["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"],
        env=podman_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if info.returncode != 0:
        return f"podman cannot run here: {info.stderr.strip()[-300:]}"
    base = subprocess.run(
        ["podman", "image", "exists", BASE], env=podman_env(), timeout=60, check=False
    )
    if base.returncode != 0 and (shutil.which("debootstrap") is None or os.geteuid() != 0):
        return f"no {BASE} image and no way to make one (debootstrap, as root)"
    return None


def run(args: list[str], timeout: float = BUILD_TIMEOUT_S, **env: str) -> float:
    """Run a build step; its seconds (AssertionError with its output's tail if it fails)."""
    start = time.monotonic()
    done = subprocess.run(
        args, cwd=REPO, env={**podman_env(), **env}, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return time.monotonic() - start


def build_images() -> dict[str, float]:
    """The Debian base (once), the lite image and the tests' Redis image; seconds each."""
    return {
        "base": run(["bash", "scripts/debian_base.sh", BASE]),
        "lite": run(["bash", "scripts/build_images.sh", "lite"], BASE=BASE),
        "redis": run(
            ["podman", "build", "--quiet", "--format", "docker", "--network", "host",
             "--build-arg", f"BASE={BASE}", "-f", str(REDIS_DOCKERFILE), "-t", REDIS,
             str(REDIS_DOCKERFILE.parent)]
        ),
    }  # fmt: skip


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip
