//! The receiver's own series (`profcol_receiver_<name>`), declared once:
//! the sampler, unwinding and uprobes register their cells from these, and
//! the factory lists them ([`METRICS`]) for docs/CONFIG.md's table.

use profcol_api::telemetry::MetricDef;

// The sampler: samples, records, processes, CPUs.
pub(crate) const SAMPLES: MetricDef =
    MetricDef::counter("ebpf_samples_total", "samples", "Samples read from the BPF ring buffer");
pub(crate) const SAMPLES_LOST_RINGBUF: MetricDef = MetricDef::counter(
    "ebpf_samples_lost_ringbuf_total",
    "samples",
    "Samples dropped by the BPF program because the ring buffer was full",
);
pub(crate) const KERNEL_STACK_ERRORS: MetricDef =
    MetricDef::counter("ebpf_kernel_stack_errors_total", "samples", "bpf_get_stack failures (kernel stack)");
pub(crate) const USER_STACK_ERRORS: MetricDef =
    MetricDef::counter("ebpf_user_stack_errors_total", "samples", "bpf_get_stack failures (user stack)");
pub(crate) const STACKS_CUT: MetricDef = MetricDef::counter(
    "ebpf_stacks_cut_total",
    "samples",
    "Samples whose stack ended in frames that are no code (0, or outside every executable mapping: a \
     frame-pointer walk through code built without frame pointers); those frames were cut",
);
pub(crate) const RECORDS_MALFORMED: MetricDef =
    MetricDef::counter("ebpf_records_malformed_total", "1", "Ring buffer records that did not decode");
pub(crate) const PROC_UNREADABLE: MetricDef = MetricDef::counter(
    "ebpf_proc_unreadable_total",
    "processes",
    "Processes whose /proc entry could not be read (samples kept without mappings)",
);
pub(crate) const MAPS_REFRESHES: MetricDef =
    MetricDef::counter("ebpf_maps_refreshes_total", "1", "Re-reads of /proc/PID/maps after an address miss");
pub(crate) const PROCESS_EXEC_RELOADS: MetricDef = MetricDef::counter(
    "ebpf_process_exec_reloads_total",
    "processes",
    "Processes read again (executable, build ID, mappings) because they exec'd after they were read",
);
pub(crate) const PROCESSES_FROM_RECORDS: MetricDef = MetricDef::counter(
    "ebpf_processes_from_records_total",
    "processes",
    "Processes known from the kernel's exec and mapping records (no /proc read but the cgroup)",
);
pub(crate) const BUILD_ID_READS: MetricDef =
    MetricDef::counter("ebpf_build_id_reads_total", "1", "ELF files read for a build ID (cache misses)");
pub(crate) const BATCHES: MetricDef = MetricDef::counter("ebpf_batches_total", "1", "Batches pushed downstream");
pub(crate) const PROCESSES: MetricDef =
    MetricDef::gauge("ebpf_processes", "processes", "Processes currently known to the receiver");
pub(crate) const SAMPLE_FREQUENCY: MetricDef = MetricDef::gauge(
    "ebpf_sample_frequency_hertz",
    "Hz",
    "Samples per second per CPU now: sample_frequency, or lower while max_cpu holds it down",
);
pub(crate) const CPUS_SAMPLED: MetricDef =
    MetricDef::gauge("ebpf_cpus_sampled", "1", "CPUs with a live sampling perf event");
pub(crate) const CPU_ATTACHES: MetricDef = MetricDef::counter(
    "ebpf_cpu_attaches_total",
    "1",
    "Per-CPU perf events attached (at start, when a CPU comes online, after an offline/online cycle)",
);
pub(crate) const CPU_ATTACH_FAILURES: MetricDef = MetricDef::counter(
    "ebpf_cpu_attach_failures_total",
    "1",
    "Failed attempts to attach a CPU's perf event (that CPU is not sampled; retried with backoff)",
);
pub(crate) const SAMPLES_COUNTED_IN_KERNEL: MetricDef = MetricDef::counter(
    "ebpf_samples_counted_in_kernel_total",
    "samples",
    "On-CPU samples counted per stack in the kernel, without a record of their own (count_in_kernel)",
);
pub(crate) const SAMPLES_FILTERED: MetricDef = MetricDef::counter(
    "ebpf_samples_filtered_total",
    "samples",
    "Samples dropped in the kernel before any stack walk: their process is outside `targets` (or `pids`), \
     or in a cgroup whose verdict the receiver was still reading",
);
pub(crate) const SAMPLES_COUNTS_FULL: MetricDef = MetricDef::counter(
    "ebpf_samples_counts_full_total",
    "samples",
    "Samples sent one by one because the kernel's counts map was full (raise max_counted_stacks)",
);
pub(crate) const SAMPLES_DYNAMIC_KERNEL_TEXT: MetricDef = MetricDef::counter(
    "ebpf_samples_dynamic_kernel_text_total",
    "samples",
    "Samples sent one by one because a kernel frame was outside the kernel's own text (BPF programs, \
     modules, trampolines: names that may change while samples are taken)",
);
pub(crate) const SAMPLES_COUNTED_UNNAMED: MetricDef = MetricDef::counter(
    "ebpf_samples_counted_unnamed_total",
    "samples",
    "Samples counted in the kernel and dropped because their stack's record never reached the reader \
     (ring buffer full)",
);
pub(crate) const PROCESS_EXECS: MetricDef =
    MetricDef::counter("ebpf_process_execs_total", "1", "exec events (sched_process_exec)");
pub(crate) const PROCESS_EXITS: MetricDef =
    MetricDef::counter("ebpf_process_exits_total", "processes", "Process exits (sched_process_exit of the leader)");
pub(crate) const PROCESS_EVENTS_LOST: MetricDef = MetricDef::counter(
    "ebpf_process_events_lost_total",
    "1",
    "exec/exit events lost because their ring buffer was full (followed processes are re-checked against /proc)",
);

// Unwinding: how user stacks ended, and the tables in the kernel.
pub(crate) const UNWIND_STACK_END: MetricDef = MetricDef::counter(
    "ebpf_unwind_stack_end_total",
    "samples",
    "User stacks by how they ended (outermost frame, no table, unsupported rule, depth limit, \
     read error); frame-pointer-only stacks (mode frame_pointers) are not counted",
)
.by("reason");
pub(crate) const UNWIND_TABLE_BUILDS: MetricDef =
    MetricDef::counter("ebpf_unwind_table_builds_total", "1", "Unwind tables built from .eh_frame/.debug_frame");
pub(crate) const UNWIND_TABLE_BUILD_FAILURES: MetricDef = MetricDef::counter(
    "ebpf_unwind_table_build_failures_total",
    "1",
    "Files whose unwind table could not be built or loaded (no CFI, not x86-64, over max_table_bytes, \
     map update failed); their code is walked by frame pointers in mode auto",
);
pub(crate) const UNWIND_TABLE_BUILD_MICROS: MetricDef = MetricDef::counter(
    "ebpf_unwind_table_build_microseconds_total",
    "microseconds",
    "Time spent building and loading unwind tables",
);
pub(crate) const UNWIND_TABLE_EVICTIONS: MetricDef = MetricDef::counter(
    "ebpf_unwind_table_evictions_total",
    "1",
    "Unwind tables evicted to stay within unwind.max_table_bytes (least recently used first)",
);
pub(crate) const UNWIND_TABLES_LOADED: MetricDef =
    MetricDef::gauge("ebpf_unwind_tables_loaded", "1", "Unwind tables loaded into the kernel");
pub(crate) const UNWIND_TABLE_BYTES: MetricDef = MetricDef::gauge(
    "ebpf_unwind_table_bytes",
    "bytes",
    "Bytes of unwind tables loaded into the kernel (rows and page entries; at most max_table_bytes)",
);

// Uprobes: the binary cache, attachments and probe hits.
pub(crate) const UPROBE_BINARIES_PARSED: MetricDef = MetricDef::counter(
    "ebpf_uprobe_binaries_parsed_total",
    "1",
    "Executables and libraries opened and parsed for the configured symbols (cache misses)",
);
pub(crate) const UPROBE_POSITIVE_HITS: MetricDef = MetricDef::counter(
    "ebpf_uprobe_positive_hits_total",
    "1",
    "Lookups that found the binary attached already (its refcount was raised)",
);
pub(crate) const UPROBE_NEGATIVE_HITS: MetricDef = MetricDef::counter(
    "ebpf_uprobe_negative_hits_total",
    "1",
    "Lookups that found a valid 'nothing to attach' verdict (no parse)",
);
pub(crate) const UPROBE_NEGATIVE_ENTRIES: MetricDef =
    MetricDef::gauge("ebpf_uprobe_negative_entries", "1", "Verdicts in the negative cache");
pub(crate) const UPROBE_SWEEPS: MetricDef =
    MetricDef::counter("ebpf_uprobe_sweeps_total", "1", "Sweeps of expired negative verdicts (at most one per ttl)");
pub(crate) const UPROBE_ATTACHMENTS: MetricDef =
    MetricDef::gauge("ebpf_uprobe_attachments", "1", "Binaries with live uprobes (one entry per file)");
pub(crate) const UPROBE_HOLDERS: MetricDef = MetricDef::gauge(
    "ebpf_uprobe_holders",
    "1",
    "References held on attached binaries by live processes (sum of refcounts)",
);
pub(crate) const UPROBE_PROBE_HITS: MetricDef =
    MetricDef::counter("ebpf_uprobe_probe_hits_total", "1", "Calls of probed functions seen by the BPF program");
pub(crate) const UPROBE_ATTACH_FAILURES: MetricDef = MetricDef::counter(
    "ebpf_uprobe_attach_failures_total",
    "1",
    "Uprobe attaches that failed, by reason (permission, unsupported, invalid, other)",
)
.by("reason");
pub(crate) const UPROBE_PROCESSES: MetricDef =
    MetricDef::gauge("ebpf_uprobe_processes", "processes", "Processes followed for uprobes");
pub(crate) const UPROBE_MAPPING_RECORDS_LOST: MetricDef = MetricDef::counter(
    "ebpf_uprobe_mapping_records_lost_total",
    "1",
    "Kernel exec and mapping records lost to a full ring (those execs were looked at through /proc)",
);

/// Every series above, for [`profcol_api::component::Factory::metrics`].
pub(crate) const METRICS: &[MetricDef] = &[
    SAMPLES,
    SAMPLES_LOST_RINGBUF,
    KERNEL_STACK_ERRORS,
    USER_STACK_ERRORS,
    STACKS_CUT,
    RECORDS_MALFORMED,
    PROC_UNREADABLE,
    MAPS_REFRESHES,
    PROCESS_EXEC_RELOADS,
    PROCESSES_FROM_RECORDS,
    BUILD_ID_READS,
    BATCHES,
    PROCESSES,
    CPUS_SAMPLED,
    CPU_ATTACHES,
    CPU_ATTACH_FAILURES,
    SAMPLES_COUNTED_IN_KERNEL,
    SAMPLES_FILTERED,
    SAMPLE_FREQUENCY,
    SAMPLES_COUNTS_FULL,
    SAMPLES_DYNAMIC_KERNEL_TEXT,
    SAMPLES_COUNTED_UNNAMED,
    PROCESS_EXECS,
    PROCESS_EXITS,
    PROCESS_EVENTS_LOST,
    UNWIND_STACK_END,
    UNWIND_TABLE_BUILDS,
    UNWIND_TABLE_BUILD_FAILURES,
    UNWIND_TABLE_BUILD_MICROS,
    UNWIND_TABLE_EVICTIONS,
    UNWIND_TABLES_LOADED,
    UNWIND_TABLE_BYTES,
    UPROBE_BINARIES_PARSED,
    UPROBE_POSITIVE_HITS,
    UPROBE_NEGATIVE_HITS,
    UPROBE_NEGATIVE_ENTRIES,
    UPROBE_SWEEPS,
    UPROBE_ATTACHMENTS,
    UPROBE_HOLDERS,
    UPROBE_PROBE_HITS,
    UPROBE_ATTACH_FAILURES,
    UPROBE_PROCESSES,
    UPROBE_MAPPING_RECORDS_LOST,
    INTERPRETER_PROCESSES,
    INTERPRETER_FRAMES,
    INTERPRETER_WALKS_CUT,
    INTERPRETER_NAME_LOOKUPS,
    INTERPRETER_REFUSED,
    INTERPRETER_CACHE_BYTES,
    JIT_PROCESSES,
    JIT_FRAMES,
    JIT_MAP_LINES,
    JIT_MAPS_REFUSED,
    JIT_CACHE_BYTES,
    JIT_ATTACH_REQUESTS,
    OFF_CPU_SAMPLES,
    OFF_CPU_SECONDS,
    OFF_CPU_WAKEUPS,
];

// Interpreters: processes found, frames walked in the kernel and named.
pub(crate) const INTERPRETER_PROCESSES: MetricDef = MetricDef::gauge(
    "ebpf_interpreter_processes",
    "processes",
    "Processes whose interpreter frames are walked, by interpreter (python)",
)
.by("interpreter");
pub(crate) const INTERPRETER_FRAMES: MetricDef =
    MetricDef::counter("ebpf_interpreter_frames_total", "frames", "Interpreter frames read from sample records")
        .by("interpreter");
pub(crate) const INTERPRETER_WALKS_CUT: MetricDef = MetricDef::counter(
    "ebpf_interpreter_walks_cut_total",
    "samples",
    "Interpreter stacks cut short, by reason (depth_limit, read_error, no_thread_state); their frames so far \
     are kept",
)
.by("interpreter")
.and_by("reason");
pub(crate) const INTERPRETER_NAME_LOOKUPS: MetricDef = MetricDef::counter(
    "ebpf_interpreter_name_lookups_total",
    "frames",
    "Interpreter frames named, by outcome: hit (the frame named before), read (named from its code object, read \
     from the process's memory once per code object), error (unreadable: named `[unknown]`)",
)
.by("interpreter")
.and_by("outcome");
pub(crate) const INTERPRETER_CACHE_BYTES: MetricDef = MetricDef::gauge(
    "ebpf_interpreter_cache_bytes",
    "bytes",
    "Bytes the interpreter namers' caches hold (names, files, line tables of the code objects read), at the \
     last report",
)
.by("interpreter");
pub(crate) const INTERPRETER_REFUSED: MetricDef = MetricDef::counter(
    "ebpf_interpreter_refused_total",
    "processes",
    "Processes mapping an interpreter whose frames are not walked, by reason (unsupported version, \
     free-threaded build, unreadable binary, walker table full)",
)
.by("interpreter")
.and_by("reason");

// JIT code named from the maps runtimes write.
pub(crate) const JIT_PROCESSES: MetricDef = MetricDef::gauge(
    "ebpf_jit_processes",
    "processes",
    "Processes whose perf map is read, by runtime (v8, jvm, dotnet, wasm, other), at the last report",
)
.by("runtime");
pub(crate) const JIT_FRAMES: MetricDef = MetricDef::counter(
    "ebpf_jit_frames_total",
    "frames",
    "Addresses in anonymous executable memory of a report (each distinct address of a process once per \
     report), by runtime and outcome: named from the process's perf map, or unnamed (no map, or no line \
     covers the address)",
)
.by("runtime")
.and_by("outcome");
pub(crate) const JIT_MAP_LINES: MetricDef = MetricDef::counter(
    "ebpf_jit_map_lines_total",
    "lines",
    "Perf map lines and jitdump records by outcome: read, malformed (skipped), dropped (well-formed, but \
     the maps' memory bound was reached)",
)
.by("outcome");
pub(crate) const JIT_MAPS_REFUSED: MetricDef = MetricDef::counter(
    "ebpf_jit_maps_refused_total",
    "1",
    "Perf map files not read, by reason: not_regular (a symlink in its path, a FIFO, a device), owner (not \
     the process's user), links (a hard link), unreadable (an I/O error), too_large (read up to its bound)",
)
.by("reason");
pub(crate) const JIT_CACHE_BYTES: MetricDef =
    MetricDef::gauge("ebpf_jit_cache_bytes", "bytes", "Bytes the perf map tables hold, at the last report");
pub(crate) const JIT_ATTACH_REQUESTS: MetricDef = MetricDef::counter(
    "ebpf_jit_attach_requests_total",
    "1",
    "JVMs asked to write their perf map (`jit.jvm_perfmap: attach`), by outcome: ok or why not",
)
.by("outcome");

// Off-CPU time (`off_cpu:`).
pub(crate) const OFF_CPU_SAMPLES: MetricDef = MetricDef::counter(
    "ebpf_off_cpu_samples_total",
    "samples",
    "Waits off CPU over the threshold, by the state the thread left in: sleeping, uninterruptible, runnable \
     (preempted)",
)
.by("state");
pub(crate) const OFF_CPU_SECONDS: MetricDef =
    MetricDef::counter("ebpf_off_cpu_seconds_total", "seconds", "Time off CPU of those waits, by state").by("state");
pub(crate) const OFF_CPU_WAKEUPS: MetricDef = MetricDef::counter(
    "ebpf_off_cpu_wakeups_total",
    "1",
    "Wakeups recorded for those waits, by outcome: linked (a `wakeup` sample linked to its wait), unlinked \
     (its wait never came: the record was lost, the thread exited first, or it was held past two reports), \
     missing (a wait whose wakeup record never came: lost with a full ring buffer)",
)
.by("outcome");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ebpf::{
        interp::InterpCounters, jit::JitCounters, sampler::Counters, unwind::UnwindCounters, uprobes::UprobeCounters,
    };
    use profcol_api::component::Kind;
    use profcol_api::telemetry::Telemetry;
    use std::collections::BTreeSet;

    /// What the receiver registers is what it lists, each series once.
    #[test]
    fn metrics_lists_every_registered_series() {
        let telemetry = Telemetry::new();
        let t = telemetry.component(Kind::Receiver, &"ebpf".parse().unwrap());
        let _held = (
            Counters::new(&t),
            UnwindCounters::new(&t),
            UprobeCounters::new(&t),
            InterpCounters::new(&t),
            JitCounters::new(&t),
        );
        let registered: BTreeSet<String> = telemetry
            .render()
            .lines()
            .filter_map(|l| l.strip_prefix("# HELP "))
            .filter_map(|l| l.split(' ').next())
            .filter(|n| n.starts_with("profcol_receiver_ebpf_"))
            .map(str::to_owned)
            .collect();
        let listed: Vec<String> = METRICS.iter().map(|d| d.full_name(Kind::Receiver)).collect();
        let unique: BTreeSet<String> = listed.iter().cloned().collect();
        assert_eq!(unique.len(), listed.len(), "a series is listed twice");
        assert_eq!(registered, unique);
    }
}
