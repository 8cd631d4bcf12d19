#!/usr/bin/env bash
# Make the Debian bookworm base image for the container builds offline of any registry:
# `debootstrap --variant=minbase` from Debian's package mirror, slimmed as the official
# debian:bookworm-slim is (no apt caches or lists, no docs, man pages or locales), imported
# into podman as localhost/debian:bookworm. A no-op when that image exists already.
# tests/e2e/test_containers.py passes it as the images' BASE build argument.
# Usage: scripts/debian_base.sh [IMAGE]   (needs root, debootstrap and podman)
set -euo pipefail
image="${1:-localhost/debian:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
podman image exists "$image" && exit 0
for tool in debootstrap podman; do
  command -v "$tool" >/dev/null 2>&1 || { echo "debian_base: $tool is missing" >&2; exit 1; }
done
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
echo "debian_base: debootstrap --variant=minbase bookworm (about a minute)" >&2
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 \
  || { tail -n 20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# what debian:bookworm-slim carries: security updates, no recommends, no docs in later installs
cat >"$root/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SOURCES
cat >"$root/etc/dpkg/dpkg.cfg.d/slim" <<'SLIM'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
SLIM
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
  >"$root/etc/apt/apt.conf.d/99slim"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
  "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/log/*.log
find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
tar -C "$root" -c . | podman import --change 'CMD ["bash"]' - "$image" >/dev/null
echo "debian_base: imported $image" >&2
