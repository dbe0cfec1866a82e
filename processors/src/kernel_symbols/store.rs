//! The symbol store: owns what was read (sysfs metadata, kallsyms tables,
//! BPF functions), turns every change into a new generation, and counts
//! what it did. Only the reload task (or a CLI) calls its mutating methods;
//! lookups go through [`Store::generations`] and never touch the mutex.

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustc_hash::{FxHashMap, FxHashSet};

use super::bpf::history::{BpfHistory, BpfLedger};
use super::bpf::progs::{BpfFunc, BpfFuncs};
use super::error::{Error, Result};
use super::generations::{now_ns, Generations};
use super::kallsyms::{self, ParseOptions, ParseStats};
use super::snapshot::{LooseTable, ModuleEntry, Snapshot};
use super::sysfs::{self, ModuleMeta};
use super::table::SymbolTable;

/// Where the store reads from.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub kallsyms: PathBuf,
    /// Directory holding `module/` and `kernel/notes`.
    pub sysfs: PathBuf,
    /// Enumerate BPF programs through the bpf syscall (else `[bpf]` lines).
    pub bpf_syscall: bool,
    pub retain: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            kallsyms: "/proc/kallsyms".into(),
            sysfs: "/sys".into(),
            bpf_syscall: true,
            retain: Duration::from_secs(60),
        }
    }
}

/// What the store did; read by tests, benchmarks and `kernel-symbols stats`.
#[derive(Debug, Default)]
pub struct Counters {
    pub full_reads: AtomicU64,
    pub read_failures: AtomicU64,
    pub last_parse_ns: AtomicU64,
    pub last_read_ns: AtomicU64,
    pub metadata_refreshes: AtomicU64,
    pub generations: AtomicU64,
    pub(crate) ksymbol_events: AtomicU64,
    pub(crate) bpf_rescans: AtomicU64,
    /// BPF records handed to the reload task and not applied yet (the
    /// listener drops records above [`MAX_BPF_BACKLOG`] and asks for a rescan).
    pub bpf_backlog: Arc<std::sync::atomic::AtomicUsize>,
    /// BPF records dropped because the backlog was full.
    pub bpf_records_dropped: Arc<AtomicU64>,
}

/// Most BPF records queued for the store at once (about 100 bytes each).
pub(crate) const MAX_BPF_BACKLOG: usize = 65_536;

/// One BPF symbol record, in the order the listener merged them.
#[derive(Debug, Clone)]
pub enum BpfEvent {
    /// PERF_RECORD_KSYMBOL register.
    Register(BpfFunc),
    /// PERF_RECORD_KSYMBOL unregister of the function `name` at `start`.
    Unregister { start: u64, name: Arc<str> },
    /// PERF_RECORD_BPF_EVENT load: fetch BTF names and lines by program id.
    ProgLoad { id: u32 },
}

/// A module table and the loaded instance it was read for (`None`: the
/// module was not loaded when read, so it owns no range).
struct Table {
    instance: Option<Arc<ModuleMeta>>,
    syms: Arc<SymbolTable>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BpfSource {
    Syscall,
    Kallsyms,
}

struct State {
    vmlinux: Arc<SymbolTable>,
    vmlinux_build_id: Option<Arc<[u8]>>,
    /// `None`: no sysfs, every kallsyms module is taken as loaded.
    sysfs: Option<Vec<Arc<ModuleMeta>>>,
    tables: FxHashMap<Arc<str>, Table>,
    bpf: BpfLedger,
    /// What readers see of `bpf`, frozen after each change.
    bpf_view: BpfHistory,
    bpf_source: BpfSource,
    last_parse: ParseStats,
}

pub struct Store {
    cfg: StoreConfig,
    gens: Generations,
    pub counters: Counters,
    /// How far the BPF history is complete (the processor waits on it).
    pub bpf_progress: Arc<super::bpf::progress::BpfProgress>,
    state: Mutex<State>,
}

impl Store {
    /// Reads sysfs, kallsyms and the BPF programs, and publishes the first
    /// generation.
    pub fn open(cfg: StoreConfig) -> Result<Store> {
        let started = now_ns();
        let mut state = State {
            vmlinux: Arc::default(),
            vmlinux_build_id: sysfs::vmlinux_build_id(&cfg.sysfs),
            sysfs: sysfs::read_modules(&cfg.sysfs)?.map(|v| v.into_iter().map(Arc::new).collect()),
            tables: FxHashMap::default(),
            bpf: BpfLedger::default(),
            bpf_view: BpfHistory::default(),
            bpf_source: BpfSource::Kallsyms,
            last_parse: ParseStats::default(),
        };
        let counters = Counters::default();
        let bpf_lines = read_kallsyms(&cfg, &mut state, &counters)?;
        let mut live = BpfFuncs::from_kallsyms(&bpf_lines);
        if cfg.bpf_syscall {
            match super::bpf::enumerate() {
                Ok(funcs) => {
                    live = BpfFuncs::new(funcs);
                    state.bpf_source = BpfSource::Syscall;
                }
                Err(e) => tracing::warn!(error = %e, "using [bpf] kallsyms lines for BPF programs"),
            }
        }
        // Loaded before we looked: live since forever.
        state.bpf = BpfLedger::with_live(&live);
        state.bpf_view = state.bpf.freeze();
        let snap = snapshot_of(&state);
        let gens = Generations::new(snap, started, cfg.retain.as_nanos() as u64);
        counters.generations.store(1, Relaxed);
        Ok(Store { cfg, gens, counters, bpf_progress: Default::default(), state: Mutex::new(state) })
    }

    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    pub fn generations(&self) -> &Generations {
        &self.gens
    }

    pub fn bpf_source(&self) -> BpfSource {
        self.lock().bpf_source
    }

    pub fn last_parse(&self) -> ParseStats {
        self.lock().last_parse
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, since_ns: u64, st: &State) {
        self.gens.publish(since_ns, snapshot_of(st), now_ns());
        self.counters.generations.fetch_add(1, Relaxed);
    }

    /// Gives every retained generation the BPF history as it is now: BPF
    /// changes carry their own times, so they never add a generation.
    fn publish_bpf(&self, st: &mut State) {
        let cutoff = now_ns().saturating_sub(self.cfg.retain.as_nanos() as u64);
        st.bpf.prune(cutoff);
        st.bpf_view = st.bpf.freeze();
        let view = st.bpf_view.clone();
        self.gens.amend(|snap| Some(Snapshot { bpf: view.clone(), ..snap.clone() }));
    }

    /// The BPF history readers see now.
    pub fn bpf(&self) -> BpfHistory {
        self.lock().bpf_view.clone()
    }

    /// Re-reads module metadata; on change publishes a generation live from
    /// `since_ns` (when the triggering uevent arrived). Returns whether the
    /// set of loaded modules changed.
    pub fn refresh_metadata(&self, since_ns: u64) -> Result<bool> {
        self.counters.metadata_refreshes.fetch_add(1, Relaxed);
        let fresh = sysfs::read_modules(&self.cfg.sysfs)?;
        let mut st = self.lock();
        let same = match (&st.sysfs, &fresh) {
            (None, None) => true,
            (Some(a), Some(b)) => a.len() == b.len() && a.iter().zip(b).all(|(x, y)| **x == *y),
            _ => false,
        };
        if same {
            return Ok(false);
        }
        st.sysfs = fresh.map(|v| v.into_iter().map(Arc::new).collect());
        self.publish(since_ns, &st);
        Ok(true)
    }

    /// Full kallsyms read; rebuilds only modules whose loaded instance
    /// changed, fills in names of modules already published without them,
    /// and publishes a generation if anything changed.
    pub fn reload_kallsyms(&self) -> Result<()> {
        let started = now_ns();
        // Metadata first, so tables are tagged with the instance they belong to.
        let fresh = sysfs::read_modules(&self.cfg.sysfs)?;
        let mut st = self.lock();
        if let Some(f) = fresh {
            st.sysfs = Some(f.into_iter().map(Arc::new).collect());
        }
        let before: Vec<*const SymbolTable> = st.tables.values().map(|t| Arc::as_ptr(&t.syms)).collect();
        let bpf_lines = read_kallsyms(&self.cfg, &mut st, &self.counters)?;
        let changed =
            before.len() != st.tables.len() || st.tables.values().any(|t| !before.contains(&Arc::as_ptr(&t.syms)));
        // Also catches BPF changes whose perf records never arrived (no
        // perf listener, or records lost before a rescan).
        let bpf = match st.bpf_source {
            BpfSource::Kallsyms => Some(BpfFuncs::from_kallsyms(&bpf_lines)),
            BpfSource::Syscall => super::bpf::enumerate().ok().map(BpfFuncs::new),
        };
        let bpf_changed = bpf.is_some_and(|bpf| st.bpf.reconcile(started, &bpf));
        if changed {
            self.publish(started, &st);
            self.backfill(&st);
        }
        if bpf_changed {
            self.publish_bpf(&mut st);
        }
        Ok(())
    }

    /// Names of a loaded module are valid since it loaded: give them to
    /// retained generations that published the module before its names.
    fn backfill(&self, st: &State) {
        self.gens.amend(|snap| {
            let mut hit = false;
            let modules: Vec<ModuleEntry> = snap
                .modules
                .iter()
                .map(|m| {
                    let mut m = m.clone();
                    if m.syms.is_none() {
                        if let Some(t) = st.tables.get(&m.meta.name) {
                            if t.instance.as_ref().is_some_and(|i| i.same_instance(&m.meta)) {
                                m.syms = Some(t.syms.clone());
                                hit = true;
                            }
                        }
                    }
                    m
                })
                .collect();
            hit.then(|| Snapshot { modules: modules.into(), ..snap.clone() })
        });
    }

    /// A BPF function appeared (PERF_RECORD_KSYMBOL register), live from `ts_ns`.
    pub fn bpf_register(&self, ts_ns: u64, func: BpfFunc) {
        self.apply_bpf(vec![(ts_ns, BpfEvent::Register(func))]);
    }

    /// The BPF function at `start` went away (PERF_RECORD_KSYMBOL unregister) at `ts_ns`.
    pub fn bpf_unregister(&self, ts_ns: u64, start: u64, name: &str) {
        self.apply_bpf(vec![(ts_ns, BpfEvent::Unregister { start, name: name.into() })]);
    }

    /// Applies time-ordered BPF records (each at its own time) and publishes
    /// the history once. Program loads are looked up through the bpf
    /// syscall here, so call it off the async threads.
    pub fn apply_bpf(&self, events: Vec<(u64, BpfEvent)>) {
        if events.is_empty() {
            return;
        }
        let n = events.len();
        let backlog = &self.counters.bpf_backlog;
        let _ = backlog.fetch_update(Relaxed, Relaxed, |b| Some(b.saturating_sub(n)));
        let syscall = self.lock().bpf_source == BpfSource::Syscall;
        // Program info first, without the lock (the syscalls are slow).
        let mut infos: Vec<BpfFunc> = Vec::new();
        for (_, e) in &events {
            if let (BpfEvent::ProgLoad { id }, true) = (e, syscall) {
                match super::bpf::prog_funcs(*id) {
                    Ok(f) => infos.extend(f),
                    // Gone again already, or no privilege: the KSYMBOL name stays.
                    Err(e) => tracing::debug!(prog_id = id, error = %e, "cannot read BPF program info"),
                }
            }
        }
        let mut st = self.lock();
        for (ts, e) in events {
            match e {
                BpfEvent::Register(f) => {
                    self.counters.ksymbol_events.fetch_add(1, Relaxed);
                    st.bpf.register(ts, f);
                }
                BpfEvent::Unregister { start, name } => {
                    self.counters.ksymbol_events.fetch_add(1, Relaxed);
                    st.bpf.unregister(ts, start, &name);
                }
                BpfEvent::ProgLoad { .. } => {}
            }
        }
        st.bpf.enrich(&infos);
        self.publish_bpf(&mut st);
    }

    /// Records were lost: enumerate BPF programs again. Returns false when
    /// only a kallsyms re-read can recover (no bpf syscall).
    pub fn rescan_bpf(&self) -> bool {
        self.counters.bpf_rescans.fetch_add(1, Relaxed);
        if self.lock().bpf_source != BpfSource::Syscall {
            return false;
        }
        let started = now_ns();
        match super::bpf::enumerate() {
            Ok(funcs) => {
                let mut st = self.lock();
                if st.bpf.reconcile(started, &BpfFuncs::new(funcs)) {
                    self.publish_bpf(&mut st);
                }
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "BPF rescan failed");
                false
            }
        }
    }
}

/// Reads and parses kallsyms into `st`; returns the `[bpf]` lines.
fn read_kallsyms(cfg: &StoreConfig, st: &mut State, counters: &Counters) -> Result<Vec<kallsyms::BpfLine>> {
    counters.full_reads.fetch_add(1, Relaxed);
    let t0 = Instant::now();
    let current: FxHashMap<&str, &Arc<ModuleMeta>> = st.sysfs.iter().flatten().map(|m| (&*m.name, m)).collect();
    let seen: RefCell<FxHashSet<Box<str>>> = RefCell::default();
    let tables = &st.tables;
    let want = |m: &str| {
        seen.borrow_mut().insert(m.into());
        match (current.get(m), tables.get(m)) {
            (Some(meta), Some(t)) => !t.instance.as_ref().is_some_and(|i| i.same_instance(meta)),
            // Not loaded (stale or pseudo module) or new: few lines, rebuild.
            _ => true,
        }
    };
    // Read in chunks, each parsed as it comes: the whole text is never held.
    let parsed =
        kallsyms::read_and_parse(&cfg.kallsyms, &ParseOptions { vmlinux: st.vmlinux.is_empty(), module: &want })
            .map_err(|source| {
                counters.read_failures.fetch_add(1, Relaxed);
                Error::ReadKallsyms { path: cfg.kallsyms.clone(), source }
            })?;
    let total_ns = t0.elapsed().as_nanos() as u64;
    let p = parsed.stats;
    if p.symbols == 0 && st.vmlinux.is_empty() || p.zero_addr > 0 && p.zero_addr == p.symbols {
        counters.read_failures.fetch_add(1, Relaxed);
        return Err(Error::NoSymbols { path: cfg.kallsyms.clone(), malformed: p.malformed });
    }
    if let Some(v) = parsed.vmlinux {
        st.vmlinux = Arc::new(v);
    }
    let seen = seen.into_inner();
    let mut tables: FxHashMap<Arc<str>, Table> =
        std::mem::take(&mut st.tables).into_iter().filter(|(n, _)| seen.contains(&**n)).collect();
    for (name, syms) in parsed.modules {
        let instance = current.get(&*name).map(|m| Arc::clone(m));
        tables.insert(Arc::from(name), Table { instance, syms: Arc::new(syms) });
    }
    st.tables = tables;
    st.last_parse = p;
    counters.last_read_ns.store(parsed.read_ns, Relaxed);
    counters.last_parse_ns.store(total_ns.saturating_sub(parsed.read_ns), Relaxed);
    Ok(parsed.bpf)
}

fn snapshot_of(st: &State) -> Snapshot {
    let modules: Vec<ModuleEntry> = match &st.sysfs {
        Some(mods) => mods
            .iter()
            .map(|m| ModuleEntry {
                meta: m.clone(),
                syms: st
                    .tables
                    .get(&m.name)
                    .filter(|t| t.instance.as_ref().is_some_and(|i| i.same_instance(m)))
                    .map(|t| t.syms.clone()),
            })
            .collect(),
        None => Vec::new(),
    };
    let loose: Vec<LooseTable> =
        st.tables.iter().map(|(n, t)| LooseTable { module: n.clone(), syms: t.syms.clone() }).collect();
    Snapshot {
        vmlinux: st.vmlinux.clone(),
        vmlinux_build_id: st.vmlinux_build_id.clone(),
        modules: modules.into(),
        loose: loose.into(),
        bpf: st.bpf_view.clone(),
    }
}
