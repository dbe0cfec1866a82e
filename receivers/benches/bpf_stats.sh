# Sourced by the benchmark scripts beside it: the run time of the BPF
# programs a process holds (its fds name them), from bpftool's listing;
# kernel.bpf_stats_enabled (or BPF_ENABLE_STATS held by someone) must be on.
#
#   prog_stats PID        run_time_ns run_cnt of its profcol_cpu_sample program
#                         (the entry program's time includes its tail calls)
#   prog_named PID NAME   run_time_ns run_cnt of its program NAME
#   bpf_ns PID            run_time_ns summed over every program it holds
bpf_stats_of() { # PID NAME|sum
	bpftool prog show --json | python3 -c '
import glob, json, sys
ids = set()
for f in glob.glob("/proc/%s/fdinfo/*" % sys.argv[1]):
    try:
        for line in open(f):
            if line.startswith("prog_id:"):
                ids.add(int(line.split()[1]))
    except OSError:
        pass
progs = [p for p in json.load(sys.stdin) if p.get("id") in ids]
if sys.argv[2] == "sum":
    print(sum(p.get("run_time_ns", 0) for p in progs))
else:
    p = next((p for p in progs if p.get("name") == sys.argv[2]), {})
    print(p.get("run_time_ns", 0), p.get("run_cnt", 0))' "$1" "$2"
}
prog_stats() { bpf_stats_of "$1" profcol_cpu_sample; }
prog_named() { bpf_stats_of "$1" "$2"; }
bpf_ns() { bpf_stats_of "$1" sum; }
