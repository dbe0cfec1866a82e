//! The processor: asks the cache for every binary a batch needs, waits at
//! most `max_wait` for those still loading, and names what is loaded.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use async_trait::async_trait;
use profcol_api::component::{ComponentError, ProcessError, ProcessOutcome, Processor};
use profcol_api::services::FilePins;
use profcol_api::telemetry::{ComponentTelemetry, Counter, Gauge, MetricDef};
use profcol_api::Profiles;

use super::cache::{Cache, State};
use super::config::Config;
use super::debuginfod::Debuginfod;
use super::disk::DiskCache;
use super::symbolize::{self, Candidates, Outcome};
use super::table::{SearchPaths, Want};

pub struct UserSymbols {
    cfg: Config,
    pins: Arc<FilePins>,
    cache: OnceLock<Arc<Cache>>,
    metrics: Option<Metrics>,
}

/// `profcol_processor_user_symbols_*`.
struct Metrics {
    named: Counter,
    no_symbols: Counter,
    pending: Counter,
    no_file: Counter,
    cache_bytes: Gauge,
    cache_mapped_bytes: Gauge,
    tables: Gauge,
    tables_loaded: Counter,
    tables_missing: Counter,
    evictions: Counter,
    parse_micros: Counter,
    debuginfod: [Counter; 4],
    /// hit, miss, invalid.
    dir_lookups: [Counter; 3],
    /// ok, error.
    dir_writes: [Counter; 2],
    dir_evictions: Counter,
    /// Loader counters as last mirrored.
    seen: [std::sync::atomic::AtomicU64; 14],
}

pub(crate) const FRAMES: MetricDef = MetricDef::counter(
    "user_symbols_frames_total",
    "frames",
    "Native user frames by outcome: each frame of each sample, times the sample's observations",
)
.by("outcome");
pub(crate) const CACHE_BYTES: MetricDef = MetricDef::gauge(
    "user_symbols_cache_bytes",
    "bytes",
    "Heap bytes of symbol tables held (what cache.max_bytes bounds)",
);
pub(crate) const CACHE_MAPPED_BYTES: MetricDef = MetricDef::gauge(
    "user_symbols_cache_mapped_bytes",
    "bytes",
    "Bytes of debug sections and symbol names the tables held read in place from files' mappings (binaries, cache.dir; page cache; not in cache.max_bytes)",
);
pub(crate) const TABLES: MetricDef = MetricDef::gauge("user_symbols_tables", "1", "Symbol tables held");
pub(crate) const TABLES_LOADED: MetricDef =
    MetricDef::counter("user_symbols_tables_loaded_total", "1", "Symbol tables loaded");
pub(crate) const TABLES_MISSING: MetricDef = MetricDef::counter(
    "user_symbols_tables_missing_total",
    "1",
    "Binaries whose file or symbols could not be found (tried again after negative_ttl)",
);
pub(crate) const EVICTIONS: MetricDef =
    MetricDef::counter("user_symbols_evictions_total", "1", "Tables evicted to stay within cache.max_bytes");
pub(crate) const PARSE_MICROSECONDS: MetricDef =
    MetricDef::counter("user_symbols_parse_microseconds_total", "microseconds", "Time spent loading tables, µs");
pub(crate) const DEBUGINFOD_REQUESTS: MetricDef = MetricDef::counter(
    "user_symbols_debuginfod_requests_total",
    "1",
    "debuginfod lookups by outcome (negative_cached: answered by the negative cache, no request)",
)
.by("outcome");
pub(crate) const CACHE_DIR_LOOKUPS: MetricDef = MetricDef::counter(
    "user_symbols_cache_dir_lookups_total",
    "1",
    "Tables looked for in cache.dir by outcome (invalid: a truncated, corrupt or other-version file, ignored and rebuilt)",
)
.by("outcome");
pub(crate) const CACHE_DIR_WRITES: MetricDef =
    MetricDef::counter("user_symbols_cache_dir_writes_total", "1", "Tables written to cache.dir by outcome")
        .by("outcome");
pub(crate) const CACHE_DIR_EVICTIONS: MetricDef = MetricDef::counter(
    "user_symbols_cache_dir_evictions_total",
    "1",
    "Table files removed from cache.dir to stay within cache.dir_max_bytes",
);

/// Every series of the processor, for its factory.
pub(crate) const METRICS: &[MetricDef] = &[
    FRAMES,
    CACHE_BYTES,
    CACHE_MAPPED_BYTES,
    TABLES,
    TABLES_LOADED,
    TABLES_MISSING,
    EVICTIONS,
    PARSE_MICROSECONDS,
    DEBUGINFOD_REQUESTS,
    CACHE_DIR_LOOKUPS,
    CACHE_DIR_WRITES,
    CACHE_DIR_EVICTIONS,
];

impl Metrics {
    fn new(t: &ComponentTelemetry) -> Self {
        Metrics {
            named: t.counter_by(&FRAMES, "named"),
            no_symbols: t.counter_by(&FRAMES, "unnamed_no_symbols"),
            pending: t.counter_by(&FRAMES, "unnamed_pending"),
            no_file: t.counter_by(&FRAMES, "unnamed_no_file"),
            cache_bytes: t.gauge_of(&CACHE_BYTES),
            cache_mapped_bytes: t.gauge_of(&CACHE_MAPPED_BYTES),
            tables: t.gauge_of(&TABLES),
            tables_loaded: t.counter_of(&TABLES_LOADED),
            tables_missing: t.counter_of(&TABLES_MISSING),
            evictions: t.counter_of(&EVICTIONS),
            parse_micros: t.counter_of(&PARSE_MICROSECONDS),
            debuginfod: ["ok", "not_found", "error", "negative_cached"].map(|o| t.counter_by(&DEBUGINFOD_REQUESTS, o)),
            dir_lookups: ["hit", "miss", "invalid"].map(|o| t.counter_by(&CACHE_DIR_LOOKUPS, o)),
            dir_writes: ["ok", "error"].map(|o| t.counter_by(&CACHE_DIR_WRITES, o)),
            dir_evictions: t.counter_of(&CACHE_DIR_EVICTIONS),
            seen: Default::default(),
        }
    }

    fn record(&self, o: &Outcome, cache: &Cache) {
        self.named.add(o.named);
        self.no_symbols.add(o.no_symbols);
        self.pending.add(o.pending);
        self.no_file.add(o.no_file);
        self.cache_bytes.set(cache.bytes() as i64);
        self.cache_mapped_bytes.set(cache.mapped_bytes() as i64);
        self.tables.set(cache.tables() as i64);
        let c = &cache.counters;
        for (i, (now, series)) in [
            (c.tables_loaded.load(Relaxed), &self.tables_loaded),
            (c.tables_missing.load(Relaxed), &self.tables_missing),
            (c.evictions.load(Relaxed), &self.evictions),
            (c.parse_micros.load(Relaxed), &self.parse_micros),
            (cache.debuginfod.ok.load(Relaxed), &self.debuginfod[0]),
            (cache.debuginfod.not_found.load(Relaxed), &self.debuginfod[1]),
            (cache.debuginfod.error.load(Relaxed), &self.debuginfod[2]),
            (cache.debuginfod.negative_hits.load(Relaxed), &self.debuginfod[3]),
        ]
        .into_iter()
        .chain(cache.disk.iter().flat_map(|d| {
            let d = &d.counters;
            [
                (d.hits.load(Relaxed), &self.dir_lookups[0]),
                (d.misses.load(Relaxed), &self.dir_lookups[1]),
                (d.invalid.load(Relaxed), &self.dir_lookups[2]),
                (d.writes.load(Relaxed), &self.dir_writes[0]),
                (d.write_errors.load(Relaxed), &self.dir_writes[1]),
                (d.evictions.load(Relaxed), &self.dir_evictions),
            ]
        }))
        .enumerate()
        {
            series.add(now.saturating_sub(self.seen[i].swap(now, Relaxed)));
        }
    }
}

impl UserSymbols {
    /// Without series in /metrics (tests, tools).
    pub fn new(cfg: Config, pins: Arc<FilePins>) -> Self {
        UserSymbols { cfg, pins, cache: OnceLock::new(), metrics: None }
    }

    pub fn with_telemetry(cfg: Config, pins: Arc<FilePins>, telemetry: &ComponentTelemetry) -> Self {
        UserSymbols { metrics: Some(Metrics::new(telemetry)), ..Self::new(cfg, pins) }
    }

    fn cache(&self) -> &Arc<Cache> {
        self.cache.get_or_init(|| {
            let disk = self.cfg.cache.dir.as_deref().and_then(|d| DiskCache::open(d, self.cfg.cache.dir_max_bytes));
            let search = SearchPaths {
                debug_dirs: self.cfg.debug_dirs.clone(),
                lines: self.cfg.lines,
                minidebuginfo: self.cfg.minidebuginfo,
                go_pclntab: self.cfg.go_pclntab,
                spill_dir: disk.as_ref().map(|d| d.dir().to_owned()),
            };
            Cache::start_with(
                self.cfg.cache.max_bytes,
                self.cfg.negative_ttl,
                search,
                self.pins.clone(),
                Debuginfod::new(&self.cfg.debuginfod),
                disk,
            )
        })
    }

    /// Names `batch`'s native frames, waiting at most `max_wait` for loads.
    pub async fn symbolize(&self, batch: Profiles) -> (Profiles, Outcome) {
        let candidates = Candidates::find(&batch);
        if candidates.is_empty() {
            return (batch, Outcome::default());
        }
        let cache = self.cache().clone();
        let wants = self.load_order(&cache, candidates.wants());
        let deadline = Instant::now() + self.cfg.max_wait;
        loop {
            // Armed before the check, so a load finishing in between wakes us.
            let notified = cache.loaded.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let loading = wants.iter().filter(|w| matches!(cache.request(w), State::Loading)).count();
            let left = deadline.saturating_duration_since(Instant::now());
            if loading == 0 || left.is_zero() {
                break;
            }
            let _ = tokio::time::timeout(left, notified).await;
        }
        let (batch, outcome) = symbolize::symbolize(batch, &candidates, &|key| cache.peek(key));
        cache.settle();
        (batch, outcome)
    }

    /// `wants` with the binaries not yet asked for last, smallest file
    /// first: most binaries load in milliseconds, so one large library
    /// (a compiler's, a debug build's) does not hold all the others past
    /// `max_wait`. The loader takes them in this order.
    fn load_order(&self, cache: &Cache, mut wants: Vec<Want>) -> Vec<Want> {
        let known = |w: &Want| cache.peek(&w.key).is_some();
        if wants.iter().all(known) {
            return wants;
        }
        let size = |w: &Want| {
            let pinned = self.pins.get(&w.key).and_then(|p| p.file.metadata().ok());
            pinned.or_else(|| std::fs::metadata(&*w.path).ok()).map_or(u64::MAX, |m| m.len())
        };
        wants.sort_by_cached_key(|w| if known(w) { (false, 0) } else { (true, size(w)) });
        wants
    }

    /// The cache (created on first use).
    pub fn table_cache(&self) -> &Arc<Cache> {
        self.cache()
    }
}

#[async_trait]
impl Processor for UserSymbols {
    async fn start(&self) -> Result<(), ComponentError> {
        let _ = self.cache();
        Ok(())
    }

    async fn process(&self, batch: Profiles) -> Result<ProcessOutcome, ProcessError> {
        let (batch, outcome) = self.symbolize(batch).await;
        if let Some(m) = &self.metrics {
            m.record(&outcome, self.cache());
        }
        Ok(ProcessOutcome::Forward(batch))
    }
}
