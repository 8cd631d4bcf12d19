# Sourced by the images' pip steps: the build host's pip configuration, where the build was
# given it as secrets (scripts/build_images.sh passes them; without them pip uses PyPI).
#   pip_conf   a pip configuration file           -> PIP_CONFIG_FILE
#   pip_env    KEY=VALUE lines (PIP_INDEX_URL, ...) -> exported for this step
#   ca_bundle  a CA bundle, mounted by the step itself at /etc/ssl/certs/ca-certificates.crt
# Secrets are mounted for one RUN step only; nothing here is written to a layer.
if [ -f /run/secrets/pip_conf ]; then
  export PIP_CONFIG_FILE=/run/secrets/pip_conf
fi
if [ -f /run/secrets/pip_env ]; then
  set -a
  . /run/secrets/pip_env
  set +a
fi
