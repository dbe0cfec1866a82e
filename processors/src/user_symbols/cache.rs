//! Loaded tables by build id (or file id), bounded in bytes, least
//! recently used evicted; a background thread loads what batches ask for,
//! so a lookup never parses a file.
//!
//! A key is `Ready` (a table), `Loading` (asked for, not done) or
//! `Missing` (no file or no symbols, until `negative_ttl` passes).
//! [`Cache::request`] marks a key `Loading` and queues it once; the worker
//! thread loads it and wakes every waiting batch through a [`Notify`].
//!
//! With an on-disk cache ([`DiskCache`]), the loader reads a key's table
//! from its file when there is a sound one (no ELF parse) and re-opens the
//! binary's DWARF for lines before publishing it; a table loaded from the
//! binary is written to disk before it is published, and its names are then
//! read in place from that file (page cache) instead of the heap. Batches
//! ask for new binaries smallest file first.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use profcol_api::services::FilePins;
use rustc_hash::FxHashMap;
use tokio::sync::Notify;

use super::debuginfod::{Debuginfod, DebuginfodCounters};
use super::disk::DiskCache;
use super::table::{BinaryTable, Missing, SearchPaths, Want};

/// The state of one key.
#[derive(Clone)]
pub enum State {
    Ready(Arc<BinaryTable>),
    Loading,
    Missing(Missing),
}

struct Entry {
    state: EntryState,
    /// LRU clock of the last lookup.
    used: u64,
}

enum EntryState {
    Ready { table: Arc<BinaryTable>, bytes: usize },
    Loading,
    Missing { why: Missing, since: Instant },
}

/// Counters of the loader, read into /metrics.
#[derive(Default)]
pub struct LoadCounters {
    pub tables_loaded: AtomicU64,
    pub(crate) tables_missing: AtomicU64,
    pub evictions: AtomicU64,
    /// Total parse time of loaded tables, µs.
    pub(crate) parse_micros: AtomicU64,
}

struct Inner {
    entries: FxHashMap<Arc<str>, Entry>,
    clock: u64,
    /// Heap bytes of ready tables (what `max_bytes` bounds).
    bytes: usize,
    /// Debug sections they read in place from file mappings, at the last
    /// `settle`.
    mapped: usize,
}

pub struct Cache {
    inner: Mutex<Inner>,
    max_bytes: usize,
    negative_ttl: Duration,
    queue: std::sync::mpsc::Sender<Want>,
    /// Woken whenever a load finishes.
    pub loaded: Arc<Notify>,
    pub counters: Arc<LoadCounters>,
    pub debuginfod: Arc<DebuginfodCounters>,
    /// The on-disk table cache, when `cache.dir` is set and usable.
    pub disk: Option<Arc<DiskCache>>,
}

impl Cache {
    /// A cache and its loader thread (which ends when the cache is dropped).
    pub fn start(max_bytes: u64, negative_ttl: Duration, search: SearchPaths, pins: Arc<FilePins>) -> Arc<Self> {
        Self::start_with(max_bytes, negative_ttl, search, pins, None, None)
    }

    /// With a debuginfod client for the loader thread, and an on-disk cache.
    pub(crate) fn start_with(
        max_bytes: u64,
        negative_ttl: Duration,
        search: SearchPaths,
        pins: Arc<FilePins>,
        mut debuginfod: Option<Debuginfod>,
        disk: Option<DiskCache>,
    ) -> Arc<Self> {
        let disk = disk.map(Arc::new);
        let (tx, rx) = std::sync::mpsc::channel::<Want>();
        let cache = Arc::new(Cache {
            inner: Mutex::new(Inner { entries: FxHashMap::default(), clock: 0, bytes: 0, mapped: 0 }),
            max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
            negative_ttl,
            queue: tx,
            loaded: Arc::new(Notify::new()),
            counters: Arc::new(LoadCounters::default()),
            debuginfod: Arc::new(DebuginfodCounters::default()),
            disk: disk.clone(),
        });
        let dcounters = cache.debuginfod.clone();
        let weak = Arc::downgrade(&cache);
        let spawned = std::thread::Builder::new().name("user-symbols".into()).spawn(move || {
            // Ends when every sender (the cache) is gone.
            while let Ok(want) = rx.recv() {
                let t0 = Instant::now();
                let stored = disk.as_ref().and_then(|d| d.read(&want.key));
                let from_disk = stored.is_some();
                let mut result = match stored {
                    Some(t) => {
                        let table = BinaryTable::from_disk(t);
                        // DWARF before the table is published: a batch
                        // never sees it named by function alone (its
                        // inlined frames missing) while lines are on.
                        if search.lines && table.wants_dwarf() {
                            let client = debuginfod.as_mut().map(|c| (c, &*dcounters));
                            let attached = table.attach_dwarf(&want, pins.get(&want.key), &search, client);
                            tracing::debug!(key = %want.key, attached, "user_symbols: DWARF of a table from disk");
                        }
                        Ok(table)
                    }
                    None => {
                        let client = debuginfod.as_mut().map(|c| (c, &*dcounters));
                        BinaryTable::load_with(&want, pins.get(&want.key), &search, client)
                    }
                };
                if let (false, Some(d), Ok(table)) = (from_disk, &disk, &mut result) {
                    let mapped = match table.disk_parts() {
                        Some((segments, symbols, had_dwarf)) if !symbols.is_empty() => {
                            d.write(&want.key, segments, symbols, had_dwarf)
                        }
                        _ => None,
                    };
                    if let Some(symbols) = mapped {
                        table.use_symbols(symbols);
                    }
                }
                let Some(cache) = weak.upgrade() else { return };
                cache.finish(&want, result, t0.elapsed());
            }
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "user_symbols: cannot start the loader thread; user frames stay unnamed");
        }
        cache
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state of `want.key`, asking the loader for it when unknown (or
    /// when its negative entry expired).
    pub fn request(&self, want: &Want) -> State {
        let mut inner = self.lock();
        inner.clock += 1;
        let clock = inner.clock;
        if let Some(e) = inner.entries.get_mut(&want.key) {
            e.used = clock;
            match &e.state {
                EntryState::Ready { table, .. } => return State::Ready(table.clone()),
                EntryState::Loading => return State::Loading,
                EntryState::Missing { why, since } if since.elapsed() < self.negative_ttl => {
                    return State::Missing(*why)
                }
                EntryState::Missing { .. } => {}
            }
        }
        inner.entries.insert(want.key.clone(), Entry { state: EntryState::Loading, used: clock });
        if self.queue.send(want.clone()).is_err() {
            inner.entries.insert(
                want.key.clone(),
                Entry { state: EntryState::Missing { why: Missing::NoFile, since: Instant::now() }, used: clock },
            );
            return State::Missing(Missing::NoFile);
        }
        State::Loading
    }

    /// The state of a key without asking for it.
    pub fn peek(&self, key: &str) -> Option<State> {
        self.lock().entries.get(key).map(|e| match &e.state {
            EntryState::Ready { table, .. } => State::Ready(table.clone()),
            EntryState::Loading => State::Loading,
            EntryState::Missing { why, .. } => State::Missing(*why),
        })
    }

    /// Publishes a load's result; the table, when there is one.
    fn finish(&self, want: &Want, result: Result<BinaryTable, Missing>, took: Duration) -> Option<Arc<BinaryTable>> {
        let mut published = None;
        {
            let mut inner = self.lock();
            let used = inner.entries.get(&want.key).map_or(inner.clock, |e| e.used);
            let state = match result {
                Ok(table) => {
                    self.counters.tables_loaded.fetch_add(1, Relaxed);
                    self.counters.parse_micros.fetch_add(took.as_micros() as u64, Relaxed);
                    let bytes = table.heap_bytes();
                    inner.bytes += bytes;
                    tracing::debug!(key = %want.key, path = %want.path, bytes, ?took, "user_symbols: table loaded");
                    let table = Arc::new(table);
                    published = Some(table.clone());
                    EntryState::Ready { table, bytes }
                }
                Err(why) => {
                    self.counters.tables_missing.fetch_add(1, Relaxed);
                    tracing::debug!(key = %want.key, path = %want.path, ?why, "user_symbols: no symbols");
                    EntryState::Missing { why, since: Instant::now() }
                }
            };
            if let Some(old) = inner.entries.insert(want.key.clone(), Entry { state, used }) {
                if let EntryState::Ready { bytes, .. } = old.state {
                    inner.bytes -= bytes;
                }
            }
            self.evict(&mut inner, Some(&want.key));
        }
        self.loaded.notify_waiters();
        published
    }

    /// Re-measures tables (their memos grow) and evicts least recently used
    /// ones beyond `max_bytes`. Called after each batch.
    pub fn settle(&self) {
        let mut inner = self.lock();
        let mut total = 0;
        for e in inner.entries.values_mut() {
            if let EntryState::Ready { table, bytes } = &mut e.state {
                *bytes = table.heap_bytes();
                total += *bytes;
            }
        }
        inner.bytes = total;
        self.evict(&mut inner, None);
        inner.mapped = inner
            .entries
            .values()
            .map(|e| match &e.state {
                EntryState::Ready { table, .. } => table.mapped_bytes(),
                _ => 0,
            })
            .sum();
    }

    fn evict(&self, inner: &mut Inner, keep: Option<&Arc<str>>) {
        // Expired negative entries and old Missing ones cost little, but are
        // bounded too: at most as many as there are ready tables plus 64k.
        while inner.bytes > self.max_bytes {
            let victim = inner
                .entries
                .iter()
                .filter(|(k, e)| matches!(e.state, EntryState::Ready { .. }) && Some(*k) != keep)
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone());
            let Some(k) = victim else { break };
            if let Some(Entry { state: EntryState::Ready { bytes, .. }, .. }) = inner.entries.remove(&k) {
                inner.bytes -= bytes;
                self.counters.evictions.fetch_add(1, Relaxed);
            }
        }
        if inner.entries.len() > MAX_KEYS {
            let ttl = self.negative_ttl;
            inner
                .entries
                .retain(|_, e| !matches!(&e.state, EntryState::Missing { since, .. } if since.elapsed() >= ttl));
        }
    }

    /// Heap bytes of ready tables.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Bytes of debug sections ready tables read in place from file
    /// mappings, at the last [`Self::settle`].
    pub fn mapped_bytes(&self) -> usize {
        self.lock().mapped
    }

    pub fn tables(&self) -> usize {
        self.lock().entries.values().filter(|e| matches!(e.state, EntryState::Ready { .. })).count()
    }
}

/// Keys remembered before expired negative entries are swept.
const MAX_KEYS: usize = 65536;
