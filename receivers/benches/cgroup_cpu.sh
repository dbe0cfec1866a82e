# Sourced by the benchmark scripts beside it: CPU time per tool, read from
# a cgroup of its own (cpuacct.usage on cgroup v1, cpu.stat usage_usec on
# v2), which keeps the time of threads that have exited. Where no cgroup can
# be made, the sum of the first field of /proc/PID/task/*/schedstat, which
# loses it (a tokio blocking thread ends after 10 s idle and takes its CPU
# out of the sum). Needs root for the cgroup.
#
#   start_in TOOL CMD...   (in the background: `start_in t cmd &; PID=$!`)
#   cpu_ns TOOL PID        ns of CPU so far
#   cg_clear               removes the tools' cgroups (processes gone)
#   cg_remove              and the script's own
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
# start_in TOOL CMD...: runs CMD (same pid: exec) inside TOOL's cgroup.
start_in() {
	local t=$1
	shift
	if [ -n "$CG" ]; then
		mkdir -p "$CG/$t"
		exec sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CG/$t" "$@"
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
# Empties the run's cgroups (their processes are gone by then).
cg_clear() { [ -n "$CG" ] && for d in "$CG"/*/; do [ -d "$d" ] && rmdir "$d" 2>/dev/null; done; true; }
cg_remove() { cg_clear; [ -n "$CG" ] && rmdir "$CG" 2>/dev/null; true; }
