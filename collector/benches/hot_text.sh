#!/usr/bin/env bash
# Writes collector/hot-text.order: the functions the default node agent runs
# in its first report interval, which release builds of `profcol` link next
# to each other (collector/build.rs; docs/PERFORMANCE.md "Node agent against
# perf record"), in three groups: what runs between reports (the sampler's every
# second), then what only a report runs (the receiver's build,
# symbolization, conversion, encoding, compression), then what only
# start-up ran. The agent drops its code pages as start-up goes and, at most
# every 30 s, as a batch arrives (collector/src/loader_pages.rs): what faults
# back in then should find its own phase's code around it, not another's,
# and a report maps the code it runs on top of the sampler's, not the whole
# steady state's.
#
#   sudo collector/benches/hot_text.sh                  # build, run 70 s, write the list
#   PROFCOL_BIN=path SECONDS_RUN=70 sudo -E collector/benches/hot_text.sh
#   MERGE=1 sudo -E collector/benches/hot_text.sh       # add to the list, do not replace it
#
# How: the release binary is copied to a file no page cache holds, the
# read-ahead of the disk under it is set to 0 for the run (restored on exit),
# and the copy runs examples/default.yaml at 99 Hz over two busy CPUs. With
# no read-ahead every fault reads exactly its page, so the binary's pages in
# the page cache (mincore) are the pages ever run. Start-up's are those
# cached at 3 s; the page cache is then emptied (the agent dropped its code
# at 2 s, so nothing holds it), and what is cached 5 s before the first
# report (REPORT_AT, 60 s) ran between reports; what is cached at the end
# and not then ran in the report. The functions on them (nm) are the list.
# Two runs reach different code (which processes
# were sampled, what the reports held): MERGE=1 keeps the functions of the
# existing list that the binary still has. Re-run it after large changes;
# names the build no longer has are skipped by the linker, so a stale list
# only costs locality.
# Needs root and binutils' nm.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=receivers/benches/node_config.sh
. receivers/benches/node_config.sh
SECONDS_RUN=${SECONDS_RUN:-70}
# The first report, seconds after the start: the node config's report_interval.
REPORT_AT=$(node_report_seconds)
OUT=${OUT:-collector/hot-text.order}
if [ -z "${PROFCOL_BIN:-}" ]; then
	cargo build --release -q -p profcol --bin profcol
fi
BIN=${PROFCOL_BIN:-${CARGO_TARGET_DIR:-target}/release/profcol}
TMP=$(mktemp -d "${TMPDIR:-/var/tmp}/hot-text.XXXXXX")
PIDS=()
RA_FILE=""
RA_OLD=""
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	[ -n "$RA_FILE" ] && echo "$RA_OLD" >"$RA_FILE"
	rm -rf "$TMP"
}
trap cleanup EXIT

# The disk under TMP (its whole device if TMP is on a partition).
dev=$(basename "$(findmnt -no SOURCE --target "$TMP")")
[ -e "/sys/class/block/$dev/partition" ] && dev=$(basename "$(readlink -f "/sys/class/block/$dev/..")")
RA_FILE=/sys/block/$dev/queue/read_ahead_kb
[ -w "$RA_FILE" ] || { echo "hot_text: cannot set $RA_FILE (needs root and a block device under $TMP)" >&2; exit 1; }
RA_OLD=$(cat "$RA_FILE")

cp "$BIN" "$TMP/profcol"
# Written back first: the kernel drops only clean pages from its cache.
sync "$TMP/profcol"
python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$TMP/profcol"
node_config 99 "$TMP" "127.0.0.1:${METRICS_PORT:-18897}" >"$TMP/node.yaml"
echo 0 >"$RA_FILE"
sh -c 'while :; do :; done' &
PIDS+=($!)
dd if=/dev/zero of=/dev/null bs=4k 2>/dev/null &
PIDS+=($!)
"$TMP/profcol" --config "$TMP/node.yaml" >"$TMP/agent.log" 2>&1 &
AGENT=$!
PIDS+=("$AGENT")
# The code pages of the binary in the page cache, as page numbers from the
# ELF's address 0, into file $1.
pages() {
	python3 - "$AGENT" "$TMP/profcol" "$1" <<'PY'
import ctypes, os, sys
pid, path, out = sys.argv[1:]
maps = [l.split() for l in open(f"/proc/{pid}/maps") if l.rstrip().endswith(path)]
# The first mapping (file offset 0) is where the ELF's address 0 is loaded.
bias = next(int(m[0].split("-")[0], 16) for m in maps if int(m[2], 16) == 0)
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
base = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED: nothing faults in
cached = (ctypes.c_ubyte * ((size + 4095) // 4096))()
if libc.mincore(ctypes.c_void_p(base), ctypes.c_size_t(size), cached) != 0:
    sys.exit(f"mincore: errno {ctypes.get_errno()}")
run = []
for m in maps:
    if "x" not in m[1]:
        continue
    lo, hi = (int(x, 16) for x in m[0].split("-"))
    first = int(m[2], 16) // 4096
    run += [(lo - bias) // 4096 + i for i in range((hi - lo) // 4096) if cached[first + i] & 1]
open(out, "w").write("".join(f"{p}\n" for p in run))
PY
}
alive() { kill -0 "$AGENT" 2>/dev/null || { echo "hot_text: the agent exited:" >&2; cat "$TMP/agent.log" >&2; exit 1; }; }
[ "$SECONDS_RUN" -gt "$REPORT_AT" ] || { echo "hot_text: SECONDS_RUN must pass the first report at $REPORT_AT s" >&2; exit 1; }
sleep 3
alive
pages "$TMP/startup.pages"
# The agent has dropped its code: what is not mapped leaves the cache.
python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$TMP/profcol"
sleep "$((REPORT_AT - 5 - 3))"
alive
pages "$TMP/between.pages"
sleep "$((SECONDS_RUN - REPORT_AT + 5))"
alive
pages "$TMP/end.pages"
echo "$RA_OLD" >"$RA_FILE"
RA_FILE=""
python3 - "$TMP/profcol" "$OUT" "${MERGE:-0}" "$TMP/startup.pages" "$TMP/between.pages" "$TMP/end.pages" <<'PY'
import os, subprocess, sys
path, out, merge, startup, between, end = sys.argv[1:]
kept = set()
if merge == "1" and os.path.exists(out):
    kept = set(open(out).read().split())
pages = lambda f: set(int(x) for x in open(f).read().split())
startup, between, end = pages(startup), pages(between), pages(end)
report = end - between
phases = ([], [], [])  # between reports, the report only, start-up (and kept) only
seen = set()
nm = subprocess.run(["nm", "-n", "-S", "--defined-only", path], capture_output=True, text=True, check=True)
for line in nm.stdout.splitlines():
    f = line.split()
    if len(f) != 4 or f[2] not in "tTW":
        continue
    addr, size = int(f[0], 16), int(f[1], 16)
    on = range(addr // 4096, (addr + size - 1) // 4096 + 1)
    if not size or f[3] in seen:
        continue
    if any(p in between for p in on):
        phases[0].append(f[3])
    elif any(p in report for p in on):
        phases[1].append(f[3])
    elif any(p in startup for p in on) or f[3] in kept:
        phases[2].append(f[3])
    else:
        continue
    seen.add(f[3])
names = phases[0] + phases[1] + phases[2]
open(out, "w").write("".join(n + "\n" for n in names))
print(f"hot_text: text pages run in start-up {len(startup)} ({len(startup) * 4} KiB), between reports "
      f"{len(between)} ({len(between) * 4} KiB), in the report only {len(report)} ({len(report) * 4} KiB); "
      f"functions: {len(phases[0])} between reports, {len(phases[1])} report, {len(phases[2])} start-up -> {out}")
PY
