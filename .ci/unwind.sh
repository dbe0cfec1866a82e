#!/usr/bin/env bash
# CI needs for user-stack unwinding (called by .ci/test):
#   - linux-perf: receivers/tests/ebpf_unwind.rs compares profcol's stacks of
#     sha256sum and python3 with `perf record --call-graph dwarf`;
#   - python3 (Debian's /usr/bin/python3) and coreutils (sha256sum, dd): the
#     distribution binaries those tests profile;
#   - binutils (readelf): elf/src/tests/unwind.rs checks the unwind tables
#     against `readelf --debug-dump=frames-interp`;
#   - gcc with a static libc (libc6-dev) and rustc (the toolchain): the
#     workloads are compiled at test time;
#   - golang-go: the mixed Go/C (cgo) workload, examples/workloads/cgo_deep.go.
# With CI=true the tests fail, not skip, when a tool is missing.
set -euo pipefail

need=()
command -v perf >/dev/null || need+=(linux-perf)
[ -x /usr/bin/python3 ] || need+=(python3)
command -v readelf >/dev/null || need+=(binutils)
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)
command -v go >/dev/null || need+=(golang-go)
if [ ${#need[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
echo "unwind: $(perf --version 2>/dev/null || echo 'perf missing'), $(/usr/bin/python3 --version 2>&1), $(go version 2>/dev/null || echo 'go missing')"
