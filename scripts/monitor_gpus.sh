#!/usr/bin/env bash
# GPUs (nvidia-smi) and the services' /health, on one screen.
#
#   scripts/monitor_gpus.sh              refresh every second until Ctrl-C
#   scripts/monitor_gpus.sh --interval 5 refresh every 5 seconds
#   scripts/monitor_gpus.sh --once       one sample, then exit
#
# Environment: VA_MONITOR_ASR_URL (default http://127.0.0.1:8001),
# VA_MONITOR_TTS_URL (http://127.0.0.1:8002), VA_MONITOR_GATEWAY_URL
# (http://127.0.0.1:8000; several, space-separated), VA_MONITOR_TIMEOUT (seconds per
# /health request, default 1), VA_MONITOR_SMI_TIMEOUT (seconds nvidia-smi may take, default
# 5: a wedged driver can hang it), VA_API_KEY (an API key or client token, sent as a bearer
# token: /health gives its details only with one when VA_AUTH__PROTECT_OPS is on). A host
# without GPUs (no nvidia-smi, or no driver) is reported as such; the script still exits 0.
set -uo pipefail

QUERY=index,name,temperature.gpu,utilization.gpu,utilization.memory,memory.used,memory.total
once=0
interval=1

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --once) once=1; shift ;;
    --interval)
      interval=${2:-}
      if ! [[ $interval =~ ^[0-9]+([.][0-9]+)?$ ]] || [[ $interval =~ ^0+([.]0*)?$ ]]; then
        echo "monitor_gpus: --interval needs a positive number of seconds" >&2
        exit 2
      fi
      shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "monitor_gpus: unknown option: $1" >&2; usage >&2; exit 2 ;;
  esac
done

gpu_table() {
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "no GPUs: nvidia-smi not found (a CPU host, or the NVIDIA driver is not installed)"
    return 0
  fi
  local out status limit=${VA_MONITOR_SMI_TIMEOUT:-5} bounded=()
  command -v timeout >/dev/null 2>&1 && bounded=(timeout -k 2 "$limit")
  out=$("${bounded[@]}" nvidia-smi --query-gpu="$QUERY" --format=csv,noheader,nounits 2>&1)
  status=$?
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "no GPUs: nvidia-smi did not answer within $limit s (a hung driver? see dmesg)"
    return 0
  fi
  if [ "$status" -ne 0 ]; then
    echo "no GPUs: nvidia-smi failed: $(head -n 1 <<<"$out")"
    return 0
  fi
  if [ -z "$out" ]; then
    echo "no GPUs: nvidia-smi lists none"
    return 0
  fi
  awk -F', *' '
    function unit(value, suffix) { return (value ~ /^[0-9.]+$/) ? value suffix : value }
    BEGIN { printf "%-4s %-28s %6s %6s %7s %19s\n", "GPU", "NAME", "TEMP", "UTIL", "MEMUTIL", "MEMORY (MiB)" }
    NF >= 7 {
      printf "%-4s %-28s %6s %6s %7s %19s\n", $1, substr($2, 1, 28), unit($3, "C"),
        unit($4, "%"), unit($5, "%"), $6 " / " $7
    }' <<<"$out"
}

summarize() {  # one /health JSON document on stdin → one line
  python3 -c '
import json, sys
h = json.load(sys.stdin)
if set(h) <= {"status", "service"}:  # the brief reply: ops routes protected, no credential
    said = "was not accepted" if sys.argv[1] else "is not set"
    print("%s; details need a credential (VA_AUTH__PROTECT_OPS): VA_API_KEY %s"
          % (h.get("status", "?"), said))
    sys.exit(0)
ready = h.get("model_loaded") and h.get("redis") == "ok" and not h.get("draining")
parts = ["%s=%s" % (k, h[k]) for k in ("engine", "device") if h.get(k)]
parts.append("ready" if ready else "NOT-READY")
parts.append("conns=%s" % h.get("active_connections", "?"))
parts.append("queue=%s" % h.get("queue_depth", "?"))
if "sessions" in h:
    parts.append("sessions=%s" % h["sessions"])
gpu = h.get("gpu") or {}
if gpu.get("available"):
    gib = float(1 << 30)
    used, total = gpu["memory_reserved"] / gib, gpu["memory_total"] / gib
    parts.append("gpu%s %.1f/%.1f GiB" % (gpu["id"], used, total))
print(" ".join(parts))
' "${VA_API_KEY:+key}" 2>/dev/null || echo "(unparsed /health)"
}

fetch() {  # URL: its body, with VA_API_KEY as a bearer token (read from stdin, never in ps)
  local config=""
  [ -z "${VA_API_KEY:-}" ] || config="header = \"Authorization: Bearer ${VA_API_KEY}\""
  printf '%s\n' "$config" | curl -fsS --max-time "${VA_MONITOR_TIMEOUT:-1}" --config - "$1"
}

health_line() {  # NAME URL
  local body
  if ! command -v curl >/dev/null 2>&1; then
    printf "%-8s %-28s ?    curl not found\n" "$1" "$2"
    return 0
  fi
  if body=$(fetch "$2/health" 2>/dev/null); then
    printf "%-8s %-28s UP   %s\n" "$1" "$2" "$(summarize <<<"$body")"
  else
    printf "%-8s %-28s DOWN\n" "$1" "$2"
  fi
}

sample() {
  echo "voice-agent  $(date '+%Y-%m-%d %H:%M:%S')"
  echo
  gpu_table
  echo
  health_line asr "${VA_MONITOR_ASR_URL:-http://127.0.0.1:8001}"
  health_line tts "${VA_MONITOR_TTS_URL:-http://127.0.0.1:8002}"
  local url
  for url in ${VA_MONITOR_GATEWAY_URL:-http://127.0.0.1:8000}; do
    health_line gateway "$url"
  done
}

if [ "$once" -eq 1 ]; then
  sample
  exit 0
fi
trap 'exit 0' INT TERM
while true; do
  screen=$(sample)
  if [ -t 1 ]; then printf '\033[H\033[2J'; else echo "----"; fi
  printf '%s\n' "$screen"
  sleep "$interval"
done
