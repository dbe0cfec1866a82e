#!/usr/bin/env bash
# CI needs for the kernel_symbols processor's live tests
# (processors/tests/kernel_symbols_live.rs) and the exec test
# (receivers/tests/ebpf_exec.rs):
#   - python3: the os.getppid() loop and the bash → python3 exec workload.
#   - bash: the exec workload's shell.
# The tests need root (bpf, perf events, real kallsyms addresses), which
# CI has; with CI=true they fail instead of skipping without it.
set -euo pipefail

need=()
command -v python3 >/dev/null || need+=(python3)
command -v bash >/dev/null || need+=(bash)
if [ ${#need[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
