#!/usr/bin/env bash
# CI needs of the container identity test (receivers/tests/containers.rs):
# Debian's containerd and runc, which the test starts and runs a container
# with, and busybox-static, the container's only program (/bin/busybox).
# Idempotent and quiet: installs only what is missing. With CI=true the test
# fails (not skips) when one of these is missing.
set -euo pipefail

need=()
command -v containerd >/dev/null 2>&1 || need+=(containerd)
command -v runc >/dev/null 2>&1 || need+=(runc)
# The static build: the container's root holds nothing but this file.
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
if [ ${#need[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

echo "containers: $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1{print $3}'), $(/bin/busybox | head -1 | awk '{print $2}')"
