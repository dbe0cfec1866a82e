# Sourced by the side-by-side benchmarks beside it, after cgroup_cpu.sh
# (and bpf_stats.sh for in-kernel time): two profcol agents at the same
# time over the same load, each in a cgroup of its own. The script sets
# BIN, WORK (a scratch directory) and PIDS (an array its cleanup kills).
#
#   mode_settings MODE        FREQ REPORT COUNT WINDOW of MODE=default (the
#                             embedded default's sampling: 19 Hz, a report a
#                             minute, counting in the kernel; 130 s, two
#                             reports) or samples (the per-sample config: 99
#                             Hz, 10 s reports, a record per sample; 60 s);
#                             WINDOW kept if set
#   agent_config NAME EXTRA   $WORK/NAME.yaml: the ebpf receiver at $FREQ,
#                             $REPORT and $COUNT (left out if empty), EXTRA
#                             (lines under the receiver), a pprof exporter
#                             into $WORK/out-NAME, no /metrics
#   agents_start A B          $BIN on $WORK/A.yaml and $WORK/B.yaml in
#                             cgroups A and B, their logs in $WORK/A.log
#                             and $WORK/B.log; mem_poll of both into
#                             $WORK/mem (its pid in MEMP)
#   agents_window A B         10 s of start-up, then $WINDOW s; sets
#                             CPU[A] and CPU[B] (cgroup CPU, us per s over
#                             the window) and, with bpf_stats.sh sourced,
#                             KERNEL_NS[X] and KERNEL_RUNS[X] (the
#                             sampling program's in-kernel ns and runs
#                             over the window)
declare -A CPU KERNEL_NS KERNEL_RUNS

mode_settings() {
	case "$1" in
	default) FREQ=19 REPORT=60s COUNT=true WINDOW=${WINDOW:-130} ;;
	samples) FREQ=99 REPORT=10s COUNT=false WINDOW=${WINDOW:-60} ;;
	*) echo "MODE is default or samples" >&2; exit 1 ;;
	esac
}

agent_config() {
	{
		printf 'receivers:\n  ebpf:\n    sample_frequency: %s\n    report_interval: %s\n' "$FREQ" "$REPORT"
		[ -z "${COUNT:-}" ] || printf '    count_in_kernel: %s\n' "$COUNT"
		[ -z "$2" ] || printf '%s\n' "$2"
		printf 'exporters:\n  pprof:\n    directory: %s\n' "$WORK/out-$1"
		printf 'service:\n  telemetry:\n    metrics:\n      level: none\n'
		printf '  pipelines:\n    profiles:\n      receivers: [ebpf]\n      exporters: [pprof]\n'
	} >"$WORK/$1.yaml"
}

agents_start() {
	local t
	for t in "$1" "$2"; do
		(start_in "$t" "$BIN" --config "$WORK/$t.yaml" >"$WORK/$t.log" 2>&1) &
		PIDS+=($!)
	done
	mem_poll "$WORK/mem" 0.1 "$1" "$2" &
	MEMP=$!
	PIDS+=($MEMP)
}

agents_window() {
	local t c1 t1 n1
	local -A P C0 T0 N0
	# Start-up apart: the window begins after both have loaded and found
	# the load.
	sleep 10
	for t in "$1" "$2"; do
		P[$t]=$(pgrep -f -- "--config $WORK/$t.yaml" | head -1)
		if declare -F prog_stats >/dev/null; then
			read -r T0[$t] N0[$t] < <(prog_stats "${P[$t]}")
		fi
		C0[$t]=$(cpu_ns "$t" "${P[$t]}")
	done
	sleep "$WINDOW"
	for t in "$1" "$2"; do
		if declare -F prog_stats >/dev/null; then
			read -r t1 n1 < <(prog_stats "${P[$t]}")
			KERNEL_NS[$t]=$((t1 - T0[$t]))
			KERNEL_RUNS[$t]=$((n1 - N0[$t]))
		fi
		c1=$(cpu_ns "$t" "${P[$t]}")
		CPU[$t]=$(((c1 - C0[$t]) / WINDOW / 1000))
	done
}
