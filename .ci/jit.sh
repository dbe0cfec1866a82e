#!/usr/bin/env bash
# CI needs for JIT frames (called by .ci/test):
#   - openjdk-17-jdk-headless (java, javac, jcmd): the JVM attach tests
#     (receivers/src/ebpf/jit/jvm_attach.rs) and collector/tests/jit_frames.rs
#     run real JVMs and ask them for their perf maps;
#   - nodejs: collector/tests/jit_frames.rs runs node with --perf-basic-prof
#     beside node's own --cpu-prof.
# Go (golang-go, .ci/exporters.sh) reads the pprof files.
set -euo pipefail

need=()
command -v javac >/dev/null || need+=(openjdk-17-jdk-headless)
command -v jcmd >/dev/null || need+=(openjdk-17-jdk-headless)
command -v node >/dev/null || need+=(nodejs)
if [ ${#need[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
echo "jit: $(node --version), $(java -version 2>&1 | head -1)"
