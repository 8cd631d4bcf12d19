#!/usr/bin/env bash
# Build the container images from this checkout (docs/containers.md):
#
#   lite        CPU: faster-whisper tiny.en + Piper + Smart Turn, weights in the image
#   gpu         CUDA runtime base: faster-whisper on GPU 0 (weights from a /models volume)
#   chatterbox  chatterbox TTS with its own torch pins, on GPU 1 (weights from /models)
#
# Usage: scripts/build_images.sh [lite|gpu|chatterbox ...] [-- EXTRA BUILD ARGS]
#   default: lite. Environment:
#   ENGINE   podman or docker (default: podman if installed, else docker)
#   IMAGE    repository (default ghcr.io/voice-agent/voice-agent; tag <version>-<variant>)
#   BASE     the base image build argument (default: each Dockerfile's public one)
#   PIP_BUILD_CONFIG  a pip.conf to pass to the build verbatim (as the secret pip_conf)
#
# The host's pip configuration reaches the build as build secrets, mounted for the pip step
# only and never written to a layer: the network settings of `pip config list` and of the
# PIP_* environment (index URLs, trusted hosts, proxy, timeout) as `pip_env`, and the CA
# bundle pip is told to trust (`cert`, PIP_CERT) as `ca_bundle`. Settings that name files
# of this host (find-links, constraints, file:// indexes) are left out: the build cannot
# see them.
set -euo pipefail
cd "$(dirname "$0")/.."
variants=()
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    lite|gpu|chatterbox) variants+=("$1") ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "build_images: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
[ ${#variants[@]} -gt 0 ] || variants=(lite)
engine="${ENGINE:-$(command -v podman >/dev/null 2>&1 && echo podman || echo docker)}"
image="${IMAGE:-ghcr.io/voice-agent/voice-agent}"
version="$(sed -n 's/^version *= *"\(.*\)"/\1/p' pyproject.toml | head -n1)"
revision="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"

secrets="$(mktemp -d)"
trap 'rm -rf "$secrets"' EXIT
chmod 700 "$secrets"
python3 - "$secrets" <<'PY'
"""Write pip_env (and copy the CA bundle) from this host's pip settings."""
import os, shutil, subprocess, sys
from pathlib import Path

out = Path(sys.argv[1])
keys = {"index-url", "extra-index-url", "trusted-host", "proxy", "timeout", "retries",
        "default-timeout", "cert"}
found: dict[str, str] = {}
try:
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                            capture_output=True, text=True, timeout=30, check=False).stdout
except (OSError, subprocess.SubprocessError):
    listed = ""
for line in listed.splitlines():
    name, _, value = line.partition("=")
    key = name.split(".", 1)[-1]
    if key in keys:
        found[key] = value.strip().strip("'\"")
for key in keys:  # the environment wins, as for pip itself
    value = os.environ.get("PIP_" + key.upper().replace("-", "_"))
    if value:
        found[key] = value
cert = found.pop("cert", "") or os.environ.get("REQUESTS_CA_BUNDLE", "")
if cert and Path(cert).is_file():
    shutil.copyfile(cert, out / "ca_bundle")
    found["cert"] = "/etc/ssl/certs/ca-certificates.crt"  # where the step mounts it
lines = []
for key, value in sorted(found.items()):
    if key.endswith("index-url"):  # file:// indexes are this host's folders
        value = " ".join(u for u in value.split() if u.startswith(("http://", "https://")))
    if value:
        lines.append(f"PIP_{key.upper().replace('-', '_')}='{value}'\n")
(out / "pip_env").write_text("".join(lines))
PY
secret_args=(--secret "id=pip_env,src=$secrets/pip_env")
[ -f "$secrets/ca_bundle" ] && secret_args+=(--secret "id=ca_bundle,src=$secrets/ca_bundle")
[ -n "${PIP_BUILD_CONFIG:-}" ] && secret_args+=(--secret "id=pip_conf,src=$PIP_BUILD_CONFIG")

base_args=()
[ -n "${BASE:-}" ] && base_args+=(--build-arg "BASE=$BASE")
# podman: the docker image format (OCI images cannot carry a HEALTHCHECK) and the host's
# network for the build steps (what these VMs allow; harmless elsewhere)
engine_args=()
[ "$engine" = podman ] && engine_args+=(--format docker --network host)
for variant in "${variants[@]}"; do
  tag="$image:$version-$variant"
  echo "build_images: $tag" >&2
  "$engine" build -f "deploy/containers/$variant.Dockerfile" -t "$tag" \
    --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
    "${base_args[@]}" "${secret_args[@]}" "${engine_args[@]}" "${extra[@]}" .
done
