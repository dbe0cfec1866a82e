#!/usr/bin/env bash
# CI needs for the user_symbols tests (processors/tests/user_symbols*.rs,
# elf/src/tests.rs):
#   - gcc: compiles the C workloads with -g (and zlib-compressed DWARF);
#   - binutils: addr2line (the reference names), objcopy (separate debug
#     files, .gnu_debuglink), strip;
#   - golang-go: builds examples/workloads/chain.go stripped (`-s -w`) for
#     the Go pclntab tests, and `go tool addr2line` as their reference;
#   - xz-utils: MiniDebugInfo (.gnu_debugdata) made the way Fedora does;
#   - debuginfod: the server processors/tests/user_symbols_debuginfod.rs
#     starts on a directory of debug files.
# With CI=true a test whose tool is missing fails instead of skipping.
set -euo pipefail

need=()
command -v gcc >/dev/null || need+=(gcc libc6-dev)
command -v debuginfod >/dev/null || need+=(debuginfod)
command -v go >/dev/null || need+=(golang-go)
command -v xz >/dev/null || need+=(xz-utils)
for t in addr2line objcopy strip; do
	command -v "$t" >/dev/null || { need+=(binutils); break; }
done
if [ ${#need[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# unshare (util-linux): the mount-namespace case of the live test.
command -v unshare >/dev/null || {
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends util-linux >/dev/null
}
