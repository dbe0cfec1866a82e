//! The sampling loop: drain the ring buffer, attach process knowledge,
//! aggregate, and hand a batch downstream every report interval.
//!
//! The loop runs on its own OS thread (it does blocking /proc and file
//! reads, and owns the aya objects); batches cross to an async task through
//! a channel of one, and that task awaits `Next::send`. When downstream is
//! slow the thread blocks on the channel, the ring buffer fills, and the BPF
//! program counts the records it cannot write (`lost_ringbuf`).
//!
//! The BPF program writes records without waking the reader unless the
//! ring is over a quarter full, so the thread wakes on its own timer
//! ([`DRAIN_PERIOD`]), on such a forced wakeup, or when asked to stop.
//!
//! CPU hotplug: on those wake-ups, at most once per [`CPU_CHECK_PERIOD`],
//! the thread re-reads `/sys/devices/system/cpu/online` and lets
//! [`Loaded::sync_cpus`] attach a perf event to every online CPU without a
//! live one and detach those of offline CPUs (a per-CPU perf event does not
//! resume when its CPU comes back, so a returning CPU needs a fresh one).

use super::budget::Budget;
use super::config::EbpfConfig;
use super::interp::processes::Interpreters;
use super::interp::InterpCounters;
use super::jit::{JitCounters, JitMaps};
use super::metrics as m;
use super::targets::Targets;
use super::unwind::{UnwindCounters, Unwinder};
use super::uprobes::{UprobeCounters, Uprobes};
use crate::ebpf::bpf::loader::{load_and_attach, CpuSync, LoadError, Loaded};
use crate::ebpf::process::mmap_events::{MappingBatch, MappingEventKind, MappingEvents};
use crate::ebpf::process::procfs;
use crate::ebpf::process::service_name::ServiceNamer;
use crate::ebpf::process::ProcessTable;
use crate::ebpf::stacks::aggregate::{FrameNamers, Interval, SampleAttrs, SampleIn, SampleProfile};
use crate::ebpf::stacks::counted::CountedStacks;
use crate::ebpf::stacks::stack_end;
use aya::programs::uprobe::UProbeLink;
use profcol_api::component::Next;
use profcol_api::services::FilePins;
use profcol_api::telemetry::{ComponentTelemetry, Counter, Gauge};
use profcol_api::Profiles;
use profcol_ebpf::clock::{now_ns, KtimeToUnix};
use profcol_ebpf::sys::{self, OnlineCpus};
use profcol_ebpf::{ProcEvent, ProcEventKind, Sample, SampleHeader, SampleKind, Stat};
use rustc_hash::FxHashSet;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the ring buffer is drained when nothing forces a wakeup: a
/// node agent's steady wake-up. The ring's quarter-full wakeup bounds what
/// waits, and a file the unwinder has no table for wakes the reader at its
/// second sample (every 20 ms per CPU at most), so its table does not wait
/// for this.
pub(crate) const DRAIN_PERIOD: Duration = Duration::from_secs(1);

/// How often the ring is drained when nothing forces a wakeup. Counting in
/// the kernel with the unwinder on, the ring holds only the first sample
/// of each stack and the samples that cannot be counted, a file without a
/// table wakes the reader within 20 ms, and processes that exit before the
/// report are named from the kernel's exec and mapping records (kept a
/// while after the exit): nothing waits for a timer but the report, so
/// there is no other wake-up. Otherwise [`DRAIN_PERIOD`].
fn drain_period(config: &EbpfConfig) -> Duration {
    if config.count_in_kernel && config.unwind.mode == super::config::UnwindMode::Auto && config.uprobes.is_empty() {
        config.report_interval
    } else {
        DRAIN_PERIOD
    }
}
/// The longest period of exec/exit event reads while events keep coming
/// (probes configured).
pub(crate) const PROC_EVENT_MAX_PERIOD: Duration = Duration::from_millis(250);
/// How often exec/exit events are read, at most, when probes are
/// configured. The BPF programs wake the reader only for an event into an
/// empty ring: an idle host costs no wake-up, the first exec after a quiet
/// spell is read at once, and while events keep coming they are read on
/// this period (a burst of short-lived processes costs one wake-up per
/// period, and a process that exec'd and exited within one costs no /proc
/// read at all).
///
/// With the kernel's mapping records ([`crate::ebpf::process::mmap_events`]) a process
/// needs no /proc read, its executable and libraries are known even after
/// it exited, and a binary seen before is answered by its verdict: the
/// period doubles after every read that found nothing new (no binary
/// parsed), up to [`PROC_EVENT_MAX_PERIOD`] (a steady stream of known
/// binaries costs at most four wake-ups a second), and drops back to
/// this after a read that parsed one (a new binary: its processes' next
/// mappings, the libraries, are wanted soon).
pub(crate) const PROC_EVENT_PERIOD: Duration = Duration::from_millis(50);
/// How often the online CPUs are re-read (on the loop's existing wake-ups).
pub(crate) const CPU_CHECK_PERIOD: Duration = Duration::from_secs(1);
/// Processes remembered at most.
pub(crate) const MAX_PROCESSES: usize = 4096;

/// Self-telemetry of the receiver (`profcol_receiver_ebpf_*`).
#[derive(Clone)]
pub struct Counters {
    /// Samples read from the ring buffer.
    pub samples: Counter,
    /// Samples the BPF program could not write: ring buffer full.
    pub lost_ringbuf: Counter,
    pub kernel_stack_errors: Counter,
    pub user_stack_errors: Counter,
    /// Stacks whose end was cut: frames that were no code (see `stack_end`).
    pub stacks_cut: Counter,
    /// Records that did not decode (never expected).
    pub malformed: Counter,
    /// Processes whose /proc entry was unreadable (one per process).
    pub proc_unreadable: Counter,
    pub maps_refreshes: Counter,
    pub exec_reloads: Counter,
    /// Processes known from the kernel's exec and mapping records, not /proc.
    pub from_records: Counter,
    pub build_id_reads: Counter,
    pub batches: Counter,
    /// Known processes.
    pub processes: Gauge,
    /// CPUs with a live perf event.
    pub cpus_sampled: Gauge,
    /// Samples per second per CPU now (moves under `max_cpu`).
    pub sample_frequency: Gauge,
    /// Per-CPU perf events attached (at start, and after hotplug).
    pub cpu_attaches: Counter,
    /// Failed attempts to attach a CPU's perf event (retried with backoff).
    pub cpu_attach_failures: Counter,
    /// The standard `dropped` counter: samples lost for any reason.
    pub dropped: Counter,
    /// Samples counted in the kernel without a record of their own.
    pub samples_counted: Counter,
    /// Samples dropped in the kernel: outside `targets` or `pids`.
    pub samples_filtered: Counter,
    /// Samples sent one by one because the counts map was full.
    pub counts_full: Counter,
    /// Samples sent one by one because a kernel frame was outside the
    /// kernel's own text.
    pub dynamic_text: Counter,
    /// Counted samples dropped: their stack's record never came.
    pub counted_unnamed: Counter,
    /// Process events from the sched tracepoints.
    pub process_execs: Counter,
    pub process_exits: Counter,
    pub process_events_lost: Counter,
    /// Off-CPU waits and their time, by state.
    pub(crate) off_cpu: crate::ebpf::off_cpu::OffCpuCounters,
}

impl Counters {
    pub fn new(t: &ComponentTelemetry) -> Self {
        Counters {
            samples: t.counter_of(&m::SAMPLES),
            lost_ringbuf: t.counter_of(&m::SAMPLES_LOST_RINGBUF),
            kernel_stack_errors: t.counter_of(&m::KERNEL_STACK_ERRORS),
            user_stack_errors: t.counter_of(&m::USER_STACK_ERRORS),
            stacks_cut: t.counter_of(&m::STACKS_CUT),
            malformed: t.counter_of(&m::RECORDS_MALFORMED),
            proc_unreadable: t.counter_of(&m::PROC_UNREADABLE),
            maps_refreshes: t.counter_of(&m::MAPS_REFRESHES),
            exec_reloads: t.counter_of(&m::PROCESS_EXEC_RELOADS),
            from_records: t.counter_of(&m::PROCESSES_FROM_RECORDS),
            build_id_reads: t.counter_of(&m::BUILD_ID_READS),
            batches: t.counter_of(&m::BATCHES),
            processes: t.gauge_of(&m::PROCESSES),
            cpus_sampled: t.gauge_of(&m::CPUS_SAMPLED),
            sample_frequency: t.gauge_of(&m::SAMPLE_FREQUENCY),
            cpu_attaches: t.counter_of(&m::CPU_ATTACHES),
            cpu_attach_failures: t.counter_of(&m::CPU_ATTACH_FAILURES),
            dropped: t.dropped.clone(),
            samples_counted: t.counter_of(&m::SAMPLES_COUNTED_IN_KERNEL),
            samples_filtered: t.counter_of(&m::SAMPLES_FILTERED),
            counts_full: t.counter_of(&m::SAMPLES_COUNTS_FULL),
            dynamic_text: t.counter_of(&m::SAMPLES_DYNAMIC_KERNEL_TEXT),
            counted_unnamed: t.counter_of(&m::SAMPLES_COUNTED_UNNAMED),
            process_execs: t.counter_of(&m::PROCESS_EXECS),
            process_exits: t.counter_of(&m::PROCESS_EXITS),
            process_events_lost: t.counter_of(&m::PROCESS_EVENTS_LOST),
            off_cpu: crate::ebpf::off_cpu::OffCpuCounters::new(t),
        }
    }
}

/// A running sampler: its thread and the task that sends its batches.
pub(crate) struct SamplerHandle {
    stop: Arc<AtomicBool>,
    wake: Arc<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
    sender: tokio::task::JoinHandle<()>,
}

impl SamplerHandle {
    /// Loads and attaches on the sampler thread; returns once perf events
    /// are attached, or with the reason they could not be.
    pub(crate) async fn start(
        config: EbpfConfig,
        next: Next,
        counters: Counters,
        telemetry: ComponentTelemetry,
        pins: Arc<FilePins>,
    ) -> Result<Self, LoadError> {
        let uprobe_counters = (!config.uprobes.is_empty()).then(|| UprobeCounters::new(&telemetry));
        let unwind_counters = UnwindCounters::new(&telemetry);
        let interp_counters = InterpCounters::new(&telemetry);
        let jit_counters = JitCounters::new(&telemetry);
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(sys::eventfd().map_err(|e| LoadError::Other(format!("eventfd: {e}")))?);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (batch_tx, mut batch_rx) = tokio::sync::mpsc::channel::<Profiles>(1);
        let thread = {
            let stop = stop.clone();
            let wake = wake.clone();
            std::thread::Builder::new()
                .name("profcol-ebpf".into())
                .spawn(move || {
                    let parts = Parts {
                        counters,
                        uprobe_counters,
                        unwind_counters,
                        interp_counters,
                        jit_counters,
                        ready: ready_tx,
                        started,
                        pins,
                    };
                    run(Start { config, stop, wake, batches: batch_tx, parts })
                })
                .map_err(|e| LoadError::Other(format!("spawning the sampler thread: {e}")))?
        };
        match ready_rx.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = tokio::task::spawn_blocking(move || thread.join()).await;
                return Err(e);
            }
            Err(_) => {
                let _ = tokio::task::spawn_blocking(move || thread.join()).await;
                return Err(LoadError::Other("the sampler thread exited during start".into()));
            }
        }
        let sender = tokio::spawn(async move {
            while let Some(batch) = batch_rx.recv().await {
                if let Err(e) = next.send(batch).await {
                    tracing::warn!(error = %e, "ebpf receiver: downstream refused a batch");
                }
            }
        });
        Ok(SamplerHandle { stop, wake, thread: Some(thread), sender })
    }

    /// Stops sampling, flushes the last partial interval downstream and
    /// waits for the thread and the sender task.
    pub(crate) async fn stop(mut self) {
        // (Drop signals again; harmless.)
        self.stop.store(true, Ordering::SeqCst);
        sys::eventfd_signal(self.wake.as_fd());
        if let Some(t) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        let _ = (&mut self.sender).await;
    }
}

impl Drop for SamplerHandle {
    /// A handle dropped without `stop` (receiver dropped while running)
    /// still stops the thread, which detaches the perf events.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        sys::eventfd_signal(self.wake.as_fd());
    }
}

/// Milliseconds since this process started (10 ms resolution).
pub(crate) fn ms_since_process_start() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let ticks = procfs::stat_start_time(&stat)?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let start_ns = ticks.checked_mul(1_000_000_000)? / hz;
    Some(now_ns(libc::CLOCK_BOOTTIME).saturating_sub(start_ns) / 1_000_000)
}

/// What the sampler thread starts with.
struct Start {
    config: EbpfConfig,
    stop: Arc<AtomicBool>,
    wake: Arc<OwnedFd>,
    batches: tokio::sync::mpsc::Sender<Profiles>,
    parts: Parts,
}

/// What the sampler is made of, beyond the config.
struct Parts {
    counters: Counters,
    uprobe_counters: Option<UprobeCounters>,
    unwind_counters: UnwindCounters,
    interp_counters: InterpCounters,
    jit_counters: JitCounters,
    /// Told once the perf events are attached, or why they are not.
    ready: tokio::sync::oneshot::Sender<Result<(), LoadError>>,
    started: Instant,
    pins: Arc<FilePins>,
}

/// The sampler thread: loads and attaches, then waits, drains and reports
/// until stopped.
fn run(start: Start) {
    let Start { config, stop, wake, batches, parts } = start;
    let Some((mut loaded, mut s)) = set_up(&config, parts) else {
        return;
    };
    let mut due = Schedule::new(&config);
    let mut fds = Vec::new();
    let mut online = OnlineCpus::default();
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        if !stopping {
            due.wait(&s, &loaded, wake.as_raw_fd(), &mut fds);
        }
        let now = Instant::now();
        due.read_proc_events(&mut s, &mut loaded, &fds, stopping, now);
        s.answer_target_asks(&mut loaded);
        s.drain(&mut loaded);
        s.poll_uprobes(&mut loaded, now);
        if !stopping && now >= due.next_cpu_check {
            let revived = check_cpus(&mut loaded, &mut online, &s.counters, now);
            if let Some(m) = s.mappings.as_mut() {
                s.mapping_gap |= m.sync(&loaded.cpus(), &revived);
            }
            due.next_cpu_check = now + CPU_CHECK_PERIOD;
        }
        if !stopping && now >= due.next_budget_check {
            due.next_budget_check = now + super::budget::CHECK_EVERY;
            if let Some(batch) = s.keep_budget(&mut loaded, now) {
                if batches.blocking_send(batch).is_err() {
                    break;
                }
            }
        }
        if stopping || now >= due.next_report || s.interval.is_full() {
            let batch = s.cut(&mut loaded, now);
            if now >= due.next_report {
                due.next_report = now + config.report_interval;
            }
            if let Some(batch) = batch {
                if batches.blocking_send(batch).is_err() {
                    break;
                }
            }
        }
        if stopping {
            break;
        }
    }
    // Detach the uprobes, then dropping `loaded` detaches the perf events
    // and unloads the programs.
    if let Some(u) = s.uprobes.as_mut() {
        u.clear();
    }
}

/// Loads and attaches everything, then tells `parts.ready` how that went;
/// `None` when the thread is to end (start failed, or nobody waits).
fn set_up(config: &EbpfConfig, parts: Parts) -> Option<(Loaded, Sampler)> {
    let Parts { counters, uprobe_counters, unwind_counters, interp_counters, jit_counters, ready, started, pins } =
        parts;
    let (mut loaded, first_sync) = match load_and_attach(config) {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(e));
            return None;
        }
    };
    record_cpu_sync(&counters, &loaded, &first_sync);
    counters.sample_frequency.set(config.sample_frequency as i64);
    tracing::info!(
        cpus = %cpu_list(&loaded.cpus()),
        sample_frequency = config.sample_frequency,
        load_ms = started.elapsed().as_millis() as u64,
        since_process_start_ms = ms_since_process_start().unwrap_or(0),
        "ebpf receiver: perf events attached"
    );
    // Opened before the scan of running processes, so a process started
    // during the scan is in one or the other. Always: the process table
    // knows new processes from them too.
    let mappings = open_mapping_events(&loaded);
    let uprobes = uprobe_counters.map(|c| start_uprobes(config, c, &mut loaded));
    let unwinder = match start_unwinder(config, &loaded, &unwind_counters) {
        Ok(u) => u,
        Err(e) => {
            let _ = ready.send(Err(LoadError::Other(format!("spawning the unwind table thread: {e}"))));
            return None;
        }
    };
    let interp = loaded.python_procs.take().map(|map| Interpreters::new(map, interp_counters));
    let jit = config.jit.perf_maps.then(|| JitMaps::new(&config.jit, jit_counters));
    let targets = match loaded.targets.is_some().then(|| Targets::for_this_host(&config.targets)).transpose() {
        Ok(t) => t,
        Err(e) => {
            let _ = ready.send(Err(LoadError::Other(format!("targets: {e}"))));
            return None;
        }
    };
    if ready.send(Ok(())).is_err() {
        return None;
    }
    let mut table = ProcessTable::new(MAX_PROCESSES);
    table.set_file_pins(pins);
    table.set_service_namer(ServiceNamer::new(config.service_name.clone()));
    let attrs = SampleAttrs::from_config(&config.sample_attributes);
    let clock = KtimeToUnix::process();
    let s = Sampler {
        host: procfs::host_name(),
        period_ns: config.period_ns(),
        table,
        attrs,
        interval: Interval::new(clock.now_unix_ns(), attrs),
        interval_started: Instant::now(),
        clock,
        counters,
        last_stats: loaded.read_stats(),
        last_table: Default::default(),
        last_build_id_reads: 0,
        kbuf: Vec::with_capacity(profcol_ebpf::MAX_STACK_DEPTH),
        ubuf: Vec::with_capacity(profcol_ebpf::MAX_STACK_DEPTH),
        ibuf: Vec::new(),
        interp,
        jit,
        targets,
        budget: config.max_cpu.map(|share| {
            let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
                .map_err(|e| tracing::warn!("ebpf receiver: max_cpu: BPF run time not counted (BPF_ENABLE_STATS: {e})"))
                .ok();
            (Budget::new(share, config.sample_frequency), stats)
        }),
        uprobes,
        mappings,
        mapping_batch: MappingBatch::default(),
        mapping_gap: false,
        order: Vec::new(),
        wakeups: Default::default(),
        probes: config.uprobes.clone(),
        unfollowed_hits: Vec::new(),
        proc_batch: Vec::new(),
        later: FxHashSet::default(),
        superseded: Vec::new(),
        last_proc_lost: 0,
        unwinder,
        unwind_counters,
        counted: CountedStacks::new(config.max_counted_stacks),
    };
    Some((loaded, s))
}

/// The kernel's exec and mapping records of the sampled CPUs, when they
/// can be had.
fn open_mapping_events(loaded: &Loaded) -> Option<MappingEvents> {
    match MappingEvents::open(&loaded.cpus()) {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!(
                "ebpf receiver: no kernel mapping records ({e}); new processes are looked at through /proc, \
                 and those that exit before their samples are read stay unnamed"
            );
            None
        }
    }
}

/// The configured uprobes, attached to the running processes.
fn start_uprobes(config: &EbpfConfig, counters: UprobeCounters, loaded: &mut Loaded) -> Uprobes<UProbeLink> {
    let mut u = Uprobes::new(&config.uprobes, config.negative_cache, counters);
    let t = Instant::now();
    u.scan_running(t, &mut loaded.attacher());
    tracing::info!(
        probes = config.uprobes.len(),
        attached_files = u.attached_files(),
        scan_ms = t.elapsed().as_millis() as u64,
        "ebpf receiver: uprobes attached to running processes"
    );
    u
}

/// The unwinder and its table thread, when the table-walking program loaded.
fn start_unwinder(
    config: &EbpfConfig,
    loaded: &Loaded,
    counters: &UnwindCounters,
) -> std::io::Result<Option<Unwinder>> {
    if loaded.unwind_maps.is_none() {
        return Ok(None);
    }
    let sizes = crate::ebpf::bpf::loader::unwind_sizes(config);
    let store = super::unwind::store::TableStore::new(
        config.unwind.max_table_bytes,
        sizes.row_elems,
        sizes.pages as usize,
        profcol_ebpf::unwind::RULES_CAPACITY,
    );
    let mut u = Unwinder::new(store, counters.clone())?;
    if let Some(own) = super::unwind::OwnExe::current() {
        u.no_table_for(own);
    }
    Ok(Some(u))
}

/// When the loop's periodic work is next due.
struct Schedule {
    next_report: Instant,
    drain_every: Duration,
    next_cpu_check: Instant,
    next_budget_check: Instant,
    /// Exec/exit events: read on [`PROC_EVENT_PERIOD`] while they keep
    /// coming; after a read that found none, the next event wakes the
    /// thread.
    last_proc_read: Instant,
    proc_events_flowing: bool,
    proc_period: Duration,
}

impl Schedule {
    fn new(config: &EbpfConfig) -> Self {
        let now = Instant::now();
        Schedule {
            next_report: now + config.report_interval,
            drain_every: drain_period(config),
            next_cpu_check: now + CPU_CHECK_PERIOD,
            // Without a budget, never.
            next_budget_check: if config.max_cpu.is_some() { now } else { now + Duration::from_secs(1 << 40) },
            last_proc_read: now,
            proc_events_flowing: true,
            proc_period: PROC_EVENT_PERIOD,
        }
    }

    /// Sleeps until there is work: a record, a stop, a table built, or
    /// the next periodic step.
    fn wait(&self, s: &Sampler, loaded: &Loaded, wake: RawFd, fds: &mut Vec<libc::pollfd>) {
        let now = Instant::now();
        let mut timeout = self
            .next_report
            .saturating_duration_since(now)
            .min(self.drain_every)
            .min(self.next_budget_check.saturating_duration_since(now));
        let mut watch_proc = None;
        if let Some(u) = &s.uprobes {
            let next_read = self.last_proc_read + self.proc_period;
            if self.proc_events_flowing {
                timeout = timeout.min(next_read.saturating_duration_since(now));
            } else {
                watch_proc = loaded.proc_events.as_ref().map(|pe| pe.ring.as_raw_fd());
            }
            if let Some(due) = u.next_due() {
                // Maps rescans ride on the event period's wake-ups.
                timeout = timeout.min(due.max(next_read).saturating_duration_since(now));
            }
        }
        // A finished table build wakes the thread: its table goes in now,
        // not at the next drain.
        let built = s.unwinder.as_ref().map_or(-1, |u| u.built_fd());
        // An ask for a verdict wakes the thread: samples of its cgroup are
        // dropped until it answers.
        let asks = loaded.targets.as_ref().map_or(-1, |t| t.asks.as_raw_fd());
        wait(fds, [loaded.ring.as_raw_fd(), wake, built, asks], watch_proc, s.mappings.as_ref(), timeout);
    }

    /// Reads the exec/exit events and mapping records when due (always
    /// without probes), and sets the period of the next read.
    fn read_proc_events(
        &mut self,
        s: &mut Sampler,
        loaded: &mut Loaded,
        fds: &[libc::pollfd],
        stopping: bool,
        now: Instant,
    ) {
        let mapping_ring_full = fds.iter().skip(MAPPING_FDS_AT).any(|p| p.revents & libc::POLLIN != 0);
        if s.uprobes.is_some()
            && !stopping
            && self.proc_events_flowing
            && !mapping_ring_full
            && now < self.last_proc_read + self.proc_period
        {
            return;
        }
        let parsed = s.uprobes.as_ref().map_or(0, |u| u.counters().binaries_parsed.get());
        self.proc_events_flowing = s.drain_proc_events(loaded, now) > 0;
        self.last_proc_read = now;
        let parsed_now = s.uprobes.as_ref().map_or(0, |u| u.counters().binaries_parsed.get());
        self.proc_period = if s.mappings.is_none() || parsed_now != parsed {
            PROC_EVENT_PERIOD
        } else {
            (self.proc_period * 2).min(PROC_EVENT_MAX_PERIOD)
        };
    }
}

/// Follows CPU hotplug: re-reads the online CPUs and re-syncs perf events.
/// Returns the CPUs whose events died unseen (offline and back).
fn check_cpus(loaded: &mut Loaded, cpus: &mut OnlineCpus, counters: &Counters, now: Instant) -> Vec<u32> {
    let online = match cpus.read() {
        Ok(o) => o,
        Err(e) => {
            tracing::debug!(error = %e, "ebpf receiver: cannot read the online CPUs; CPU set not re-checked");
            return Vec::new();
        }
    };
    match loaded.sync_cpus(&online, now) {
        Ok(sync) => {
            record_cpu_sync(counters, loaded, &sync);
            if sync.changed() {
                tracing::info!(
                    cpus = %cpu_list(&loaded.cpus()),
                    added = %cpu_list(&sync.added),
                    removed = %cpu_list(&sync.removed),
                    "ebpf receiver: sampled CPUs changed"
                );
            }
            if !sync.revived.is_empty() {
                tracing::info!(
                    cpus = %cpu_list(&sync.revived),
                    "ebpf receiver: perf events lost to an unseen offline/online cycle (or suspend); re-attached"
                );
            }
            sync.revived
        }
        Err(e) => {
            tracing::warn!(error = %e, "ebpf receiver: cannot re-sync CPUs");
            Vec::new()
        }
    }
}

/// Counts attaches and failures of one sync, logs failures.
fn record_cpu_sync(counters: &Counters, loaded: &Loaded, sync: &CpuSync) {
    counters.cpu_attaches.add((sync.added.len() + sync.revived.len()) as u64);
    counters.cpu_attach_failures.add(sync.failed.len() as u64);
    counters.cpus_sampled.set(loaded.cpus().len() as i64);
    for f in &sync.failed {
        if f.first {
            tracing::warn!(cpu = f.cpu, "ebpf receiver: CPU not sampled (retrying): {}", f.message);
        } else {
            tracing::debug!(cpu = f.cpu, "ebpf receiver: CPU still not sampled: {}", f.message);
        }
    }
}

/// `0-3,6` style list of ascending CPU numbers (`-` when empty).
pub(crate) fn cpu_list(cpus: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(&cpus[i].to_string());
        if j > i {
            out.push('-');
            out.push_str(&cpus[j].to_string());
        }
        i = j + 1;
    }
    if out.is_empty() {
        out.push('-');
    }
    out
}

/// Where the mapping rings' fds start in [`wait`]'s poll set.
const MAPPING_FDS_AT: usize = 5;

/// Waits until the sample ring (or `proc_ring`, when given) has data, the
/// wake or `built` eventfd is signalled, `targets` asks for a verdict, a
/// mapping ring is half full, or timeout. `fds` is reused; entries from
/// [`MAPPING_FDS_AT`] on are the mapping rings.
fn wait(
    fds: &mut Vec<libc::pollfd>,
    [ring, wake, built, asks]: [RawFd; 4],
    proc_ring: Option<RawFd>,
    mappings: Option<&MappingEvents>,
    timeout: Duration,
) {
    let pollfd = |fd: RawFd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    fds.clear();
    // A negative fd is ignored by poll.
    fds.extend([pollfd(ring), pollfd(wake), pollfd(proc_ring.unwrap_or(-1)), pollfd(built), pollfd(asks)]);
    fds.extend(mappings.into_iter().flat_map(|m| m.fds()).map(pollfd));
    // Rounded up: a deadline less than 1 ms away must not become a busy loop.
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: fds is a valid array of fds.len() pollfd.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
}

struct Sampler {
    host: String,
    period_ns: i64,
    table: ProcessTable,
    /// `sample_attributes:`.
    attrs: SampleAttrs,
    interval: Interval,
    interval_started: Instant,
    clock: KtimeToUnix,
    counters: Counters,
    last_stats: [u64; Stat::SLOTS as usize],
    last_table: crate::ebpf::process::TableStats,
    last_build_id_reads: u64,
    kbuf: Vec<u64>,
    ubuf: Vec<u64>,
    /// The record's interpreter frames (frame word, instruction word).
    ibuf: Vec<(u64, u64)>,
    /// Present when an interpreter walker loaded (`interpreters:`).
    interp: Option<Interpreters>,
    /// Present when `jit.perf_maps` is on.
    jit: Option<JitMaps>,
    /// Present when `targets` is configured.
    targets: Option<Targets>,
    /// Present when `max_cpu` is set, with the fd that keeps the kernel
    /// timing BPF programs (`None` where it cannot: their time is then
    /// not counted).
    budget: Option<(Budget, Option<OwnedFd>)>,
    /// Present when probes are configured.
    uprobes: Option<Uprobes<UProbeLink>>,
    /// The kernel's exec and mapping records (when the side-band events
    /// could be opened), for the process table and the uprobe side; else
    /// new processes are looked at through /proc.
    mappings: Option<MappingEvents>,
    mapping_batch: MappingBatch,
    /// A mapping ring was (re)opened since the last read: records may be
    /// missing, so that read's execs are looked at through /proc too.
    mapping_gap: bool,
    /// Process and mapping events of one read in time order: (time, index,
    /// whether a mapping record).
    order: Vec<(u64, u32, bool)>,
    probes: Vec<super::config::UprobeSpec>,
    /// Pids of probe hits this drain that are not followed yet.
    unfollowed_hits: Vec<u32>,
    /// Reused by `drain_proc_events`: the events read, and the pids seen
    /// later in the batch (no allocation per read).
    proc_batch: Vec<ProcEvent>,
    later: FxHashSet<u32>,
    superseded: Vec<bool>,
    last_proc_lost: u64,
    /// Present unless `unwind.mode: frame_pointers`.
    unwinder: Option<Unwinder>,
    unwind_counters: UnwindCounters,
    /// Records and counts of stacks counted in the kernel.
    counted: CountedStacks,
    /// Wakeup records held until the waits they ended come (`off_cpu:`).
    wakeups: crate::ebpf::off_cpu::Wakeups,
}

impl Sampler {
    /// `max_cpu`: a frequency change when the agent's CPU says so; the
    /// report so far is cut first (its samples were taken at the old
    /// period) and returned.
    fn keep_budget(&mut self, loaded: &mut Loaded, now: Instant) -> Option<Profiles> {
        let (budget, stats) = self.budget.as_mut()?;
        let bpf = if stats.is_some() { loaded.bpf_run_ns() } else { 0 };
        let hz = budget.check(now, super::budget::process_cpu_ns() + bpf)?;
        // No sample of one period may land in the other's report: sampling
        // stops, the report is cut, then sampling starts again.
        let online = match sys::online_cpus() {
            Ok(o) => o,
            Err(_) => loaded.cpus(),
        };
        loaded.stop_sampling();
        self.drain(loaded);
        let batch = self.cut(loaded, now);
        match loaded.set_frequency(hz, &online, now) {
            // The same CPUs again: not attaches after a hotplug.
            Ok(mut sync) => {
                sync.added.clear();
                record_cpu_sync(&self.counters, loaded, &sync);
            }
            Err(e) => tracing::warn!("ebpf receiver: max_cpu: setting {hz} Hz: {e}"),
        }
        self.period_ns = 1_000_000_000 / hz as i64;
        self.counters.sample_frequency.set(hz as i64);
        tracing::debug!(hz, "ebpf receiver: max_cpu: sampling frequency changed");
        batch
    }

    /// Writes the verdicts the BPF program asked for (`targets`).
    fn answer_target_asks(&mut self, loaded: &mut Loaded) {
        let (Some(targets), Some(maps)) = (self.targets.as_mut(), loaded.targets.as_mut()) else {
            return;
        };
        let table = &mut self.table;
        let done = targets.answer_asks(maps, &mut |id| table.containers().get(id), Instant::now());
        self.counters.malformed.add(done.malformed);
    }
    /// Attaches probes to the processes whose hits were seen unfollowed,
    /// and does the uprobe side's due work.
    fn poll_uprobes(&mut self, loaded: &mut Loaded, now: Instant) {
        if let Some(u) = self.uprobes.as_mut() {
            let mut att = loaded.attacher();
            for pid in self.unfollowed_hits.drain(..) {
                u.on_probe_hit(pid, now, &mut att);
            }
            u.poll(now, &mut att);
        }
    }

    /// Hands exec and exit events to the uprobe side (when configured);
    /// returns how many were read.
    fn drain_proc_events(&mut self, loaded: &mut Loaded, now: Instant) -> usize {
        let Some(pe) = loaded.proc_events.as_mut() else {
            return 0;
        };
        let mut events = std::mem::take(&mut self.proc_batch);
        events.clear();
        while let Some(item) = pe.ring.next() {
            match ProcEvent::parse(&item) {
                Some(e) => events.push(e),
                None => self.counters.malformed.inc(),
            }
        }
        let mut side = std::mem::take(&mut self.mapping_batch);
        side.clear();
        if let Some(m) = self.mappings.as_mut() {
            m.read(&mut side);
        }
        let via_proc = self.note_in_table(&events, &side);
        if let Some(u) = &self.uprobes {
            u.counters().mapping_records_lost.add(side.lost);
        }
        self.counters.malformed.add(side.malformed);
        let n = events.len() + side.events.len();
        if self.uprobes.is_some() && n > 0 {
            self.put_in_order(&events, &side);
            self.hand_to_uprobes(&events, &side, via_proc, loaded, now);
        } else {
            for e in &events {
                match e.kind {
                    ProcEventKind::Exec => {
                        self.counters.process_execs.inc();
                        // Samples after it carry the new executable.
                        self.table.exec(e.pid, e.ktime_ns);
                    }
                    ProcEventKind::Exit => self.counters.process_exits.inc(),
                }
            }
        }
        self.proc_batch = events;
        self.mapping_batch = side;
        n
    }

    /// Tells the process table (and the counted stacks) what the exec/exit
    /// events and mapping records say; returns whether execs are to be
    /// looked at through /proc as well (no records, or some missed).
    fn note_in_table(&mut self, events: &[ProcEvent], side: &MappingBatch) -> bool {
        // Records missed (full ring, a ring reopened): this read's execs are
        // looked at through /proc as well, and no image is trusted whole.
        let gap = side.lost > 0 || std::mem::take(&mut self.mapping_gap);
        if gap {
            self.table.on_records_lost();
        }
        for e in &side.events {
            match &e.kind {
                MappingEventKind::Exec => self.table.on_exec_record(e.pid, e.time_ns),
                MappingEventKind::Map(m) => self.table.on_map_record(e.pid, m, side.path(m), e.time_ns),
            }
        }
        for e in events {
            match e.kind {
                ProcEventKind::Exec => self.table.on_exec_event(e.pid, e.ktime_ns, e.cgroup_id),
                ProcEventKind::Exit => self.table.on_exit(e.pid, e.ktime_ns),
            }
            // Exec'd or gone: its counted stacks' records name the image it had.
            self.counted.process_gone(e.pid);
            if let Some(interp) = self.interp.as_mut() {
                interp.forget(e.pid);
            }
            if let Some(jit) = self.jit.as_mut() {
                jit.forget(e.pid);
            }
        }
        self.mappings.is_none() || gap
    }

    /// Fills `order` with both streams in time order (the same
    /// CLOCK_MONOTONIC: an exit and a reuse of its pid in one read are told
    /// apart), and `superseded` with the events followed by another of the
    /// same pid in this batch (exited already, or exec'd again: /proc shows
    /// only the last image, so only the last exec is looked at). Marked
    /// walking backwards.
    fn put_in_order(&mut self, events: &[ProcEvent], side: &MappingBatch) {
        self.later.clear();
        self.superseded.clear();
        self.superseded.resize(events.len(), false);
        for (i, e) in events.iter().enumerate().rev() {
            self.superseded[i] = !self.later.insert(e.pid);
        }
        self.order.clear();
        self.order.extend(events.iter().enumerate().map(|(i, e)| (e.ktime_ns, i as u32, false)));
        self.order.extend(side.events.iter().enumerate().map(|(i, e)| (e.time_ns, i as u32, true)));
        self.order.sort_unstable();
    }

    /// Hands the events and records to the uprobe side in `order`.
    fn hand_to_uprobes(
        &mut self,
        events: &[ProcEvent],
        side: &MappingBatch,
        via_proc: bool,
        loaded: &mut Loaded,
        now: Instant,
    ) {
        let Some(u) = self.uprobes.as_mut() else {
            return;
        };
        // Event times (CLOCK_MONOTONIC, as Instant) for the maps rescans.
        let ktime_now = now_ns(libc::CLOCK_MONOTONIC);
        let mut att = loaded.attacher();
        for &(_, i, is_mapping) in &self.order {
            let i = i as usize;
            if is_mapping {
                let e = &side.events[i];
                match &e.kind {
                    MappingEventKind::Exec => u.on_image(e.pid, now),
                    MappingEventKind::Map(m) => u.on_kernel_mapping(e.pid, m, side, now, &mut att),
                }
                continue;
            }
            let e = &events[i];
            match e.kind {
                ProcEventKind::Exec => {
                    self.counters.process_execs.inc();
                    self.table.exec(e.pid, e.ktime_ns);
                    if via_proc && !self.superseded[i] {
                        let age = Duration::from_nanos(ktime_now.saturating_sub(e.ktime_ns));
                        u.on_exec_at(e.pid, now.checked_sub(age).unwrap_or(now), now, &mut att);
                    }
                }
                ProcEventKind::Exit => {
                    self.counters.process_exits.inc();
                    u.on_exit(e.pid, now);
                }
            }
        }
    }

    fn drain(&mut self, loaded: &mut Loaded) {
        let now = Instant::now();
        // Tables built since the last drain go into the kernel first.
        if let (Some(uw), Some(maps)) = (self.unwinder.as_mut(), loaded.unwind_maps.as_mut()) {
            uw.poll(maps, now);
        }
        let mut n = 0u64;
        loop {
            // Not `while let`: the record is dropped before the sample is
            // added, which may load the Python walker (`loaded` again).
            let Some(item) = loaded.ring.next() else { break };
            let Some(rec) = Sample::parse(&item) else {
                n += 1;
                self.counters.malformed.inc();
                continue;
            };
            self.kbuf.clear();
            self.kbuf.extend(rec.kernel_stack());
            self.ubuf.clear();
            self.ubuf.extend(rec.user_stack());
            self.ibuf.clear();
            self.ibuf.extend(rec.interp_stack());
            let h = rec.header;
            drop(item);
            // A counted stack's 1 is in its count.
            n += u64::from(!self.add_sample(&h, now, loaded));
            if self.interval.is_full() {
                break;
            }
        }
        self.counters.samples.add(n);
        // Files the BPF program met without a table, now that the samples
        // and records of the processes that met them are read.
        if let (Some(uw), Some(maps)) = (self.unwinder.as_mut(), loaded.unwind_maps.as_mut()) {
            let table = &mut self.table;
            uw.read_wanted(maps, |pid| table.get(pid, now).map(|st| st.mappings.clone()), now);
        }
    }

    /// Adds the sample of header `h` and the stacks in `kbuf` and `ubuf`
    /// to the interval, or to the counted stacks when it is the record of
    /// one (then returns `true`).
    fn add_sample(&mut self, h: &SampleHeader, now: Instant, loaded: &mut Loaded) -> bool {
        let mut count_key = None;
        let profile = match h.kind {
            SampleKind::Cpu => SampleProfile::Cpu,
            SampleKind::CpuCounted { key, slot } => {
                count_key = Some((key, slot));
                SampleProfile::Cpu
            }
            SampleKind::Probe(i) => {
                if let Some(u) = &self.uprobes {
                    if !u.follows(h.pid) && !self.unfollowed_hits.contains(&h.pid) {
                        self.unfollowed_hits.push(h.pid);
                    }
                }
                SampleProfile::Probe(i)
            }
            SampleKind::OffCpu { ns, state, .. } => {
                self.counters.off_cpu.add(state, ns);
                SampleProfile::OffCpu { ns, state }
            }
            // Its wait's time is known when the wait comes.
            SampleKind::Wakeup { from, .. } => SampleProfile::Wakeup { ns: 0, from },
        };
        // Cut the ends of a frame-pointer walk that are no code (see
        // stack_end): by address range first, so that junk does not
        // trigger a maps re-read, then by the process's mappings.
        let (kn, un) = (stack_end::kernel_frames(&self.kbuf), stack_end::user_frames(&self.ubuf, None));
        self.table.sample_at(h.pid, h.ktime_ns);
        let st = if un == 0 { self.table.get(h.pid, now) } else { self.table.resolve(h.pid, &self.ubuf[..un], now) };
        let process = st.map(|st| (st.info.clone(), st.mappings.clone()));
        if count_key.is_none() {
            // A counted stack's end is counted with its count.
            self.unwind_counters.count_end(h.user_end);
        }
        let un = stack_end::user_frames(&self.ubuf[..un], process.as_ref().map(|(_, m)| &**m));
        if kn < self.kbuf.len() || un < self.ubuf.len() {
            self.counters.stacks_cut.inc();
            self.kbuf.truncate(kn);
            self.ubuf.truncate(un);
        }
        if let Some(interp) = self.interp.as_mut() {
            if let Some((_, maps)) = &process {
                interp.observe(h.pid, maps, || loaded.python_walker_ready());
            }
            interp.name_into(h.pid, self.ibuf.iter().copied(), h.interp_end, &mut self.ubuf);
        }
        if let (Some(jit), Some((info, maps))) = (self.jit.as_mut(), &process) {
            jit.observe(h.pid, info, maps, now);
        }
        let sample = SampleIn {
            profile,
            pid: h.pid,
            tid: h.tid,
            cpu: h.cpu,
            comm: h.comm,
            unix_ns: self.clock.to_unix_ns(h.ktime_ns),
            kstack: &self.kbuf,
            ustack: &self.ubuf,
            unwind_end: h.user_end,
            interp_end: h.interp_end,
        };
        let at = process.as_ref().map(|(i, m)| (i, m));
        match (count_key, h.kind) {
            (Some((key, slot)), _) => self.counted.record(key, slot, &sample, process),
            (None, SampleKind::Wakeup { id, from }) => {
                self.wakeups.hold(id, from, &sample, process, &self.counters.off_cpu)
            }
            (None, SampleKind::OffCpu { ns, wakeup, .. }) if wakeup != 0 => {
                let interval = &mut self.interval;
                self.wakeups.take(wakeup, ns, &self.counters.off_cpu, |waker| match waker {
                    Some(w) => interval.add_woken(&sample, at, &w.sample, w.process),
                    None => interval.add(&sample, at),
                })
            }
            (None, _) => self.interval.add(&sample, at),
        }
        count_key.is_some()
    }

    /// Ends the interval: updates telemetry, sweeps the process table and
    /// builds the batch (`None` when nothing was sampled).
    fn cut(&mut self, loaded: &mut Loaded, now: Instant) -> Option<Profiles> {
        // The records written so far, then the counts (read in place).
        if loaded.counts.is_some() {
            self.drain(loaded);
        }
        if let Some(store) = loaded.counts.as_mut() {
            let ends = &self.unwind_counters;
            let settled = self.counted.settle(&mut self.interval, store, |end, n| ends.count_ends(end, n));
            self.counters.samples.add(settled.samples);
            self.counters.counted_unnamed.add(settled.unnamed);
            self.counters.dropped.add(settled.unnamed);
        }
        let stats = loaded.read_stats();
        let delta = |s: Stat| stats[s as usize].wrapping_sub(self.last_stats[s as usize]);
        let lost = delta(Stat::LostRingbuf);
        self.counters.lost_ringbuf.add(lost);
        self.counters.dropped.add(lost);
        self.counters.kernel_stack_errors.add(delta(Stat::KernelStackError));
        self.counters.user_stack_errors.add(delta(Stat::UserStackError));
        self.counters.samples_counted.add(delta(Stat::Counted));
        self.counters.counts_full.add(delta(Stat::CountsFull));
        self.counters.samples_filtered.add(delta(Stat::Filtered));
        self.counters.dynamic_text.add(delta(Stat::DynamicText));
        if let Some(u) = &self.uprobes {
            u.counters().probe_hits.add(delta(Stat::ProbeHits));
        }
        if let Some(pe) = &loaded.proc_events {
            let lost = pe.lost();
            self.counters.process_events_lost.add(lost.wrapping_sub(self.last_proc_lost));
            self.last_proc_lost = lost;
        }
        if lost > 0 {
            tracing::warn!(
                lost,
                "ebpf receiver: ring buffer full, samples dropped (raise ring_buffer_size or check downstream backpressure)"
            );
        }
        self.last_stats = stats;

        self.table.sweep(now, self.interval_started);
        if let Some(interp) = self.interp.as_mut() {
            let table = &self.table;
            interp.retain(|pid| table.knows(pid));
        }
        if let (Some(uw), Some(maps)) = (self.unwinder.as_mut(), loaded.unwind_maps.as_mut()) {
            let (table, since) = (&self.table, self.interval_started);
            uw.sweep(maps, |f| table.for_each_sampled_mapping(since, f), now);
        }
        self.interval_started = now;
        self.wakeups.cut(&self.counters.off_cpu);
        let ts = self.table.stats;
        self.counters.proc_unreadable.add(ts.unreadable - self.last_table.unreadable);
        self.counters.maps_refreshes.add(ts.refreshes - self.last_table.refreshes);
        self.counters.exec_reloads.add(ts.exec_reloads - self.last_table.exec_reloads);
        self.counters.from_records.add(ts.from_records - self.last_table.from_records);
        self.last_table = ts;
        let reads = self.table.build_id_reads();
        self.counters.build_id_reads.add(reads - self.last_build_id_reads);
        self.last_build_id_reads = reads;
        self.counters.processes.set(self.table.len() as i64);

        let end = self.clock.now_unix_ns();
        let next = Interval::sized_like(end, self.attrs, &self.interval);
        let interval = std::mem::replace(&mut self.interval, next);
        if interval.sample_count() == 0 {
            return None;
        }
        if let Some(jit) = self.jit.as_mut() {
            jit.refresh_all(now);
        }
        let namers = FrameNamers { functions: self.interp.as_ref().map(|i| &i.functions), jit: self.jit.as_ref() };
        let batch = interval.build(&self.host, self.period_ns, end, &self.probes, self.table.namer(), namers);
        if let Some(jit) = self.jit.as_mut() {
            // After the build: a process gone in this interval named its samples.
            let table = &self.table;
            jit.retain(|pid| table.knows(pid));
        }
        self.counters.batches.inc();
        Some(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::cpu_list;

    #[test]
    fn cpu_lists_are_ranges() {
        assert_eq!(cpu_list(&[]), "-");
        assert_eq!(cpu_list(&[1]), "1");
        assert_eq!(cpu_list(&[0, 1, 2, 3, 5, 7, 8]), "0-3,5,7-8");
    }
}
