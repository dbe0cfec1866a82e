# Sourced by the benchmark scripts beside it: CPU time and memory per tool,
# read from a cgroup of its own, as a cluster charges them.
#
# CPU: cpuacct.usage on cgroup v1, cpu.stat usage_usec on v2, which keeps
# the time of threads that have exited. Where no cgroup can be made, the
# sum of the first field of /proc/PID/task/*/schedstat, which loses it (a
# tokio blocking thread ends after 10 s idle and takes its CPU out of the
# sum).
# Memory: anonymous + kernel memory charged to the tool's memory cgroup:
# v1 memory.stat `rss` (which already holds `rss_huge`, transparent huge
# pages: not added again) + memory.kmem.usage_in_bytes; v2 memory.stat
# `anon` + `kernel`. BPF maps count (charged to their creator's cgroup),
# the page cache of files read does not. Needs root for the cgroups.
#
#   start_in TOOL CMD...   (in the background: `start_in t cmd &; PID=$!`)
#   cpu_ns TOOL PID        ns of CPU so far
#   mem_read TOOL...       one line per tool: TOOL ANON KERNEL (bytes) RSS (KiB,
#                          VmRSS summed over the cgroup's processes)
#   mem_poll OUT PERIOD TOOL...   (in the background: `mem_poll f 0.1 a b & P=$!`)
#                          reads them every PERIOD s; on SIGUSR1 appends
#                          `mark TOOL PEAK ANON KERNEL PEAK_RSS` (the peak of
#                          anon+kernel so far, its parts then, the peak RSS
#                          in KiB) to OUT, on SIGTERM the same as `end` and exits
#   cg_clear               removes the tools' cgroups (processes gone)
#   cg_remove              and the script's own
#   evict FILE...          empties the page cache of FILEs (a cold start)
CG=""
if [ -w /sys/fs/cgroup/cpuacct ] && [ -f /sys/fs/cgroup/cpuacct/cpuacct.usage ]; then
	CG=/sys/fs/cgroup/cpuacct/profcol-bench-$$
elif [ -f /sys/fs/cgroup/cgroup.controllers ] && [ -w /sys/fs/cgroup ]; then
	CG=/sys/fs/cgroup/profcol-bench-$$
elif [ -w /sys/fs/cgroup/unified ]; then
	CG=/sys/fs/cgroup/unified/profcol-bench-$$
fi
[ -n "$CG" ] && mkdir -p "$CG" 2>/dev/null || CG=""
echo "CPU read from: ${CG:-/proc/PID/task/*/schedstat (exited threads not counted)}"
# The memory cgroup: v1's memory hierarchy, or on v2 the CPU cgroup itself
# with the memory controller given to its children.
MCG=""
MCG_KIND=""
if [ -w /sys/fs/cgroup/memory ] && [ -f /sys/fs/cgroup/memory/memory.stat ]; then
	MCG=/sys/fs/cgroup/memory/profcol-bench-$$
	MCG_KIND=v1
	mkdir -p "$MCG" 2>/dev/null || MCG=""
elif [ -n "$CG" ] && [ -f "$CG/cgroup.subtree_control" ] && grep -qw memory "$CG/cgroup.controllers" 2>/dev/null; then
	echo +memory >"$CG/cgroup.subtree_control" 2>/dev/null && MCG=$CG && MCG_KIND=v2
fi
echo "memory read from: ${MCG:-nowhere (no memory cgroup could be made)}"
# start_in TOOL CMD...: runs CMD (same pid: exec) inside TOOL's cgroups.
start_in() {
	local t=$1 dirs=""
	shift
	[ -n "$CG" ] && mkdir -p "$CG/$t" && dirs="$CG/$t"
	[ -n "$MCG" ] && [ "$MCG" != "$CG" ] && mkdir -p "$MCG/$t" && dirs="$dirs $MCG/$t"
	if [ -n "$dirs" ]; then
		exec sh -c 'for d in $0; do echo $$ >"$d/cgroup.procs" || exit 1; done; exec "$@"' "$dirs" "$@"
	fi
	exec "$@"
}
cpu_ns() { # TOOL PID
	if [ -f "$CG/$1/cpuacct.usage" ]; then
		cat "$CG/$1/cpuacct.usage"
	elif [ -f "$CG/$1/cpu.stat" ]; then
		awk '$1 == "usage_usec" {printf "%.0f\n", $2 * 1000}' "$CG/$1/cpu.stat"
	else
		{ cat /proc/"$2"/task/*/schedstat 2>/dev/null || true; } | awk '{s += $1} END {printf "%.0f\n", s}'
	fi
}
# One reader for mem_read and mem_poll: the same sums in both.
_CG_MEM_PY='
import os, signal, sys, time
base, kind, mode = sys.argv[1:4]
V2_KERNEL = ("kernel_stack", "pagetables", "sec_pagetables", "percpu", "sock", "slab", "vmalloc")
def parts(t):
    d = os.path.join(base, t)
    try:
        st = {}
        with open(d + "/memory.stat") as f:
            for line in f:
                k, v = line.split()
                st[k] = int(v)
        if kind == "v1":
            with open(d + "/memory.kmem.usage_in_bytes") as f:
                return st.get("rss", 0), int(f.read())
        # kernel: Linux 5.18 and later; before it, its parts.
        return st.get("anon", 0), st["kernel"] if "kernel" in st else sum(st.get(k, 0) for k in V2_KERNEL)
    except (OSError, ValueError):
        return None
def rss_kib(t):
    kib = 0
    try:
        with open(os.path.join(base, t, "cgroup.procs")) as f:
            pids = f.read().split()
    except OSError:
        return 0
    for p in pids:
        try:
            with open("/proc/%s/status" % p) as f:
                kib += next((int(l.split()[1]) for l in f if l.startswith("VmRSS:")), 0)
        except OSError:
            pass
    return kib
if mode == "once":
    for t in sys.argv[4:]:
        a, k = parts(t) or (0, 0)
        print(t, a, k, rss_kib(t))
    sys.exit(0)
out, period, tools = sys.argv[4], float(sys.argv[5]), sys.argv[6:]
peak = {t: (0, 0, 0) for t in tools}
rss = dict.fromkeys(tools, 0)
want = []
signal.signal(signal.SIGUSR1, lambda *_: want.append("mark"))
signal.signal(signal.SIGTERM, lambda *_: want.append("end"))
def poll():
    for t in tools:
        p = parts(t)
        if p and p[0] + p[1] > peak[t][0]:
            peak[t] = (p[0] + p[1], p[0], p[1])
        rss[t] = max(rss[t], rss_kib(t))
while True:
    poll()
    while want:
        w = want.pop(0)
        with open(out, "a") as f:
            for t in tools:
                print(w, t, *peak[t], rss[t], file=f)
        if w == "end":
            sys.exit(0)
    time.sleep(period)
'
mem_read() { # TOOL...
	[ -n "$MCG" ] || { echo "mem_read: no memory cgroup" >&2; return 1; }
	python3 -c "$_CG_MEM_PY" "$MCG" "$MCG_KIND" once "$@"
}
mem_poll() { # OUT PERIOD TOOL...
	[ -n "$MCG" ] || { echo "mem_poll: no memory cgroup" >&2; return 1; }
	exec python3 -c "$_CG_MEM_PY" "$MCG" "$MCG_KIND" poll "$@"
}
# Empties the run's cgroups (their processes are gone by then).
cg_clear() {
	local d
	for d in ${CG:+"$CG"/*/} ${MCG:+"$MCG"/*/}; do [ -d "$d" ] && rmdir "$d" 2>/dev/null; done
	true
}
cg_remove() {
	cg_clear
	[ -n "$CG" ] && rmdir "$CG" 2>/dev/null
	[ -n "$MCG" ] && [ "$MCG" != "$CG" ] && rmdir "$MCG" 2>/dev/null
	true
}
# Empties the page cache of files $@ (written back first: only clean pages
# leave the cache; pages mapped by a running process stay).
evict() {
	sync "$@"
	python3 -c 'import os, sys
for f in sys.argv[1:]:
    fd = os.open(f, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$@"
}
