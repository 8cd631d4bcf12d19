#!/usr/bin/env bash
# Build the full-duplex service's own environment (make install-duplex):
#
#   .venv-duplex  torch first (CPU, or this host's CUDA build), then moshi WITHOUT its
#                 dependencies (it pins torch<2.10 and would pull a CUDA build of several GB
#                 on its own) plus the packages it really imports, then this project.
#
# torch and moshi never reach .venv (ASR, TTS with Piper, the gateway) this way.
#
# Usage: scripts/install_duplex.sh [--dry-run] [--tests] [--cpu | --cuda cu126|cu128|cu130]
#   --dry-run  print the commands instead of running them
#   --tests    also install what the duplex tests need (pytest and its plugins): make test
#   --cpu      the CPU build of torch (default when nvidia-smi finds no GPU)
#   --cuda TAG PyTorch's CUDA wheel index to use; default on a GPU host: from the driver
# Environment: PYTHON (python3), VENV_DUPLEX (.venv-duplex),
#   TORCH_CUDA_VERSION (2.9.1: the newest moshi 0.2.13 allows), TORCH_CPU_VERSION (2.13.0),
#   DUPLEX_TORCH_INDEX (an index for the CPU build, e.g. https://download.pytorch.org/whl/cpu;
#   unset: pip's own configuration, which on the project's CI machines holds a CPU wheel)
set -euo pipefail

PYTHON="${PYTHON:-python3}"
VENV_DUPLEX="${VENV_DUPLEX:-.venv-duplex}"
TORCH_CUDA_VERSION="${TORCH_CUDA_VERSION:-2.9.1}"
TORCH_CPU_VERSION="${TORCH_CPU_VERSION:-2.13.0}"
MOSHI_VERSION="0.2.13"
DRY_RUN=0
TESTS=0
TARGET=""

while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --tests) TESTS=1 ;;
    --cpu) TARGET=cpu ;;
    --cuda) TARGET="${2:?--cuda needs a tag such as cu126}"; shift ;;
    --cuda=*) TARGET="${1#--cuda=}" ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "install_duplex: unknown argument $1 (try --help)" >&2; exit 2 ;;
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

# The newest PyTorch CUDA build of TORCH_CUDA_VERSION (2.9: cu126, cu128, cu130) that the
# installed driver runs.
detect_cuda_tag() {
  local version major minor
  version="$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n1)"
  [ -n "$version" ] || return 1
  major="${version%%.*}"
  minor="${version#*.}"
  if [ "$major" -gt 12 ]; then
    echo cu130
  elif [ "$major" -eq 12 ] && [ "$minor" -ge 8 ]; then
    echo cu128
  elif [ "$major" -eq 12 ] && [ "$minor" -ge 6 ]; then
    echo cu126
  else
    echo "install_duplex: the driver supports CUDA $version; torch $TORCH_CUDA_VERSION needs 12.6+" >&2
    return 1
  fi
}

if [ -z "$TARGET" ]; then
  if TARGET="$(detect_cuda_tag)"; then
    echo "# driver supports ${TARGET}: torch ${TORCH_CUDA_VERSION} from the PyTorch ${TARGET} wheels"
  else
    TARGET=cpu
    echo "# no NVIDIA driver found (nvidia-smi): the CPU build of torch ${TORCH_CPU_VERSION}"
  fi
fi

[ -x "${VENV_DUPLEX}/bin/python" ] || run "$PYTHON" -m venv "$VENV_DUPLEX"
PIP=("${VENV_DUPLEX}/bin/python" -m pip install -q)
run "${VENV_DUPLEX}/bin/python" -m pip install -q --upgrade pip

echo "# 1/4 torch"
if [ "$TARGET" = cpu ]; then
  if [ -n "${DUPLEX_TORCH_INDEX:-}" ]; then
    run "${PIP[@]}" "torch==${TORCH_CPU_VERSION}" --index-url "$DUPLEX_TORCH_INDEX"
  else
    run "${PIP[@]}" "torch==${TORCH_CPU_VERSION}"
  fi
else
  run "${PIP[@]}" "torch==${TORCH_CUDA_VERSION}" --index-url "https://download.pytorch.org/whl/${TARGET}"
fi

echo "# 2/4 moshi ${MOSHI_VERSION} without its pins, and what it imports"
run "${PIP[@]}" --no-deps "moshi==${MOSHI_VERSION}"
# numpy<2.3 is moshi's own bound; bitsandbytes (8-bit checkpoints), aiohttp and sounddevice
# (its reference server and client) are left out: this service uses neither.
run "${PIP[@]}" "numpy>=1.26,<2.3" "safetensors>=0.4,<0.8" "einops>=0.7,<0.9" \
  "sentencepiece>=0.2,<0.3" "sphn>=0.2,<0.3" "huggingface-hub>=0.24,<1.0"

echo "# 3/4 this project (the service's own dependencies), numpy kept where moshi wants it"
run "${PIP[@]}" -e . "numpy>=1.26,<2.3"

if [ "$TESTS" -eq 1 ]; then
  echo "# 4/4 the duplex tests' tools"
  run "${PIP[@]}" "pytest>=8" "pytest-asyncio>=0.24" "pytest-timeout>=2.3" "numpy>=1.26,<2.3"
else
  echo "# 4/4 (no test tools: pass --tests for them)"
fi

run "${VENV_DUPLEX}/bin/python" -c \
  "import torch, moshi, sphn; print('torch', torch.__version__, 'moshi', moshi.__version__, 'CUDA:', torch.cuda.is_available())"

cat <<EOS
# done. Pull a checkpoint, then run the service from its environment:
#   ${VENV_DUPLEX}/bin/voice-agent models pull moshiko-pytorch-bf16 --dir models
#   VA_PROFILE=duplex ${VENV_DUPLEX}/bin/voice-agent duplex
# or a random-weight smoke model (no download; its speech is noise):
#   VA_DUPLEX__ENGINE=moshi-random ${VENV_DUPLEX}/bin/voice-agent duplex
EOS
