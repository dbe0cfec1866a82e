#!/usr/bin/env bash
# Overhead of the ebpf receiver vs `perf record -F 99 -a -g`, in one run.
#
#   sudo receivers/benches/ebpf_overhead.sh            # 20 s per case
#   DURATION=5 RSS_SECONDS=0 receivers/benches/ebpf_overhead.sh   # quick
#
# For an idle host and a busy host (one CPU burner per CPU), it runs, one
# after the other on the same workload:
#   - profcol's ebpf receiver (receivers/examples/ebpf_profile, release
#     build, 99 Hz, 5 s report interval, batches built and counted), and
#   - perf record -F 99 -a -g -o <tmp> -- sleep DURATION (Debian linux-perf),
# and reports the CPU time (user+sys, from getrusage of the child) of each,
# and the ratio. It also reports profcol's startup (process start -> perf
# events attached, from its log line) and its RSS after RSS_SECONDS (60 s)
# on the busy host. Needs root, gcc, perf.
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=${DURATION:-20}
FREQ=${FREQ:-99}
RSS_SECONDS=${RSS_SECONDS:-60}
NCPU=$(nproc)
TMP=$(mktemp -d)
BURNERS=()
cleanup() {
	for p in "${BURNERS[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$TMP"
}
trap cleanup EXIT

cargo build --release -q -p profcol-receivers --example ebpf_profile
BIN=${CARGO_TARGET_DIR:-target}/release/examples/ebpf_profile
cc -O1 -fno-omit-frame-pointer -fno-inline -o "$TMP/burn" examples/workloads/burn.c

start_burners() {
	for _ in $(seq "$NCPU"); do
		(echo go | exec "$TMP/burn" 100000 >/dev/null) &
		BURNERS+=($!)
	done
	sleep 0.5
}
stop_burners() {
	for p in "${BURNERS[@]}"; do pkill -P "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
	BURNERS=()
	wait 2>/dev/null || true
}

# host CPU seconds (all CPUs, all states but idle/iowait) from /proc/stat
host_busy() { awk '/^cpu /{printf "%d\n", ($2+$3+$4+$7+$8+$9)}' /proc/stat; }

# cpu_of CMD...: runs CMD, prints "user+sys seconds" of it and its children
cpu_of() {
	local out
	out=$( { TIMEFORMAT='%U %S'; time "$@" >"$TMP/out" 2>"$TMP/err"; } 2>&1 )
	awk -v u="${out% *}" -v s="${out#* }" 'BEGIN{printf "%.3f", u+s}'
}

printf '%-6s %-28s %10s %12s\n' load tool cpu_seconds host_busy_s
declare -A CPU
for load in idle busy; do
	[[ $load == busy ]] && start_burners
	hz=$(getconf CLK_TCK)

	h0=$(host_busy)
	CPU[$load,profcol]=$(cpu_of "$BIN" --frequency "$FREQ" --seconds "$DURATION" --quiet)
	h1=$(host_busy)
	startup=$(grep -o 'since_process_start_ms=[0-9]*' "$TMP/err" | head -1 | cut -d= -f2 || true)
	load_ms=$(grep -o 'load_ms=[0-9]*' "$TMP/err" | head -1 | cut -d= -f2 || true)
	samples=$(grep -o '^total: [0-9]*' "$TMP/out" | cut -d' ' -f2 || true)
	lost=$(grep -o 'lost_ringbuf_total{receiver="ebpf"} [0-9]*' "$TMP/out" | cut -d' ' -f2 || true)
	printf '%-6s %-28s %10s %12s   (startup %s ms, load %s ms, %s samples, %s lost)\n' "$load" "profcol ebpf receiver" \
		"${CPU[$load,profcol]}" "$(( (h1 - h0) / hz ))" "$startup" "$load_ms" "$samples" "$lost"

	h0=$(host_busy)
	CPU[$load,perf]=$(cpu_of perf record -F "$FREQ" -a -g -o "$TMP/perf.data" -- sleep "$DURATION")
	h1=$(host_busy)
	psamples=$(grep -o '([0-9]* samples)' "$TMP/err" | tr -dc 0-9 || true)
	printf '%-6s %-28s %10s %12s   (%s samples)\n' "$load" "perf record -F $FREQ -a -g" \
		"${CPU[$load,perf]}" "$(( (h1 - h0) / hz ))" "$psamples"
	rm -f "$TMP/perf.data"

	awk -v a="${CPU[$load,profcol]}" -v b="${CPU[$load,perf]}" -v l="$load" \
		'BEGIN{ if (b > 0) printf "%-6s ratio profcol/perf = %.2f\n", l, a/b; else print l " perf used no measurable CPU" }'
	[[ $load == busy ]] && stop_burners
done

if [[ $RSS_SECONDS -gt 0 ]]; then
	start_burners
	# In-kernel cost of the BPF program (charged to the sampled tasks, not
	# to profcol): kernel.bpf_stats_enabled counts its run time.
	old_stats=$(cat /proc/sys/kernel/bpf_stats_enabled)
	echo 1 >/proc/sys/kernel/bpf_stats_enabled
	"$BIN" --frequency "$FREQ" --quiet >/dev/null 2>&1 &
	pid=$!
	sleep "$RSS_SECONDS"
	rss=$(awk '/^VmRSS/{print $2}' "/proc/$pid/status")
	hwm=$(awk '/^VmHWM/{print $2}' "/proc/$pid/status")
	if command -v bpftool >/dev/null; then
		bpftool -j prog show 2>/dev/null | python3 -c '
import json, sys
for p in json.load(sys.stdin):
    if p.get("name", "").startswith("profcol_cpu"):
        n, t = p.get("run_cnt", 0), p.get("run_time_ns", 0)
        if n:
            print(f"BPF program: {n} runs, {t/n:.0f} ns per sample on average ({t/1e9:.3f} s in {sys.argv[1]} s)")
' "$RSS_SECONDS" || true
	fi
	echo "$old_stats" >/proc/sys/kernel/bpf_stats_enabled
	kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
	stop_burners
	printf 'RSS after %ss (busy host, %s Hz): %s KiB (peak %s KiB)\n' "$RSS_SECONDS" "$FREQ" "$rss" "$hwm"
fi
