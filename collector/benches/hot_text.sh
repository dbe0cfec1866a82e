#!/usr/bin/env bash
# Writes collector/hot-text.order: the functions the default node agent runs
# in its first report interval, in address order, which release builds of
# `profcol` link next to each other (collector/build.rs; docs/PERFORMANCE.md
# "Twelfth pass: peak RSS").
#
#   sudo collector/benches/hot_text.sh                  # build, run 70 s, write the list
#   PROFCOL_BIN=path SECONDS_RUN=70 sudo -E collector/benches/hot_text.sh
#   MERGE=1 sudo -E collector/benches/hot_text.sh       # add to the list, do not replace it
#
# How: the release binary is copied to a file no page cache holds, the
# read-ahead of the disk under it is set to 0 for the run (restored on exit),
# and the copy runs examples/default.yaml at 99 Hz over two busy CPUs. With
# no read-ahead every fault reads exactly its page, so the pages present in
# the text mapping (/proc/PID/pagemap) are the pages run. The functions on
# them (nm) are the list. Two runs reach different code (which processes
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
sleep "$SECONDS_RUN"
kill -0 "$AGENT" 2>/dev/null || { echo "hot_text: the agent exited:" >&2; cat "$TMP/agent.log" >&2; exit 1; }
echo "$RA_OLD" >"$RA_FILE"
RA_FILE=""
python3 - "$AGENT" "$TMP/profcol" "$OUT" "${MERGE:-0}" <<'PY'
import os, struct, subprocess, sys
pid, path, out, merge = sys.argv[1:]
kept = set()
if merge == "1" and os.path.exists(out):
    kept = set(open(out).read().split())
maps = [l.split() for l in open(f"/proc/{pid}/maps") if l.rstrip().endswith(path)]
# The first mapping (file offset 0) is where the ELF's address 0 is loaded.
bias = next(int(m[0].split("-")[0], 16) for m in maps if int(m[2], 16) == 0)
run = set()
with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
    for m in maps:
        if "x" not in m[1]:
            continue
        lo, hi = (int(x, 16) for x in m[0].split("-"))
        pagemap.seek(lo // 4096 * 8)
        entries = pagemap.read((hi - lo) // 4096 * 8)
        for i in range(len(entries) // 8):
            if struct.unpack_from("<Q", entries, i * 8)[0] >> 63:  # present
                run.add((lo - bias) // 4096 + i)
names, seen = [], set()
nm = subprocess.run(["nm", "-n", "-S", "--defined-only", path], capture_output=True, text=True, check=True)
for line in nm.stdout.splitlines():
    f = line.split()
    if len(f) != 4 or f[2] not in "tTW":
        continue
    addr, size = int(f[0], 16), int(f[1], 16)
    ran = any(p in run for p in range(addr // 4096, (addr + size - 1) // 4096 + 1))
    if size and f[3] not in seen and (ran or f[3] in kept):
        seen.add(f[3])
        names.append(f[3])
open(out, "w").write("".join(n + "\n" for n in names))
print(f"hot_text: {len(run)} text pages run ({len(run) * 4} KiB), {len(names)} functions -> {out}")
PY
