#!/usr/bin/env bash
# Build the two environments of a dual-GPU host (make install-gpu):
#
#   .venv      ASR + gateway: this project with the `faster-whisper` extra (CTranslate2).
#   .venv-tts  TTS: torch/torchaudio built for this host's CUDA first, then chatterbox-tts
#              WITHOUT its dependencies (it pins torch==2.6.0, numpy<2, gradio, ...) plus
#              the packages it really imports, then this project --no-deps plus the few
#              packages the TTS service needs.
#
# chatterbox's pins never reach the ASR/gateway environment this way. Last, the gateway's
# Smart Turn model (semantic end of turn, 9 MB) goes into MODELS_DIR, as `make run` does:
# without it the default policy `auto` falls back to the slower silence rule.
#
# Usage: scripts/install_gpu.sh [--dry-run] [--cuda cu118|cu124|cu126] [--models-dir DIR]
#   --dry-run         print the commands instead of running them
#   --cuda TAG        PyTorch wheel index to use; default: from the driver (nvidia-smi)
#   --models-dir DIR  where the models go (the gateway's VA_GATEWAY__MODELS_DIR); the
#                     systemd install reads /var/lib/voice-agent/models. Default: models
# Environment: PYTHON (python3), VENV (.venv), VENV_TTS (.venv-tts), TORCH_VERSION (2.6.0),
# MODELS_DIR (models)
set -euo pipefail

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
VENV_TTS="${VENV_TTS:-.venv-tts}"
TORCH_VERSION="${TORCH_VERSION:-2.6.0}"
MODELS_DIR="${MODELS_DIR:-models}"
DRY_RUN=0
CUDA_TAG=""

while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --cuda) CUDA_TAG="${2:?--cuda needs a tag such as cu124}"; shift ;;
    --cuda=*) CUDA_TAG="${1#--cuda=}" ;;
    --models-dir) MODELS_DIR="${2:?--models-dir needs a folder}"; shift ;;
    --models-dir=*) MODELS_DIR="${1#--models-dir=}" ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "install_gpu: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done

run() {
  printf '+'
  printf ' %q' "$@"
  printf '\n'
  if [ "$DRY_RUN" -eq 0 ]; then
    "$@"
  fi
}

# The newest PyTorch CUDA build (for TORCH_VERSION 2.6) that the installed driver can run.
detect_cuda_tag() {
  local version major minor
  version="$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n1)"
  [ -n "$version" ] || return 1
  major="${version%%.*}"
  minor="${version#*.}"
  if [ "$major" -gt 12 ] || { [ "$major" -eq 12 ] && [ "$minor" -ge 6 ]; }; then
    echo cu126
  elif [ "$major" -eq 12 ] && [ "$minor" -ge 4 ]; then
    echo cu124
  elif [ "$major" -ge 12 ] || { [ "$major" -eq 11 ] && [ "$minor" -ge 8 ]; }; then
    echo cu118
  else
    echo "install_gpu: the driver supports CUDA $version; PyTorch $TORCH_VERSION needs 11.8+" >&2
    return 1
  fi
}

if [ -z "$CUDA_TAG" ]; then
  if CUDA_TAG="$(detect_cuda_tag)"; then
    echo "# driver supports ${CUDA_TAG}: using the PyTorch ${CUDA_TAG} wheels"
  elif [ "$DRY_RUN" -eq 1 ]; then
    CUDA_TAG=cu124
    echo "# no NVIDIA driver found (nvidia-smi): showing the commands for --cuda ${CUDA_TAG}"
  else
    echo "install_gpu: no NVIDIA driver found (nvidia-smi failed): install the driver," \
      "or pass --cuda cu118|cu124|cu126" >&2
    exit 1
  fi
fi
TORCH_INDEX="https://download.pytorch.org/whl/${CUDA_TAG}"

echo "# 1/2 ${VENV}: ASR (faster-whisper on GPU 0) and the gateway"
[ -x "${VENV}/bin/python" ] || run "$PYTHON" -m venv "$VENV"
run "${VENV}/bin/python" -m pip install -q --upgrade pip
run "${VENV}/bin/python" -m pip install -q -e ".[faster-whisper]"
# CTranslate2's CUDA 12 wheels load cuBLAS 12 at run time; the pip build of it is enough.
run "${VENV}/bin/python" -m pip install -q "nvidia-cublas-cu12"

echo "# 2/2 ${VENV_TTS}: TTS (chatterbox on GPU 1)"
[ -x "${VENV_TTS}/bin/python" ] || run "$PYTHON" -m venv "$VENV_TTS"
PIP_TTS=("${VENV_TTS}/bin/python" -m pip install -q)
run "${VENV_TTS}/bin/python" -m pip install -q --upgrade pip
run "${PIP_TTS[@]}" "torch==${TORCH_VERSION}" "torchaudio==${TORCH_VERSION}" \
  --index-url "$TORCH_INDEX"
run "${PIP_TTS[@]}" --no-deps "chatterbox-tts>=0.1.7"
run "${PIP_TTS[@]}" "numpy>=1.26,<2" librosa s3tokenizer "transformers==5.2.*" \
  "diffusers==0.29.*" resemble-perth conformer safetensors omegaconf pyloudnorm \
  "setuptools<81" huggingface_hub
run "${PIP_TTS[@]}" --no-deps -e .
run "${PIP_TTS[@]}" "fastapi>=0.115" "uvicorn[standard]>=0.30" "websockets>=13" "redis>=5.0" \
  "httpx>=0.27" "prometheus-client>=0.20" "pydantic>=2.7" "pydantic-settings>=2.3" \
  "python-multipart>=0.0.9" "soxr>=0.4" "av>=12" "nvidia-ml-py>=12" "espeakng-loader>=0.2" \
  "threadpoolctl>=3.1"

echo "# Smart Turn (the gateway's end-of-turn model) into ${MODELS_DIR}"
run "${VENV}/bin/voice-agent" models pull smart-turn --dir "$MODELS_DIR"

echo "# checks"
run "${VENV}/bin/python" -c \
  "import ctranslate2; print('ctranslate2', ctranslate2.__version__, 'GPUs:', ctranslate2.get_cuda_device_count())"
run "${VENV_TTS}/bin/python" -c \
  "import torch, chatterbox.tts; print('torch', torch.__version__, 'CUDA:', torch.cuda.is_available(), 'GPUs:', torch.cuda.device_count())"

cat <<EOF
# done. If the ASR check saw no GPU but nvidia-smi does, let CTranslate2 find cuBLAS:
#   export LD_LIBRARY_PATH="\$(${VENV}/bin/python -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))')"
# Pull the weights, then run each service from its own environment:
#   ${VENV}/bin/voice-agent models pull faster-whisper-large-v3-turbo --dir ${MODELS_DIR}
#   ${VENV}/bin/voice-agent models pull chatterbox --dir ${MODELS_DIR}
#   VA_PROFILE=dual-gpu ${VENV}/bin/voice-agent asr
#   VA_PROFILE=dual-gpu ${VENV_TTS}/bin/voice-agent tts
#   VA_PROFILE=dual-gpu VA_GATEWAY__MODELS_DIR=${MODELS_DIR} ${VENV}/bin/voice-agent gateway
EOF
