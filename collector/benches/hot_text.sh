#!/usr/bin/env bash
# Writes collector/hot-text.order: the functions the default node agent runs
# in its first report interval, which release builds of `profcol` link next
# to each other (collector/build.rs; docs/PERFORMANCE.md "Twelfth pass: peak
# RSS"). The functions the steady state runs come first, then those only
# start-up ran: the agent drops its code pages as start-up goes (after the
# configuration is read, once the service has started, and 2 s later:
# collector/src/loader_pages.rs), and what faults back in then should find
# steady-state code around it, not start-up's.
#
#   sudo collector/benches/hot_text.sh                  # build, run 70 s, write the list
#   PROFCOL_BIN=path SECONDS_RUN=70 sudo -E collector/benches/hot_text.sh
#   MERGE=1 sudo -E collector/benches/hot_text.sh       # add to the list, do not replace it
#
# How: the release binary is copied to a file no page cache holds, the
# read-ahead of the disk under it is set to 0 for the run (restored on exit),
# and the copy runs examples/default.yaml at 99 Hz over two busy CPUs. With
# no read-ahead every fault reads exactly its page, so the pages present in
# the text mapping (/proc/PID/pagemap) are the pages run, and the binary's
# pages in the page cache (mincore) the pages ever run, dropped or not.
# Start-up's are those cached at 3 s; the steady state's are those present
# at the end, run after the agent dropped its code at 2 s (the binary's
# page cache is emptied at 3 s, so that a fault then maps no cached
# neighbour). The functions on them (nm) are the list. Two runs reach different code (which processes
# were sampled, what the reports held): MERGE=1 keeps the functions of the
# existing list that the binary still has. Re-run it after large changes;
# names the build no longer has are skipped by the linker, so a stale list
# only costs locality.
# Needs root and binutils' nm.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_RUN=${SECONDS_RUN:-70}
OUT=${OUT:-collector/hot-text.order}
if [ -z "${PROFCOL_BIN:-}" ]; then
	cargo build --release -q -p profcol --bin profcol
fi
BIN=${PROFCOL_BIN:-${CARGO_TARGET_DIR:-target}/release/profcol}
# shellcheck source=receivers/benches/node_config.sh
. receivers/benches/node_config.sh
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
# The code pages present in the agent's text mapping ($2 = mapped) or in the
# page cache ($2 = cached), as page numbers from the ELF's address 0, into
# file $1.
pages() {
	python3 - "$AGENT" "$TMP/profcol" "$1" "$2" <<'PY'
import ctypes, os, struct, sys
pid, path, out, which = sys.argv[1:]
maps = [l.split() for l in open(f"/proc/{pid}/maps") if l.rstrip().endswith(path)]
# The first mapping (file offset 0) is where the ELF's address 0 is loaded.
bias = next(int(m[0].split("-")[0], 16) for m in maps if int(m[2], 16) == 0)
run = []
if which == "cached":
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    base = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED: nothing faults in
    cached = (ctypes.c_ubyte * ((size + 4095) // 4096))()
    if libc.mincore(ctypes.c_void_p(base), ctypes.c_size_t(size), cached) != 0:
        sys.exit(f"mincore: errno {ctypes.get_errno()}")
for m in maps:
    if "x" not in m[1]:
        continue
    lo, hi = (int(x, 16) for x in m[0].split("-"))
    if which == "cached":
        first = int(m[2], 16) // 4096
        run += [(lo - bias) // 4096 + i for i in range((hi - lo) // 4096) if cached[first + i] & 1]
        continue
    with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        pagemap.seek(lo // 4096 * 8)
        entries = pagemap.read((hi - lo) // 4096 * 8)
    for i in range(len(entries) // 8):
        if struct.unpack_from("<Q", entries, i * 8)[0] >> 63:  # present
            run.append((lo - bias) // 4096 + i)
open(out, "w").write("".join(f"{p}\n" for p in run))
PY
}
alive() { kill -0 "$AGENT" 2>/dev/null || { echo "hot_text: the agent exited:" >&2; cat "$TMP/agent.log" >&2; exit 1; }; }
sleep 3
alive
pages "$TMP/startup.pages" cached
# The agent has dropped its code: what is not mapped leaves the cache.
python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$TMP/profcol"
sleep "$((SECONDS_RUN - 3))"
alive
pages "$TMP/steady.pages" mapped
echo "$RA_OLD" >"$RA_FILE"
RA_FILE=""
python3 - "$TMP/profcol" "$OUT" "${MERGE:-0}" "$TMP/startup.pages" "$TMP/steady.pages" <<'PY'
import os, subprocess, sys
path, out, merge, startup, steady = sys.argv[1:]
kept = set()
if merge == "1" and os.path.exists(out):
    kept = set(open(out).read().split())
startup = set(int(x) for x in open(startup).read().split())
steady = set(int(x) for x in open(steady).read().split())
phases = ([], [])  # steady state, then start-up (and kept) only
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
    if any(p in steady for p in on):
        phases[0].append(f[3])
    elif any(p in startup for p in on) or f[3] in kept:
        phases[1].append(f[3])
    else:
        continue
    seen.add(f[3])
names = phases[0] + phases[1]
open(out, "w").write("".join(n + "\n" for n in names))
print(f"hot_text: {len(startup)} text pages run in start-up ({len(startup) * 4} KiB), {len(steady)} after it "
      f"({len(steady) * 4} KiB); {len(phases[0])} steady-state functions, then {len(phases[1])} -> {out}")
PY
