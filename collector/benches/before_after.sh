#!/usr/bin/env bash
# Every benchmark of docs/PERFORMANCE.md in two checkouts, one sitting:
# "before" and "after" each run one bench, the order alternating from bench
# to bench so that load drifting over the sitting falls on both sides.
#
#   sudo -E collector/benches/before_after.sh BEFORE_DIR AFTER_DIR [OUT_DIR]
#   STEPS="model kallsyms" sudo -E collector/benches/before_after.sh ...   # some
#   BUILD=0 ...                                                            # built already
#
# BEFORE_DIR and AFTER_DIR are checkouts (git worktree or clone), each
# built in its own target directory (DIR/target: a shared one would rebuild
# on every switch). OUT_DIR (default: a new temporary directory) gets one
# log per bench and side, NAME.before.log and NAME.after.log (node_agent:
# NAME.after.N.log and NAME.before.N.log, one per run), and
# `progress` (start, end, exit status and load average of each). A bench a
# checkout does not have is run on the other side only (NAME.after.log).
#
# Build first (BUILD=1, the default), per checkout: every bench, the
# ebpf_overhead example, the plugins, the soak test, the dev-profile
# benches; the release `profcol` binary last, copied to OUT_DIR/profcol-SIDE.
# Last because `cargo bench` and `cargo test --release` leave a `profcol`
# of their own at target/release/profcol, built with the dev-dependencies'
# features (tokio's test-util among them), whose node agent costs more CPU
# and memory: the agent benches run the copy, the binary users run.
#
# Needs root (BPF, perf, cgroups, kallsyms addresses), perf, python3,
# the Go toolchain for user_symbols_go; about 40 minutes per side after the
# build.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: before_after.sh BEFORE_DIR AFTER_DIR [OUT_DIR]" >&2; exit 2; }
B=$(cd "$1" && pwd) || exit 2
A=$(cd "$2" && pwd) || exit 2
OUT=${3:-$(mktemp -d)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
echo "logs in $OUT"

build() { # DIR SIDE
	(
		set -e
		cd "$1"
		export CARGO_TARGET_DIR=$1/target
		cargo build --release -q -p profcol-receivers --example ebpf_profile
		cargo bench --no-run -q --workspace
		bash examples/plugins/build.sh
		cargo bench --no-run -q --manifest-path plugins/Cargo.toml -p profcol-plugin-sdk --bench sdk
		cargo test --release --no-run -q -p profcol --test soak
		cargo bench --profile dev --no-run -q -p profcol --bench queue_memory
		[ ! -f collector/benches/decoded_size.rs ] || cargo bench --profile dev --no-run -q -p profcol --bench decoded_size
		cargo build --release -q -p profcol --bin profcol
		cp target/release/profcol "$OUT/profcol-$2"
	)
}
if [ "${BUILD:-1}" = 1 ]; then
	build "$B" before || { echo "build of $B failed" >&2; exit 1; }
	build "$A" after || { echo "build of $A failed" >&2; exit 1; }
fi
[ -x "$OUT/profcol-before" ] && [ -x "$OUT/profcol-after" ] || { echo "no $OUT/profcol-before and -after: BUILD=1" >&2; exit 1; }
sync

cp /proc/kallsyms "$OUT/kallsyms"
log() { echo "$(date +%T) $*" >>"$OUT/progress"; }
has() { [ -e "$1/$2" ]; }
# one SIDE DIR NAME CMD: runs CMD in checkout DIR
one() {
	local side=$1 dir=$2 name=$3 rc
	shift 3
	log "start $name $side (load $(cut -d' ' -f1-3 /proc/loadavg))"
	(cd "$dir" && export CARGO_TARGET_DIR=$dir/target SIDE=$side && eval "$@") >"$OUT/$name.$side.log" 2>&1
	rc=$?
	log "end $name $side rc=$rc"
}
# pair N NAME FILE CMD: both sides (those that have FILE), before first when N is even
pair() {
	local n=$1 name=$2 file=$3
	shift 3
	local sides=(before after)
	[ $((n % 2)) = 0 ] || sides=(after before)
	for s in "${sides[@]}"; do
		local dir=$A
		[ "$s" = before ] && dir=$B
		has "$dir" "$file" && one "$s" "$dir" "$name" "$@"
	done
}
# Start-up of the whole binary to "perf events attached", three times for
# ebpf -> debug and for ebpf -> kernel_symbols -> debug.
startup() {
	local cfg i
	for cfg in debug kernel_symbols; do
		for i in 1 2 3; do
			printf '%s %s\n' "$cfg" "$(timeout -s INT 5 "$OUT/profcol-$SIDE" --config "$OUT/startup_$cfg.yaml" 2>&1 |
				grep -o 'since_process_start_ms=[0-9]*' | head -1)"
		done
	done
}
export -f startup
export OUT
cat >"$OUT/startup_debug.yaml" <<EOF
receivers:
  ebpf:
    sample_frequency: 99
exporters:
  debug:
    verbosity: basic
service:
  pipelines:
    profiles:
      receivers: [ebpf]
      exporters: [debug]
EOF
sed -e 's/^exporters:/processors:\n  kernel_symbols: {}\nexporters:/' -e 's/      exporters: \[debug\]/      processors: [kernel_symbols]\n      exporters: [debug]/' \
	"$OUT/startup_debug.yaml" >"$OUT/startup_kernel_symbols.yaml"

CRIT="--warm-up-time 1 --measurement-time 2"
STEPS=${STEPS:-model kallsyms gateway gateway_host telemetry gateway_memory queue_memory node_agent uprobe_exec uprobe_cpu
	sdk plugin_calls startup ebpf_overhead bpf_churn soak report_heap node_pipeline aggregate decoded_size user_symbols
	user_symbols_go unwind_cost sample_cost}
n=0
for s in $STEPS; do
	n=$((n + 1))
	case $s in
	model) pair $n model api/benches/model.rs "cargo bench -p profcol-api --bench model -- $CRIT" ;;
	kallsyms) pair $n kallsyms processors/benches/kallsyms.rs "KALLSYMS_BENCH_FILE=$OUT/kallsyms cargo bench -p profcol-processors --bench kallsyms -- nomatch" ;;
	gateway) pair $n gateway exporters/benches/gateway.rs 'cargo bench -p profcol-exporters --bench gateway -- nomatch' ;;
	gateway_host) pair $n gateway_host collector/benches/gateway_host.rs 'cargo bench -p profcol --bench gateway_host -- nomatch' ;;
	telemetry) pair $n telemetry collector/benches/gateway_host.rs 'GATEWAY_TELEMETRY_ROUNDS=5 cargo bench -p profcol --bench gateway_host -- telemetry' ;;
	gateway_memory) pair $n gateway_memory collector/benches/gateway_memory.rs 'GATEWAY_MEMORY_REPEATS=2 cargo bench -p profcol --bench gateway_memory' ;;
	queue_memory) pair $n queue_memory collector/benches/queue_memory.rs 'QUEUE_MEMORY_REPEATS=2 cargo bench --profile dev -p profcol --bench queue_memory' ;;
	# Each build's agent beside perf record, alone (run together, this
	# build's agents would profile the older one too), the builds
	# alternating NODE_RUNS times; each with its own checkout's
	# examples/default.yaml. The after checkout's copy of the bench runs both.
	node_agent) for r in $(seq "${NODE_RUNS:-2}"); do
		one "after.$r" "$A" node_agent "PROFCOL_BIN=$OUT/profcol-after RUNS=1 bash receivers/benches/node_agent_cost.sh"
		one "before.$r" "$A" node_agent "ONLY_BEFORE=1 BEFORE_BIN=$OUT/profcol-before BEFORE_CONFIG=$B/examples/default.yaml PROFCOL_BIN=$OUT/profcol-after RUNS=1 bash receivers/benches/node_agent_cost.sh"
	done ;;
	uprobe_exec) pair $n uprobe_exec receivers/benches/uprobe_exec.rs "cargo bench -p profcol-receivers --bench uprobe_exec -- --warm-up-time 1 --measurement-time 3" ;;
	uprobe_cpu) pair $n uprobe_cpu receivers/benches/uprobe_cpu.rs 'ROUNDS=3 cargo bench -p profcol-receivers --bench uprobe_cpu' ;;
	sdk) pair $n sdk plugins/sdk/benches/sdk.rs "cargo bench --manifest-path plugins/Cargo.toml -p profcol-plugin-sdk --bench sdk -- $CRIT" ;;
	plugin_calls) pair $n plugin_calls plugins/host/benches/plugin_calls.rs 'cargo bench -p profcol-plugins --bench plugin_calls -- --warm-up-time 1 --measurement-time 3' ;;
	startup) pair $n startup Cargo.toml startup ;;
	ebpf_overhead) pair $n ebpf_overhead receivers/benches/ebpf_overhead.sh 'bash receivers/benches/ebpf_overhead.sh' ;;
	bpf_churn) pair $n bpf_churn processors/benches/bpf_churn.rs 'CHURN_SECS=60 cargo bench -p profcol-processors --bench bpf_churn' ;;
	soak) pair $n soak collector/tests/soak.rs 'PROFCOL_SOAK_SECS=120 cargo test --release -p profcol --test soak -- --nocapture' ;;
	report_heap) pair $n report_heap collector/benches/report_heap.rs 'cargo bench -p profcol --bench report_heap' ;;
	node_pipeline) pair $n node_pipeline collector/benches/node_pipeline.rs 'cargo bench -p profcol --bench node_pipeline' ;;
	aggregate) pair $n aggregate receivers/benches/aggregate.rs "cargo bench -p profcol-receivers --bench aggregate -- $CRIT" ;;
	decoded_size) pair $n decoded_size collector/benches/decoded_size.rs 'cargo bench --profile dev -p profcol --bench decoded_size' ;;
	user_symbols) pair $n user_symbols processors/benches/user_symbols.rs "cargo bench -p profcol-processors --bench user_symbols -- $CRIT" ;;
	user_symbols_go) pair $n user_symbols_go processors/benches/user_symbols_go.rs "cargo bench -p profcol-processors --bench user_symbols_go -- $CRIT" ;;
	unwind_cost) pair $n unwind_cost receivers/benches/unwind_cost.rs "cargo bench -p profcol-receivers --bench unwind_cost -- $CRIT" ;;
	sample_cost) pair $n sample_cost receivers/benches/sample_cost.sh 'PROFCOL_BIN=$OUT/profcol-$SIDE bash receivers/benches/sample_cost.sh' ;;
	*) echo "unknown step $s" >&2 ;;
	esac
done
log "all done"
