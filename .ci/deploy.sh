#!/usr/bin/env bash
# CI for deploy/, called by .ci/test like every part:
#   - installs podman (Debian; builds FROM-scratch images without running a
#     container), musl-tools and the x86_64-unknown-linux-musl rustup target
#     (the static binary), and kubernetes-validate (PyPI, with the
#     Kubernetes JSON schemas inside) for collector/tests/deploy_manifests.rs;
#   - checks that kubectl (with kustomize built in) is present: Debian's own
#     kubernetes-client (1.20) is too old for these kustomizations, so a
#     machine without kubectl fails here with what to install;
#   - runs deploy/container/check.sh: image built from this clone, rootfs
#     exported, the binary run from it (a dev-profile musl build: 556 s user
#     CPU cold, ~5 min on an idle 2-core machine; docs/PERFORMANCE.md, "Container image").
# Idempotent and quiet: installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v podman >/dev/null || missing+=(podman)
command -v musl-gcc >/dev/null || missing+=(musl-tools)
[ -r /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
if [ ${#missing[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
rustup target list --installed | grep -qx x86_64-unknown-linux-musl || rustup target add x86_64-unknown-linux-musl >/dev/null 2>&1
if ! python3 -c 'import importlib.metadata as m; assert m.version("kubernetes-validate") == "1.37.0"' 2>/dev/null; then
	python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore "kubernetes-validate==1.37.0" >/dev/null
fi
if ! command -v kubectl >/dev/null; then
	echo "deploy: kubectl is missing; install a kubectl >= 1.27 (kustomize v5 built in), e.g. the Kubernetes project's apt repository (pkgs.k8s.io)" >&2
	exit 1
fi

echo "deploy: $(kubectl version --client 2>/dev/null | head -1), kubernetes-validate $(kubernetes-validate --version), $(podman --version)"
start=$(date +%s)
deploy/container/check.sh --profile dev
echo "deploy: image check took $(( $(date +%s) - start )) s"
