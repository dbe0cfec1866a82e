#!/usr/bin/env bash
# CI needs for the ebpf receiver (called by .ci/run before the checks):
#   - clang-16, llvm-16 (llvm-strip-16), libbpf-dev, linux-libc-dev:
#     `ebpf/build.sh --check` rebuilds ebpf/obj/*.bpf.o and fails if the
#     committed object is stale;
#   - gcc: the integration tests compile examples/workloads/*.c;
#   - binutils (strip), util-linux (unshare) and mount: the uprobe tests
#     (receivers/tests/ebpf_uprobes.rs, elf/src/tests.rs) strip binaries and
#     run a workload in its own mount namespace;
#   - strace: optional manual check that loading opens no kernel BTF;
#   - bpftool: the BTF offset test (ebpf/src/btf.rs) compares the struct
#     member offsets it reads from /sys/kernel/btf/vmlinux with bpftool's;
# The tests themselves (receivers/tests/ebpf_*.rs) need root, which CI has;
# with CI=true they fail instead of skipping when privileges are missing.
set -euo pipefail

need=()
command -v clang-16 >/dev/null || need+=(clang-16)
command -v llvm-strip-16 >/dev/null || need+=(llvm-16)
[ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
[ -f /usr/include/linux/bpf.h ] || need+=(linux-libc-dev)
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v strip >/dev/null || need+=(binutils)
command -v unshare >/dev/null || need+=(util-linux)
command -v mount >/dev/null || need+=(mount)
command -v bpftool >/dev/null || need+=(bpftool)
if [ ${#need[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# Facts the ebpf tests depend on, printed for the log.
echo "ebpf: kernel $(uname -r), perf_event_paranoid=$(cat /proc/sys/kernel/perf_event_paranoid)," \
	"btf=$([ -e /sys/kernel/btf/vmlinux ] && echo yes || echo no), uid=$(id -u)"
