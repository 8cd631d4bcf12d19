"""The lite image and compose.yaml with podman: build times, image size, start-to-ready.

    python -m benchmarks.containers --cold --out benchmarks/results/containers_lite.json

Measures, on this machine: making the Debian base (scripts/debian_base.sh), building the
lite image cold (`--cold`: the images, podman's build cache and the pip cache mount are
removed first), again with nothing changed (the layer cache), and again after a one-line
change to the code (in a copy of the checkout: only the `app` stage rebuilds); the image's
size (uncompressed, and gzip-compressed as a registry would carry it with `--compressed`);
and, `--runs` times, compose.yaml from nothing to every service healthy (tests/compose_runner.py,
as in tests/e2e/test_containers.py).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from services.loadtest.report import write
from services.ops.redis_server import free_port
from tests import containers
from tests.compose_runner import Project, load

PIP_CACHE_MOUNTS = Path("/var/tmp")


def cold_start() -> None:
    """No image, no build cache, no pip cache mount: what a fresh machine has."""
    for image in (containers.image("lite"), containers.BASE, containers.REDIS):
        containers.podman("rmi", "-f", image)
    containers.podman("system", "prune", "--all", "--force", timeout=600)
    for cache in PIP_CACHE_MOUNTS.glob("buildah-cache*"):
        shutil.rmtree(cache, ignore_errors=True)


def changed_copy(to: Path) -> Path:
    """The checkout's files with one line added to a module (a code change)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=containers.REPO, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    for name in filter(None, listed):
        source = containers.REPO / name.decode()
        if source.is_file():
            (to / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name.decode())
    target = to / "services" / "ops" / "healthcheck.py"
    target.write_text(target.read_text() + f"\n# {uuid.uuid4().hex}\n")
    return to


def image_size(compressed: bool) -> dict[str, int]:
    shown = json.loads(containers.podman("image", "inspect", containers.image("lite")).stdout)[0]
    sizes = {"uncompressed_bytes": int(shown["Size"])}
    if compressed:
        with tempfile.TemporaryDirectory() as tmp:
            archive = Path(tmp) / "lite.tar"
            containers.podman("save", "-o", str(archive), containers.image("lite"), timeout=600)
            with archive.open("rb") as raw, gzip.open(Path(tmp) / "lite.tar.gz", "wb", 6) as out:
                shutil.copyfileobj(raw, out, 1 << 20)
            sizes["gzip_bytes"] = (Path(tmp) / "lite.tar.gz").stat().st_size
    return sizes


def start_to_ready() -> dict[str, Any]:
    ports = {name: str(free_port()) for name in ("GATEWAY", "ASR", "TTS")}
    env = {"VOICE_AGENT_REDIS_IMAGE": containers.REDIS}
    env |= {f"VOICE_AGENT_{name}_PORT": port for name, port in ports.items()}
    model = load([containers.REPO / "compose.yaml"], env)
    project = Project(f"va-bench-{uuid.uuid4().hex[:6]}", model, containers.REPO,
                      containers.podman_env())  # fmt: skip
    try:
        start = time.monotonic()
        healthy = project.up(timeout_s=300)
        total = time.monotonic() - start
        codes = project.stop()
    finally:
        project.down()
    return {
        "ready_s": round(total, 2),
        "healthy_at_s": {name: round(s, 2) for name, s in healthy.items()},
        "stop_exit_codes": codes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cold", action="store_true", help="remove images and caches first")
    parser.add_argument("--compressed", action="store_true", help="also gzip the image")
    parser.add_argument("--runs", type=int, default=3, help="compose start-to-ready runs")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    problem = containers.podman_problem()
    if problem:
        raise SystemExit(problem)
    if args.cold:
        cold_start()
    timings = {"cold": args.cold}
    timings["base_s"] = round(containers.run(["bash", "scripts/debian_base.sh"]), 1)
    build = ["bash", "scripts/build_images.sh", "lite"]
    timings["lite_build_s"] = round(containers.run(build, BASE=containers.BASE), 1)
    timings["lite_rebuild_unchanged_s"] = round(containers.run(build, BASE=containers.BASE), 1)
    with tempfile.TemporaryDirectory() as tmp:
        copy = changed_copy(Path(tmp))
        started = time.monotonic()
        containers.run(["bash", str(copy / "scripts" / "build_images.sh"), "lite"],
                       BASE=containers.BASE)  # fmt: skip
        timings["lite_rebuild_code_change_s"] = round(time.monotonic() - started, 1)
    containers.build_images()  # the original code's image back, and the tests' Redis
    results = {
        "builds": timings,
        "image": image_size(args.compressed),
        "compose_start_to_ready": [start_to_ready() for _ in range(args.runs)],
    }
    write(args.out, {"benchmark": "containers", "results": results})
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
