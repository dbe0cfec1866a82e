#!/usr/bin/env bash
# What the node agent costs as a cluster charges it, beside `perf record
# -F FREQ -a -g`, all in one run over one load: CPU and memory of each
# tool's own cgroup, and the agent/perf ratio of every figure.
#
#   sudo receivers/benches/agent_cgroup_cost.sh                  # embedded default, 19 Hz, 600 s
#   WINDOW1=30 END=90 sudo receivers/benches/agent_cgroup_cost.sh   # a quick run
#   CONFIG_B=no_names sudo receivers/benches/agent_cgroup_cost.sh   # default, default without names, perf
#   CONFIG=my.yaml CONFIG_B=other.yaml RESTART=1 sudo -E receivers/benches/agent_cgroup_cost.sh
#   MODE=samples WINDOW1=20 END=120 sudo receivers/benches/agent_cgroup_cost.sh   # per-sample agent
#
# Tools, started at once (after the load, each in a cgroup of its own,
# cpuacct + memory on cgroup v1, one cgroup on v2; receivers/benches/cgroup_cpu.sh):
#   - NAME (agent):   the release profcol with CONFIG (default examples/default.yaml,
#                     the embedded node agent), sample_frequency set to FREQ,
#                     pprof files and /metrics of its own (node_config.sh);
#   - NAME_B (agent_b): with CONFIG_B set, a second agent beside it: a file,
#                     `no_names` for CONFIG without the user_symbols processor
#                     (NAME_B then defaults to `no_names`), or `user_symbols` for
#                     CONFIG with it added after kernel_symbols (`names`);
# Each agent's user_symbols table cache (cache.dir) is a directory of its
# own, empty at the cold run and kept for RESTART's warm one.
#   - perf:           perf record -F FREQ -a -g (Debian linux-perf).
# Load, started first and kept through the run (and RESTART's second run):
# two busy CPUs (a shell loop and `dd if=/dev/zero of=/dev/null`) and a large
# Rust binary with debug info: a copy of the profcol binary under test named
# profcol-load (LOAD_BIN=path for another), looping `profcol-load symbols
# lookup --file profcol-load ADDR...` (it parses its own DWARF: thousands of
# distinct Rust frames, a new process each LOAD_PAUSE s (1) apart;
# LOAD_BIG=0 drops it).
# Figures per tool, windows from the tools' start: CPU in µs per second
# over the start-up window [0, WINDOW1) (120 s) and the steady window
# [WINDOW1, END) (END 600 s); memory = anon + kernel of the memory cgroup
# (see cgroup_cpu.sh: BPF maps count, page cache does not), polled every
# POLL s (0.1): its peak up to END (shutdown excluded: perf's build-id pass
# at exit is not sampling cost), its peak within the start-up window and its
# value at WINDOW1; RSS beside it for reference (the polled peak of VmRSS,
# VmHWM and VmRSS at END). perf's ring buffers are charged to its locked
# memory, not to its memory cgroup (RSS shows them). Then RATIO lines:
# agent/perf for every figure.
# RESTART=1: after the first (cold) run, the agents run again with the same
# configs (an on-disk symbol cache a config names is now warm) beside a
# fresh perf, the load still running, and the same figures are printed
# (`warm`). EVICT=1 (default) empties the page cache of profcol's and
# perf's executables before the cold run, as at a host's boot (EVICT_WARM=1
# before the warm run too).
# MODE=samples: the per-sample agent instead of CONFIG: examples/default.yaml
# at 99 Hz (FREQ), report_interval 5s, count_in_kernel false, pipeline ebpf ->
# kernel_symbols -> pprof, beside perf at 99 Hz (with `-k realtime`, so its
# samples' times compare with the pprof files'); then the busy processes'
# samples over the agent's whole reports (its first and last file dropped)
# from perf script and from the pprof files, and their ratio.
# Every process on the host is profiled, not only the load: what the agents
# do per binary and per new process (unwind tables, symbol tables) follows
# whatever else runs (a compiler's processes and libraries weigh heavily), and
# perf's own process does none of it; hence the load averages printed.
# Other knobs: PROFCOL_BIN=path (a given build, else this checkout's release
# build), PROFCOL_BIN_B=path (the second agent's build, else the same one:
# with CONFIG_B=examples/default.yaml, an older build beside this one),
# METRICS_PORT (18897; each agent serves /metrics on a port of its own).
# Needs root, perf, python3.
set -euo pipefail
cd "$(dirname "$0")/../.."

MODE=${MODE:-cost}
case $MODE in
cost) FREQ=${FREQ:-19} ;;
samples) FREQ=${FREQ:-99} ;;
*)
	echo "MODE is cost or samples" >&2
	exit 2
	;;
esac
WINDOW1=${WINDOW1:-120}
END=${END:-600}
[ "$END" -gt "$WINDOW1" ] || {
	echo "END ($END) must be past WINDOW1 ($WINDOW1)" >&2
	exit 2
}
POLL=${POLL:-0.1}
RESTART=${RESTART:-0}
CONFIG=${CONFIG:-examples/default.yaml}
CONFIG_B=${CONFIG_B:-}
NAME=${NAME:-agent}
case $CONFIG_B in
user_symbols) NAME_B=${NAME_B:-names} ;;
no_names) NAME_B=${NAME_B:-no_names} ;;
*) NAME_B=${NAME_B:-agent_b} ;;
esac
METRICS_PORT=${METRICS_PORT:-18897}
LOAD_PAUSE=${LOAD_PAUSE:-1}
TMP=$(mktemp -d)
LOAD=()
PIDS=()
POLLER=""
cleanup() {
	for p in "${PIDS[@]}" "${LOAD[@]}" $POLLER; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$TMP"
	cg_remove 2>/dev/null || true
}
trap cleanup EXIT

if [ -z "${PROFCOL_BIN:-}" ]; then
	CARGO_INCREMENTAL=0 cargo build --release -q -p profcol --bin profcol
fi
BIN=${PROFCOL_BIN:-${CARGO_TARGET_DIR:-target}/release/profcol}
BIN_B=${PROFCOL_BIN_B:-$BIN}
# shellcheck source=receivers/benches/node_config.sh
. receivers/benches/node_config.sh
# shellcheck source=receivers/benches/cgroup_cpu.sh
. receivers/benches/cgroup_cpu.sh
[ -n "$MCG" ] || {
	echo "no memory cgroup: this bench needs one" >&2
	exit 1
}

AGENTS=("$NAME")
[ -n "$CONFIG_B" ] && AGENTS+=("$NAME_B")
TOOLS=("${AGENTS[@]}" perf)
# agent_config NAME RUN PORT: that agent's config for that run.
agent_config() {
	local dir=$TMP/$2/$1
	mkdir -p "$dir"
	agent_config_of "$@" | sed "s|dir: /var/cache/profcol/symbols|dir: $TMP/symbols-$1|"
}
agent_config_of() {
	local dir=$TMP/$2/$1
	if [ "$1" = "$NAME" ] && [ "$MODE" = samples ]; then
		node_config "$FREQ" "$dir" "127.0.0.1:$3" examples/default.yaml | without_user_symbols | sed \
			-e 's/^\( *report_interval:\).*/\1 5s/' -e 's/^\( *count_in_kernel:\).*/\1 false/' \
			-e 's/exporters: \[pprof, debug\]/exporters: [pprof]/'
	elif [ "$1" = "$NAME" ]; then
		node_config "$FREQ" "$dir" "127.0.0.1:$3" "$CONFIG"
	elif [ "$CONFIG_B" = user_symbols ]; then
		agent_config_of "$NAME" "$2" "$3" | sed "s|$TMP/$2/$NAME/|$dir/|" | with_user_symbols
	elif [ "$CONFIG_B" = no_names ]; then
		agent_config_of "$NAME" "$2" "$3" | sed "s|$TMP/$2/$NAME/|$dir/|" | without_user_symbols
	else
		node_config "$FREQ" "$dir" "127.0.0.1:$3" "$CONFIG_B"
	fi
}
if [ "$MODE" = samples ]; then
	agent_config "$NAME" check 1 >"$TMP/check.yaml"
	for want in 'report_interval: 5s' 'count_in_kernel: false' 'exporters: \[pprof\]'; do
		grep -q "$want" "$TMP/check.yaml" || {
			echo "per-sample config: '$want' not set in examples/default.yaml" >&2
			exit 1
		}
	done
fi

EXES=("$BIN" "$BIN_B" "$(readlink -f "$(command -v perf)")")
kib() { awk -v k="$2" '$1 == k":" {print $2}' /proc/"$1"/status; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# The load. The big binary is a copy, so the load's reads keep neither the
# agents' executable warm nor evicted.
LOAD_BIG=${LOAD_BIG:-1}
if [ "$LOAD_BIG" = 1 ]; then
	cp "${LOAD_BIN:-$BIN}" "$TMP/profcol-load"
	LB=$TMP/profcol-load
	# Addresses (file offsets) spread over its .text.
	read -r ADDRS < <(python3 - "$LB" <<'EOF'
import struct, sys
f = open(sys.argv[1], "rb").read()
shoff, = struct.unpack_from("<Q", f, 0x28)
shentsize, shnum, shstrndx = struct.unpack_from("<HHH", f, 0x3A)
sh = [struct.unpack_from("<IIQQQQIIQQ", f, shoff + i * shentsize) for i in range(shnum)]
strtab = sh[shstrndx][4]
name = lambda s: f[strtab + s[0]:f.index(b"\0", strtab + s[0])].decode()
text = next(s for s in sh if name(s) == ".text")
off, size = text[4], text[5]
print(" ".join(hex(off + size * i // 41) for i in range(1, 41)))
EOF
	)
	printf 'load binary: %s, %d MB, %s\n' "${LOAD_BIN:-$BIN}" "$(($(stat -c %s "$LB") / 1000000))" \
		"$(readelf -S "$LB" | grep -q '\.debug_info' && echo 'with .debug_info' || echo 'no .debug_info')"
fi
start_load() {
	sh -c 'while :; do :; done' &
	LOAD+=($!)
	SH_PID=$!
	dd if=/dev/zero of=/dev/null bs=4k 2>/dev/null &
	LOAD+=($!)
	DD_PID=$!
	if [ "$LOAD_BIG" = 1 ]; then
		# shellcheck disable=SC2016,SC2086
		bash -c 'trap "kill \$c 2>/dev/null; exit" TERM
			while :; do "$0" symbols lookup --file "$0" "${@:2}" >/dev/null 2>&1 & c=$!; wait $c; sleep "$1"; done' \
			"$LB" "$LOAD_PAUSE" $ADDRS &
		LOAD+=($!)
	fi
}

# Per-sample mode: samples per busy process (the shell loop's and dd's
# pids, the load binary's comm) from the agent's pprof files and perf.
count_samples() { # RUN
	local run=$1
	perf script -i "$TMP/$run/perf.data" -F comm,pid,time --ns 2>/dev/null >"$TMP/$run/perf.script"
	python3 - "$TMP/$run/$NAME/profiles" "$TMP/$run/perf.script" "$SH_PID" "$DD_PID" <<'EOF'
import glob, gzip, sys
pdir, script, sh, dd = sys.argv[1:5]
keys = {("pid", int(sh)): "sh loop", ("pid", int(dd)): "dd", ("comm", "profcol-load"): "profcol-load"}

def fields(buf):
    i = 0
    while i < len(buf):
        k, i = varint(buf, i)
        f, w = k >> 3, k & 7
        if w == 0:
            v, i = varint(buf, i)
        elif w == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif w == 1:
            v, i = int.from_bytes(buf[i:i + 8], "little"), i + 8
        elif w == 5:
            v, i = int.from_bytes(buf[i:i + 4], "little"), i + 4
        else:
            raise ValueError("wire type %d" % w)
        yield f, w, v

def varint(b, i):
    v = s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return v, i

def ints(w, v):
    if w == 0:
        return [v]
    out, i = [], 0
    while i < len(v):
        x, i = varint(v, i)
        out.append(x)
    return out

def profile(path):
    strings, types, samples, t, d = [], [], [], 0, 0
    for f, w, v in fields(gzip.open(path).read()):
        if f == 1:
            types.append(dict((g, x) for g, _, x in fields(v)))
        elif f == 2:
            vals, labels = [], []
            for g, gw, x in fields(v):
                if g == 2:
                    vals += ints(gw, x)
                elif g == 3:
                    labels.append(dict((h, y) for h, _, y in fields(x)))
            samples.append((vals, labels))
        elif f == 6:
            strings.append(v.decode())
        elif f == 9:
            t = v
        elif f == 10:
            d = v
    col = next(i for i, ty in enumerate(types) if strings[ty.get(1, 0)] == "samples")
    counts = dict.fromkeys(keys.values(), 0)
    for vals, labels in samples:
        for l in labels:
            k = strings[l.get(1, 0)]
            key = (k, l[3]) if 3 in l else (k, strings[l.get(2, 0)])
            if key in keys:
                counts[keys[key]] += vals[col]
    return t, t + d, counts

files = sorted((profile(p) for p in glob.glob(pdir + "/*.pb.gz")), key=lambda f: f[0])
if len(files) < 3:
    sys.exit("samples: %d pprof files in %s, need 3 or more (a longer END)" % (len(files), pdir))
files = files[1:-1]
t0, t1 = files[0][0], files[-1][1]
agent = dict.fromkeys(keys.values(), 0)
for _, _, c in files:
    for k, v in c.items():
        agent[k] += v
perf = dict.fromkeys(keys.values(), 0)
for line in open(script):
    parts = line.split()
    if len(parts) < 3:
        continue
    t = int(parts[-1].rstrip(":").replace(".", ""))
    if not t0 <= t < t1:
        continue
    pid, comm = int(parts[-2]), " ".join(parts[:-2])
    k = keys.get(("pid", pid)) or keys.get(("comm", comm))
    if k:
        perf[k] += 1
print("SAMPLES window %.1f s (%d agent reports; first and last dropped)" % ((t1 - t0) / 1e9, len(files)))
for k in keys.values():
    r = agent[k] / perf[k] if perf[k] else float("nan")
    print("SAMPLES %-13s agent %7d  perf %7d  agent/perf %.3f" % (k, agent[k], perf[k], r))
a, p = sum(agent.values()), sum(perf.values())
print("SAMPLES %-13s agent %7d  perf %7d  agent/perf %.3f" % ("busy total", a, p, a / p if p else float("nan")))
EOF
}

RESULTS=$TMP/results
: >"$RESULTS"
# run_once RUN EVICT PORT: the tools over the running load, figures into RESULTS.
run_once() {
	local run=$1 port=$3 t i
	mkdir -p "$TMP/$run"
	[ "$2" = 1 ] && evict "${EXES[@]}"
	for i in "${!AGENTS[@]}"; do agent_config "${AGENTS[$i]}" "$run" "$((port + i))" >"$TMP/$run/${AGENTS[$i]}.yaml"; done
	declare -A PID=() C1=() C2=() M1=() HWM=() RSS=()
	for t in "${AGENTS[@]}"; do
		local bin=$BIN
		[ "$t" = "$NAME_B" ] && bin=$BIN_B
		start_in "$run-$t" "$bin" --config "$TMP/$run/$t.yaml" >"$TMP/$run/$t.log" 2>&1 &
		PID[$t]=$!
	done
	local clock=()
	[ "$MODE" = samples ] && clock=(-k realtime)
	start_in "$run-perf" perf record "${clock[@]}" -F "$FREQ" -a -g -o "$TMP/$run/perf.data" >"$TMP/$run/perf.log" 2>&1 &
	PID[perf]=$!
	PIDS=("${PID[@]}")
	local t0
	t0=$(date +%s.%N)
	mem_poll "$TMP/$run/mem" "$POLL" "${TOOLS[@]/#/$run-}" &
	POLLER=$!
	until_at() { sleep "$(awk -v t0="$t0" -v at="$1" -v now="$(date +%s.%N)" 'BEGIN{d = t0 + at - now; print (d > 0 ? d : 0)}')"; }
	alive() {
		for t in "${TOOLS[@]}"; do
			kill -0 "${PID[$t]}" 2>/dev/null || {
				echo "$t exited early:"
				cat "$TMP/$run/$t.log"
				exit 1
			}
		done
	}
	until_at "$WINDOW1"
	alive
	for t in "${TOOLS[@]}"; do C1[$t]=$(cpu_ns "$run-$t" "${PID[$t]}"); done
	kill -USR1 "$POLLER"
	while read -r t a k _; do M1[${t#"$run"-}]=$((a + k)); done < <(mem_read "${TOOLS[@]/#/$run-}")
	printf '%s: load average at %ds: %s\n' "$run" "$WINDOW1" "$(loadavg)"
	until_at "$END"
	alive
	for t in "${TOOLS[@]}"; do
		C2[$t]=$(cpu_ns "$run-$t" "${PID[$t]}")
		HWM[$t]=$(kib "${PID[$t]}" VmHWM)
		RSS[$t]=$(kib "${PID[$t]}" VmRSS)
	done
	kill -TERM "$POLLER"
	wait "$POLLER" || true
	POLLER=""
	printf '%s: load average at %ds: %s\n' "$run" "$END" "$(loadavg)"
	for t in "${AGENTS[@]}"; do kill -TERM "${PID[$t]}"; done
	kill -INT "${PID[perf]}"
	for t in "${TOOLS[@]}"; do wait "${PID[$t]}" || true; done
	PIDS=()
	for t in "${AGENTS[@]}"; do
		grep -q 'perf events attached' "$TMP/$run/$t.log" || {
			echo "$t did not start:"
			cat "$TMP/$run/$t.log"
			exit 1
		}
	done
	for t in "${TOOLS[@]}"; do
		# mark: peak within the start-up window; end: peak up to END.
		read -r _ _ spk _ _ _ < <(grep "^mark $run-$t " "$TMP/$run/mem")
		read -r _ _ pk pa pkk prss < <(grep "^end $run-$t " "$TMP/$run/mem")
		echo "$run $t ${C1[$t]} ${C2[$t]} $pk $pa $pkk $spk ${M1[$t]} $prss ${HWM[$t]} ${RSS[$t]}" >>"$RESULTS"
	done
	[ "$MODE" = samples ] && count_samples "$run"
	rm -f "$TMP/$run/perf.data" "$TMP/$run/perf.script"
	cg_clear
}

printf 'mode %s, %s Hz, windows [0, %ds) and [%ds, %ds), memory polled every %ss, %d CPUs\n' \
	"$MODE" "$FREQ" "$WINDOW1" "$WINDOW1" "$END" "$POLL" "$(nproc)"
printf 'agents: %s (%s)' "$NAME" "$([ "$MODE" = samples ] && echo 'per-sample: 5s reports, count_in_kernel false, ebpf -> kernel_symbols -> pprof' || echo "$CONFIG")"
[ -n "$CONFIG_B" ] && printf ', %s (%s)' "$NAME_B" "$(case $CONFIG_B in user_symbols) echo "$NAME's + user_symbols" ;; no_names) echo "$NAME's without user_symbols" ;; *) echo "$CONFIG_B" ;; esac)"
printf '\nload average before: %s\n' "$(loadavg)"
start_load
sleep 1
run_once cold "${EVICT:-1}" "$METRICS_PORT"
[ "$RESTART" = 1 ] && run_once warm "${EVICT_WARM:-0}" "$((METRICS_PORT + 4))"
printf 'load average after: %s\n' "$(loadavg)"

python3 - "$RESULTS" "$WINDOW1" "$END" "${TOOLS[@]}" <<'EOF'
import sys
path, w1, end, tools = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
MiB = 1 << 20
rows = {}
for l in open(path):
    run, t, c1, c2, pk, pa, pkk, spk, m1, prss, hwm, rss = l.split()
    c1, c2 = int(c1), int(c2)
    rows[(run, t)] = {
        "cpu start-up us/s": c1 / 1e3 / w1,
        "cpu steady us/s": (c2 - c1) / 1e3 / (end - w1),
        "mem peak MiB": int(pk) / MiB,
        "mem start-up peak MiB": int(spk) / MiB,
        f"mem@{w1}s MiB": int(m1) / MiB,
        "RSS peak MiB": int(prss) / 1024,
        "VmHWM MiB": int(hwm) / 1024,
        f"VmRSS@{end}s MiB": int(rss) / 1024,
        "_parts": (int(pa) / MiB, int(pkk) / MiB),
    }
runs = list(dict.fromkeys(r for r, _ in rows))
for run in runs:
    for t in tools:
        r = rows[(run, t)]
        a, k = r["_parts"]
        print(f"{run} {t:8} CPU start-up {r['cpu start-up us/s']:8.1f} us/s  steady {r['cpu steady us/s']:7.1f} us/s"
              f" | anon+kernel peak {r['mem peak MiB']:6.1f} MiB (anon {a:.1f} + kernel {k:.1f})"
              f"  start-up peak {r['mem start-up peak MiB']:6.1f}  @{w1}s {r[f'mem@{w1}s MiB']:6.1f}"
              f" | RSS peak {r['RSS peak MiB']:6.1f}  VmHWM {r['VmHWM MiB']:6.1f}  VmRSS@{end}s {r[f'VmRSS@{end}s MiB']:6.1f} MiB")
    p = rows[(run, "perf")]
    for t in tools[:-1]:
        r = rows[(run, t)]
        print(f"RATIO {run} {t}/perf " + "  ".join(
            f"{k.replace(' MiB', '').replace(' us/s', '')} {r[k] / p[k]:.2f}x" if p[k] else f"{k} -"
            for k in r if not k.startswith("_")))
EOF
