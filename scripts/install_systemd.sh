#!/usr/bin/env bash
# Install voice-agent's systemd units: render deploy/systemd/* (paths, user, ports, drain
# budget) into /etc/systemd/system, install the environment file if missing, create the
# service user and state folder, daemon-reload and enable the units. docs/deployment.md.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/install_systemd.sh [options]
  --install-dir DIR     the voice-agent checkout the units run from (default: this repo)
  --venv DIR            Python environment of ASR and gateways (default: INSTALL_DIR/.venv)
  --tts-venv DIR        Python environment of the chatterbox TTS (default: INSTALL_DIR/.venv-tts)
  --user NAME           service user, created if missing (default: voice-agent)
  --group NAME          service group (default: the user's name)
  --gateway-ports LIST  one gateway process per port, comma-separated (default: 8000)
  --asr-port N          (default: 8001)
  --tts-port N          (default: 8002)
  --env-file PATH       site settings (default: /etc/voice-agent/voice-agent.env)
  --state-dir DIR       models, caches; writable by the services (default: /var/lib/voice-agent)
  --drain-timeout S     seconds open sessions get on stop; TimeoutStopSec = 3 S + 15. Also
                        written into an existing env file. Default: what the env file
                        already says (its largest VA_*__SERVER__DRAIN_TIMEOUT_S), else 20
  --prefix DIR          write everything under DIR; no user, chown or systemctl (for tests)
  --no-enable           install only; do not enable the units
  --start               (re)start voice-agent.target afterwards
  --dry-run             print what would be done; change nothing
EOF
}

die() { echo "install_systemd: $*" >&2; exit 2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
install_dir=$repo venv="" tts_venv="" user=voice-agent group="" gateway_ports=8000
asr_port=8001 tts_port=8002 env_file=/etc/voice-agent/voice-agent.env
state_dir=/var/lib/voice-agent drain="" prefix="" enable=1 start=0 dry_run=0

while [ $# -gt 0 ]; do
  case "$1" in
    --install-dir) install_dir=${2:?}; shift 2 ;;
    --venv) venv=${2:?}; shift 2 ;;
    --tts-venv) tts_venv=${2:?}; shift 2 ;;
    --user) user=${2:?}; shift 2 ;;
    --group) group=${2:?}; shift 2 ;;
    --gateway-ports) gateway_ports=${2:?}; shift 2 ;;
    --asr-port) asr_port=${2:?}; shift 2 ;;
    --tts-port) tts_port=${2:?}; shift 2 ;;
    --env-file) env_file=${2:?}; shift 2 ;;
    --state-dir) state_dir=${2:?}; shift 2 ;;
    --drain-timeout) drain=${2:?}; shift 2 ;;
    --prefix) prefix=${2:?}; shift 2 ;;
    --no-enable) enable=0; shift ;;
    --start) start=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown option: $1" ;;
  esac
done

venv=${venv:-$install_dir/.venv}
tts_venv=${tts_venv:-$install_dir/.venv-tts}
group=${group:-$user}
gateway_ports=${gateway_ports//,/ }

# Validate everything before touching anything.
[[ $user =~ ^[a-z_][a-z0-9_-]*$ ]] || die "bad user name: $user"
[[ $group =~ ^[a-z_][a-z0-9_-]*$ ]] || die "bad group name: $group"
[ -z "$drain" ] || [[ $drain =~ ^[0-9]+$ ]] || die "--drain-timeout takes whole seconds: $drain"
for port in $asr_port $tts_port $gateway_ports; do
  if ! [[ $port =~ ^[0-9]+$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
    die "bad port: $port"
  fi
done
[ -n "$gateway_ports" ] || die "--gateway-ports is empty"
for path in "$install_dir" "$venv" "$tts_venv" "$env_file" "$state_dir"; do
  [[ $path == /* && $path != *[[:space:]@\|\&\\]* ]] || die "need an absolute path without spaces or @|&\\: $path"
done
[ -z "$prefix" ] || [[ $prefix == /* ]] || prefix=$(pwd)/$prefix
[ -f "$repo/deploy/systemd/voice-agent-asr.service" ] || die "templates not found under $repo/deploy/systemd"
if [ -z "$prefix" ] && [ "$dry_run" -eq 0 ] && [ "$(id -u)" -ne 0 ]; then
  die "run as root (or try --dry-run, or --prefix DIR)"
fi

protect_home=yes  # a checkout or state under a home folder must stay visible to the units
for path in "$install_dir" "$venv" "$tts_venv" "$state_dir"; do
  case "$path" in /home/*|/root/*|/run/user/*) protect_home=read-only ;; esac
done
unit_dir=$prefix/etc/systemd/system
drain_names=(VA_ASR__SERVER__DRAIN_TIMEOUT_S VA_TTS__SERVER__DRAIN_TIMEOUT_S VA_GATEWAY__SERVER__DRAIN_TIMEOUT_S)

env_drain() {  # the largest drain budget FILE sets, in whole seconds rounded up; empty if none
  awk -F= -v q="'" '
    /^[ \t]*VA_(ASR|TTS|GATEWAY)__SERVER__DRAIN_TIMEOUT_S[ \t]*=/ {
      v = $2; gsub(/[ \t"]/, "", v); gsub(q, "", v)
      if (v ~ /^[0-9]+([.][0-9]*)?$/) { c = int(v); if (c < v + 0) c++; if (!n || c > m) m = c; n = 1 }
    }
    END { if (n) print m }' "$1"
}

# The drain budget the units must cover: --drain-timeout, else the one the services will
# read from an existing environment file (re-running without the option must not shrink
# TimeoutStopSec under it: systemd would kill gateways mid-drain), else the default 20.
drain_given=0
if [ -n "$drain" ]; then
  drain_given=1
elif [ -r "$prefix$env_file" ] && found=$(env_drain "$prefix$env_file") && [ -n "$found" ]; then
  drain=$found
  echo "drain budget: $drain s, from $prefix$env_file (--drain-timeout changes it)"
else
  drain=20
fi
stop_timeout=$((3 * drain + 15))

run() {  # run a command, or print it under --dry-run
  if [ "$dry_run" -eq 1 ]; then echo "[dry-run] $*"; else "$@"; fi
}

render() {  # render TEMPLATE to DEST with MODE
  local template=$1 dest=$2 mode=$3
  local text
  text=$(sed -e "s|@INSTALL_DIR@|$install_dir|g" -e "s|@VENV@|$venv|g" \
    -e "s|@TTS_VENV@|$tts_venv|g" -e "s|@USER@|$user|g" -e "s|@GROUP@|$group|g" \
    -e "s|@ENV_FILE@|$env_file|g" -e "s|@STATE_DIR@|$state_dir|g" \
    -e "s|@ASR_PORT@|$asr_port|g" -e "s|@TTS_PORT@|$tts_port|g" \
    -e "s|@STOP_TIMEOUT@|$stop_timeout|g" -e "s|@DRAIN_TIMEOUT@|$drain|g" \
    -e "s|@PROTECT_HOME@|$protect_home|g" "$template")
  if grep -q '@[A-Z_]*@' <<<"$text"; then
    die "$template: placeholders left after rendering: $(grep -o '@[A-Z_]*@' <<<"$text" | sort -u | tr '\n' ' ')"
  fi
  if [ "$dry_run" -eq 1 ]; then
    echo "[dry-run] write $dest (mode $mode) from $template"
  else
    install -d -m 0755 "$(dirname "$dest")"
    printf '%s\n' "$text" >"$dest.tmp"
    chmod "$mode" "$dest.tmp"
    mv -f "$dest.tmp" "$dest"
    echo "wrote $dest"
  fi
}

# 1. The service user and its state folder.
if [ -n "$prefix" ]; then
  echo "(--prefix: not creating user $user, not changing owners)"
  run install -d -m 0750 "$prefix$state_dir" "$prefix$state_dir/models" "$prefix$state_dir/cache" \
    "$prefix$state_dir/voices"
else
  if ! id -u "$user" >/dev/null 2>&1; then
    run useradd --system --home-dir "$state_dir" --no-create-home --shell /usr/sbin/nologin \
      --user-group "$user"
  fi
  run install -d -m 0750 -o "$user" -g "$group" "$state_dir" "$state_dir/models" "$state_dir/cache" \
    "$state_dir/voices"
fi

# 2. The units.
for template in "$repo"/deploy/systemd/*.service "$repo"/deploy/systemd/*.target; do
  render "$template" "$unit_dir/$(basename "$template")" 0644
done
[ -x "$tts_venv/bin/python" ] || echo "note: no $tts_venv/bin/python yet: create the TTS environment (docs/deployment.md)" >&2

# 3. The environment file: installed once, never overwritten (it holds the site's settings);
#    --drain-timeout rewrites its three drain lines, so units and services agree.
set_env_drain() {  # point FILE's drain lines at $drain (appending any it lacks), in place
  local file=$1 name text
  text=$(cat "$file")
  for name in "${drain_names[@]}"; do
    if grep -qE "^[[:space:]]*$name[[:space:]]*=" <<<"$text"; then
      text=$(sed -E "s|^[[:space:]]*$name[[:space:]]*=.*|$name=$drain|" <<<"$text")
    else
      text+=$'\n'"$name=$drain"
    fi
  done
  printf '%s\n' "$text" >"$file"  # the same file: it keeps its owner and mode
  echo "set ${drain_names[*]} to $drain in $file"
}

if [ -e "$prefix$env_file" ]; then
  echo "keeping existing $prefix$env_file"
  if [ "$drain_given" -eq 1 ]; then
    if [ "$dry_run" -eq 1 ]; then
      echo "[dry-run] set ${drain_names[*]} to $drain in $prefix$env_file"
    else
      set_env_drain "$prefix$env_file"
    fi
  fi
  # Settings newer installs write: say so rather than edit the site's file.
  for wanted in "VA_TTS__VOICES__DIR=$state_dir/voices" "VA_GATEWAY__MODELS_DIR=$state_dir/models"; do
    grep -qE "^[[:space:]]*${wanted%%=*}[[:space:]]*=" "$prefix$env_file" ||
      echo "note: $prefix$env_file has no ${wanted%%=*}: add $wanted (docs/deployment.md)" >&2
  done
else
  render "$repo/deploy/systemd/voice-agent.env" "$prefix$env_file" 0640
  [ -n "$prefix" ] || run chown "root:$group" "$env_file"
fi

# 4. systemd.
units=(voice-agent.target voice-agent-asr.service voice-agent-tts.service)
for port in $gateway_ports; do units+=("voice-agent-gateway@$port.service"); done
if [ -n "$prefix" ]; then
  echo "(--prefix: skipping systemctl daemon-reload; would enable: ${units[*]})"
  exit 0
fi
run systemctl daemon-reload
if [ "$enable" -eq 1 ]; then
  run systemctl enable "${units[@]}"
fi
if [ "$start" -eq 1 ]; then
  run systemctl restart voice-agent.target
fi
echo "done: ${units[*]}"
