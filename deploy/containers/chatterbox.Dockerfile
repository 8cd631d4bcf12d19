# syntax=docker/dockerfile:1
# The `chatterbox` image: the TTS service with chatterbox on a GPU, the dual-gpu profile's
# GPU 1. Its own environment, as scripts/install_gpu.sh builds .venv-tts: torch/torchaudio
# 2.6.0 (PyPI's CUDA 12.4 builds, which bring their CUDA libraries), chatterbox-tts --no-deps
# plus what it really imports; chatterbox's pins never reach the other images. The driver
# comes from the host (NVIDIA Container Toolkit). No weights inside: they are read from
# /models, a volume filled by `voice-agent models pull chatterbox --dir /models`.
#
#   scripts/build_images.sh chatterbox      (docs/containers.md)
#
# BASE: any Debian bookworm image (torch's wheels carry the CUDA user-space libraries).
ARG BASE=docker.io/library/debian:bookworm-slim

FROM ${BASE} AS deps
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
RUN python3 -m venv /opt/venv
# Wheels only, except where a package exists only as source (docopt, which num2words
# needs): it builds with the hash-pinned setuptools and wheel of build.txt, never with
# tools fetched unpinned. Every file is checked against the lock's SHA-256 either way.
# The host's pip configuration, when the build needs one (a private index, a proxy's CA),
# comes in as build secrets mounted for this step only: never in a layer (and this
# stage is not shipped). scripts/build_images.sh passes them.
COPY deploy/containers/requirements/ /tmp/requirements/
COPY deploy/containers/pip-secrets.sh /usr/local/bin/pip-secrets
RUN --mount=type=secret,id=pip_conf --mount=type=secret,id=pip_env \
    --mount=type=secret,id=ca_bundle,target=/etc/ssl/certs/ca-certificates.crt \
    --mount=type=cache,target=/root/.cache/pip \
    . /usr/local/bin/pip-secrets \
    && /opt/venv/bin/pip install --no-input --only-binary :all: --require-hashes \
        -r /tmp/requirements/build.txt \
    && /opt/venv/bin/pip install --no-input --require-hashes --no-build-isolation \
        -r /tmp/requirements/chatterbox.txt \
    && /opt/venv/bin/pip install --no-input --only-binary :all: --require-hashes --no-deps \
        -r /tmp/requirements/chatterbox-tts.txt

# The environment as shipped: without pip (nothing installs at run time).
FROM deps AS venv
RUN /opt/venv/bin/pip uninstall --yes --no-input pip

# This project, built apart as a small tree laid over the environment: a change to the
# code rebuilds this stage and one small layer of the image, never the dependencies.
FROM deps AS app
COPY pyproject.toml README.md /src/
COPY services/ /src/services/
RUN site="$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
    && /opt/venv/bin/pip install --no-input --no-deps --no-build-isolation --no-cache-dir \
        --target /tmp/app /src \
    && mkdir -p "/out/opt/venv/bin" "/out$site" \
    && mv /tmp/app/bin/* /out/opt/venv/bin/ && rmdir /tmp/app/bin \
    && mv /tmp/app/* "/out$site/"

FROM ${BASE}
# gcc, libc6-dev and python3-dev: Triton builds its CUDA launcher with them the first time
# T3's step is compiled (VA_PROFILE=dual-gpu uses CUDA graphs: docs/engines.md); without
# them the compile fails at warm-up and the step is served eager, slower than real time.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 gcc libc6-dev python3-dev \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt \
        /var/log/dpkg.log /var/cache/debconf/*-old /var/lib/dpkg/*-old \
    && groupadd --system --gid 10001 voice-agent \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/voice-agent \
        --create-home --shell /usr/sbin/nologin voice-agent
COPY --from=venv /opt/venv /opt/venv
COPY --from=app /out/ /
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    HF_HOME=/models/.hf-home \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    VA_PROFILE=dual-gpu \
    VA_TTS__CHATTERBOX__MODELS_DIR=/models \
    VA_ASR__SERVER__HOST=0.0.0.0 \
    VA_TTS__SERVER__HOST=0.0.0.0 \
    VA_GATEWAY__SERVER__HOST=0.0.0.0
RUN mkdir -p /models && chown 10001:10001 /models
USER 10001:10001
WORKDIR /var/lib/voice-agent
VOLUME ["/models"]
EXPOSE 8002
# /ready of the service this container runs (found from its command line and settings).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "services.ops.healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["voice-agent"]
CMD ["tts"]
# Labels last: a new revision rebuilds only this layer.
ARG BASE
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="voice-agent (chatterbox)" \
      org.opencontainers.image.description="voice-agent TTS service on a GPU: chatterbox (torch 2.6, CUDA 12.4); weights from a /models volume" \
      org.opencontainers.image.source="https://github.com/voice-agent/voice-agent" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0 AND MIT AND BSD-3-Clause" \
      org.opencontainers.image.base.name="${BASE}" \
      io.voice-agent.licence-note="this project Apache-2.0; chatterbox-tts MIT; torch BSD-3-Clause; NVIDIA CUDA libraries (from PyPI wheels) under NVIDIA's licence agreements; chatterbox weights (pulled at deploy time) MIT"
