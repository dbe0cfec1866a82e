#!/usr/bin/env bash
# What of the node agent's RSS is its own binary's code, where that code is
# touched (start-up or every report), and whether the page cache's folio
# size is what maps it.
#
#   sudo receivers/benches/resident_code.sh
#   PROFCOL_BIN=path/to/profcol sudo -E receivers/benches/resident_code.sh
#
# Over one load (two busy CPUs: a shell loop and `dd`, as node_agent_cost.sh)
# it runs the node agent (examples/default.yaml at 99 Hz) twice, from the
# binary where it is and from a copy on /dev/shm (tmpfs, which this kernel
# fills with single pages, not large folios), and for each prints the
# resident KiB of the binary's mappings (text r-xp, read-only data r--p)
# and the process's RssAnon/RssFile/RssShmem:
#   - at SETTLE seconds (20): start-up and steady state together;
#   - then it pages the binary's mappings out of the process
#     (process_madvise MADV_PAGEOUT) and reads again after STEADY seconds
#     (the node agent's report interval + 10 s: a report falls in it): only
#     what the steady state touches in that time is back.
# Needs root, python3, perf-capable kernel (the agent loads BPF).
set -euo pipefail
cd "$(dirname "$0")/../.."

SETTLE=${SETTLE:-20}
# shellcheck source=receivers/benches/node_config.sh
. receivers/benches/node_config.sh
# The node agent's report interval, in seconds (examples/default.yaml).
REPORT_S=$(node_report_seconds)
STEADY=${STEADY:-$((REPORT_S + 10))}
TMP=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$TMP" /dev/shm/profcol-resident-code
	true
}
trap cleanup EXIT

if [ -z "${PROFCOL_BIN:-}" ]; then
	cargo build --release -q -p profcol --bin profcol
fi
BIN=${PROFCOL_BIN:-${CARGO_TARGET_DIR:-target}/release/profcol}
BIN=$(realpath "$BIN")
node_config 99 "$TMP" '""' >"$TMP/node.yaml"

# Resident KiB of the mappings of file $2 in process $1, by permissions.
resident() {
	awk -v f="$2" '
		/^[0-9a-f]+-[0-9a-f]+ / { m = ($6 == f) ? $2 : "" }
		/^Rss:/ && m != "" { kb[m] += $2 }
		END { printf "text (r-xp) %6d KiB  read-only data (r--p) %6d KiB", kb["r-xp"], kb["r--p"] }' "/proc/$1/smaps"
	awk '/^Rss(Anon|File|Shmem):/ { printf "  %s %d KiB", $1, $2 }' "/proc/$1/status"
	echo
}

# MADV_PAGEOUT over every mapping of file $2 in process $1.
page_out() {
	python3 - "$1" "$2" <<'EOF'
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
SYS_pidfd_open, SYS_process_madvise, MADV_PAGEOUT = 434, 440, 21
class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
pid, path = int(sys.argv[1]), sys.argv[2]
pidfd = libc.syscall(SYS_pidfd_open, pid, 0)
if pidfd < 0:
    sys.exit(f"pidfd_open({pid}): errno {ctypes.get_errno()}")
for line in open(f"/proc/{pid}/maps"):
    f = line.split()
    if len(f) >= 6 and f[5] == path:
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        iov = Iovec(lo, hi - lo)
        if libc.syscall(SYS_process_madvise, pidfd, ctypes.byref(iov), 1, MADV_PAGEOUT, 0) < 0:
            sys.exit(f"process_madvise {f[0]}: errno {ctypes.get_errno()}")
EOF
}

sh -c 'while :; do :; done' &
PIDS+=($!)
dd if=/dev/zero of=/dev/null bs=4k 2>/dev/null &
PIDS+=($!)
cp "$BIN" /dev/shm/profcol-resident-code
for where in "$BIN" /dev/shm/profcol-resident-code; do
	"$where" --config "$TMP/node.yaml" >"$TMP/node.log" 2>&1 &
	agent=$!
	PIDS+=("$agent")
	sleep "$SETTLE"
	kill -0 "$agent" 2>/dev/null || { echo "the agent exited:"; cat "$TMP/node.log"; exit 1; }
	echo "BINARY $where"
	printf 'AT %ds          ' "$SETTLE"
	resident "$agent" "$where"
	page_out "$agent" "$where"
	printf 'PAGED OUT       '
	resident "$agent" "$where"
	sleep "$STEADY"
	printf 'AFTER %ds more  ' "$STEADY"
	resident "$agent" "$where"
	kill "$agent"
	wait "$agent" 2>/dev/null || true
done
