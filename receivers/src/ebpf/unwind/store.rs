//! Unwind tables loaded into the kernel's maps, shared by every process that
//! maps the same file (by build id), within `unwind.max_table_bytes`.
//!
//! A table takes runs of the row array (two rows per 8-byte element,
//! first-fit from a free list), one hash entry per page, and ids in the
//! global rule dictionary (append-only, bounded by the rule map). The row
//! array is made of chunks the kernel allocates only while a table uses
//! them ([`Sink::release_chunk`]), so a run never crosses a chunk: a table
//! larger than a chunk is cut at page boundaries into pieces of one run
//! each (a page's rows fit a chunk). When a
//! new table does not fit, the least recently used tables go first (a table
//! is used when a process sampled in the interval maps its file: the
//! caller's [`TableStore::touch`]; processes of an evicted table's file
//! fall back to frame pointers). Tables unused for [`UNUSED_GRACE`] are
//! dropped.
//!
//! The kernel side is behind [`Sink`], so the bookkeeping is tested without
//! BPF maps.

use profcol_ebpf::unwind::CHUNK_ELEMS;
use profcol_elf::unwind::{CompactTable, Rule, PAGE_ENTRY_BYTES};
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a table nobody maps stays loaded (a binary run again soon, as
/// in a shell loop, keeps its table).
pub(crate) const UNUSED_GRACE: Duration = Duration::from_secs(30);

/// Where the tables go (the BPF maps, or a fake in tests).
pub(crate) trait Sink {
    /// Writes row-array elements `at ..` (each two rows, low half first).
    fn write_rows(&mut self, at: u32, elems: &[u64]) -> Result<(), String>;
    fn set_page(&mut self, table: u32, page: u32, first: u32, count: u32) -> Result<(), String>;
    fn remove_page(&mut self, table: u32, page: u32);
    /// `(page, first, count)` of one table at once (the kernel's side does
    /// it in one syscall).
    fn set_pages(&mut self, table: u32, pages: &[(u32, u32, u32)]) -> Result<(), String> {
        pages.iter().try_for_each(|&(page, first, count)| self.set_page(table, page, first, count))
    }
    fn remove_pages(&mut self, table: u32, pages: &[u32]) {
        for &p in pages {
            self.remove_page(table, p);
        }
    }
    fn set_rule(&mut self, id: u32, rule: Rule) -> Result<(), String>;
    /// No table uses row chunk `index` any more: the kernel may free it.
    fn release_chunk(&mut self, _index: u32) {}
}

/// What identifies a table: the GNU build id, else the file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum TableKey {
    BuildId(Arc<str>),
    File { dev: u64, inode: u64, size: u64, mtime: (i64, i64) },
}

/// Why a table was not loaded.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LoadRefused {
    /// Larger than `max_table_bytes` on its own.
    TooLarge,
    /// The rule dictionary is full.
    RulesFull,
    /// The kernel refused a map update.
    Map(String),
}

struct Entry {
    id: u32,
    /// Its row-array runs `(first element, elements)`, one per piece.
    runs: Vec<(u32, u32)>,
    pages: Vec<u32>,
    bytes: u64,
    last_used: Instant,
}

/// Loaded tables and their space.
pub(crate) struct TableStore {
    entries: FxHashMap<TableKey, Entry>,
    ids: FxHashMap<u32, TableKey>,
    next_id: u32,
    /// Free runs `(at, elems)` of the row array, sorted by `at`; none
    /// crosses a chunk boundary.
    free: Vec<(u32, u32)>,
    /// Elements per row chunk.
    chunk_elems: u32,
    page_capacity: usize,
    pages_used: usize,
    max_bytes: u64,
    bytes: u64,
    rules: FxHashMap<Rule, u32>,
    rule_capacity: u32,
    /// Tables evicted to make room (in use or not).
    pub evictions: u64,
    /// Their keys, for the caller to take ([`TableStore::take_evicted`]).
    evicted: Vec<TableKey>,
}

impl TableStore {
    /// `row_elems`: elements of the row array (rounded up to whole chunks
    /// of [`CHUNK_ELEMS`]); `page_capacity`: entries of the page map;
    /// `rule_capacity`: entries of the rule map.
    pub(crate) fn new(max_bytes: u64, row_elems: u32, page_capacity: usize, rule_capacity: u32) -> Self {
        Self::with_chunks(max_bytes, row_elems, CHUNK_ELEMS, page_capacity, rule_capacity)
    }

    /// [`TableStore::new`] with chunks of `chunk_elems` elements (at least
    /// half a page's worth of rows for every table loaded).
    fn with_chunks(max_bytes: u64, row_elems: u32, chunk_elems: u32, page_capacity: usize, rule_capacity: u32) -> Self {
        let chunks = row_elems.div_ceil(chunk_elems);
        TableStore {
            entries: FxHashMap::default(),
            ids: FxHashMap::default(),
            next_id: 1,
            free: (0..chunks).map(|c| (c * chunk_elems, chunk_elems)).collect(),
            chunk_elems,
            page_capacity,
            pages_used: 0,
            max_bytes,
            bytes: 0,
            rules: FxHashMap::default(),
            rule_capacity,
            evictions: 0,
            evicted: Vec::new(),
        }
    }

    /// Bytes of the loaded tables (rows and page entries).
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The loaded table's id for `key`.
    pub(crate) fn id(&self, key: &TableKey) -> Option<u32> {
        self.entries.get(key).map(|e| e.id)
    }

    /// The keys of the tables evicted to make room since the last call.
    pub(crate) fn take_evicted(&mut self) -> Vec<TableKey> {
        std::mem::take(&mut self.evicted)
    }

    /// Marks the table `id` as used at `now` (for LRU and the grace).
    pub(crate) fn touch(&mut self, id: u32, now: Instant) {
        if let Some(e) = self.ids.get(&id).and_then(|k| self.entries.get_mut(k)) {
            e.last_used = now;
        }
    }

    /// Loads `table` under `key`, evicting as needed, and returns its id.
    /// The keys of evicted tables wait in [`TableStore::take_evicted`] (the
    /// caller forgets the files it pointed at them).
    pub(crate) fn load(
        &mut self,
        key: TableKey,
        table: &CompactTable,
        sink: &mut dyn Sink,
        now: Instant,
    ) -> Result<u32, LoadRefused> {
        let pieces = pieces(table, self.chunk_elems).ok_or(LoadRefused::TooLarge)?;
        let need: Vec<u32> = pieces.iter().map(|p| p.elems).collect();
        let bytes = need.iter().map(|&e| u64::from(e) * 8).sum::<u64>() + (table.pages.len() * PAGE_ENTRY_BYTES) as u64;
        if bytes > self.max_bytes || table.pages.len() > self.page_capacity {
            return Err(LoadRefused::TooLarge);
        }
        // Rule ids first: a full dictionary refuses before anything moves.
        let new_rules: FxHashSet<Rule> = table.rules.iter().copied().filter(|r| !self.rules.contains_key(r)).collect();
        if self.rules.len() + new_rules.len() > self.rule_capacity as usize {
            return Err(LoadRefused::RulesFull);
        }
        let runs = loop {
            let fits_bytes = self.bytes + bytes <= self.max_bytes;
            let fits_pages = self.pages_used + table.pages.len() <= self.page_capacity;
            if fits_bytes && fits_pages {
                if let Some(runs) = self.allocate_all(&need) {
                    break runs;
                }
            }
            match self.victim() {
                Some(victim) => {
                    self.evict(&victim, sink);
                    self.evictions += 1;
                    self.evicted.push(victim);
                }
                None => return Err(LoadRefused::TooLarge),
            }
        };
        let id = self.next_id;
        self.next_id = self.next_id.checked_add(1).unwrap_or(1).max(1);
        match self.write(id, &runs, &pieces, table, sink) {
            Ok(()) => {}
            Err(e) => {
                let pages: Vec<u32> = table.pages.iter().map(|p| p.page).collect();
                sink.remove_pages(id, &pages);
                for &(at, elems) in &runs {
                    self.free_run(at, elems, sink);
                }
                return Err(LoadRefused::Map(e));
            }
        }
        self.bytes += bytes;
        self.pages_used += table.pages.len();
        self.ids.insert(id, key.clone());
        self.entries.insert(
            key,
            Entry { id, runs, pages: table.pages.iter().map(|p| p.page).collect(), bytes, last_used: now },
        );
        Ok(id)
    }

    fn write(
        &mut self,
        id: u32,
        runs: &[(u32, u32)],
        pieces: &[Piece],
        table: &CompactTable,
        sink: &mut dyn Sink,
    ) -> Result<(), String> {
        let mut global = Vec::with_capacity(table.rules.len());
        for r in &table.rules {
            let next = self.rules.len() as u32;
            let g = match self.rules.get(r) {
                Some(&g) => g,
                None => {
                    sink.set_rule(next, *r)?;
                    self.rules.insert(*r, next);
                    next
                }
            };
            global.push(g);
        }
        let remap = |w: u32| (w & 0xffff_0000) | global[(w & 0xffff) as usize];
        let mut pages: Vec<(u32, u32, u32)> = Vec::with_capacity(table.pages.len());
        let mut rows: Vec<u32> = Vec::new();
        let mut elems: Vec<u64> = Vec::new();
        for (piece, &(at, _)) in pieces.iter().zip(runs) {
            // The piece's pages, their rows one after another from the
            // run's first row.
            rows.clear();
            for p in &table.pages[piece.pages.clone()] {
                pages.push((p.page, at * 2 + rows.len() as u32, p.count));
                rows.extend(table.rows[p.first as usize..(p.first + p.count) as usize].iter().map(|&w| remap(w)));
            }
            elems.clear();
            elems.extend(
                rows.chunks(2).map(|pair| u64::from(pair[0]) | pair.get(1).map_or(0, |&hi| u64::from(hi) << 32)),
            );
            elems.resize(piece.elems as usize, 0);
            sink.write_rows(at, &elems)?;
        }
        sink.set_pages(id, &pages)
    }

    /// The least recently used table.
    fn victim(&self) -> Option<TableKey> {
        self.entries.iter().min_by_key(|(_, e)| e.last_used).map(|(k, _)| k.clone())
    }

    fn evict(&mut self, key: &TableKey, sink: &mut dyn Sink) {
        let Some(e) = self.entries.remove(key) else { return };
        sink.remove_pages(e.id, &e.pages);
        self.ids.remove(&e.id);
        for &(at, elems) in &e.runs {
            self.free_run(at, elems, sink);
        }
        self.bytes -= e.bytes;
        self.pages_used -= e.pages.len();
    }

    /// Drops tables unused for [`UNUSED_GRACE`]; returns their keys.
    pub(crate) fn drop_unused(&mut self, now: Instant, sink: &mut dyn Sink) -> Vec<TableKey> {
        let old: Vec<TableKey> = self
            .entries
            .iter()
            .filter(|(_, e)| now.duration_since(e.last_used) >= UNUSED_GRACE)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &old {
            self.evict(k, sink);
        }
        old
    }

    /// A run for each of `need` (element counts), or none at all.
    fn allocate_all(&mut self, need: &[u32]) -> Option<Vec<(u32, u32)>> {
        let mut runs = Vec::with_capacity(need.len());
        for &elems in need {
            match self.allocate(elems) {
                Some(at) => runs.push((at, elems)),
                None => {
                    // Given back as they were taken: no chunk empties here
                    // that was not empty before.
                    for &(at, elems) in runs.iter().rev() {
                        self.give_back(at, elems);
                    }
                    return None;
                }
            }
        }
        Some(runs)
    }

    fn allocate(&mut self, elems: u32) -> Option<u32> {
        let i = self.free.iter().position(|&(_, len)| len >= elems)?;
        let (at, len) = self.free[i];
        if len == elems {
            self.free.remove(i);
        } else {
            self.free[i] = (at + elems, len - elems);
        }
        Some(at)
    }

    /// Frees a run; a chunk left with no run in use goes back to the kernel.
    fn free_run(&mut self, at: u32, elems: u32, sink: &mut dyn Sink) {
        let i = self.give_back(at, elems);
        let (start, len) = self.free[i];
        if len == self.chunk_elems {
            sink.release_chunk(start / self.chunk_elems);
        }
    }

    /// Puts a run back into the free list, merged with its neighbours in
    /// the same chunk; returns the index of the run that holds it.
    fn give_back(&mut self, at: u32, elems: u32) -> usize {
        let chunk = |a: u32| a / self.chunk_elems;
        let mut i = self.free.partition_point(|&(a, _)| a < at);
        self.free.insert(i, (at, elems));
        if i + 1 < self.free.len()
            && self.free[i].0 + self.free[i].1 == self.free[i + 1].0
            && chunk(self.free[i].0) == chunk(self.free[i + 1].0)
        {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 && chunk(self.free[i - 1].0) == chunk(at)
        {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
            i -= 1;
        }
        i
    }
}

/// Consecutive pages of a table whose rows go into one run.
struct Piece {
    pages: std::ops::Range<usize>,
    /// Elements of its run (two rows each).
    elems: u32,
}

/// Cuts `table` at page boundaries into pieces of at most `chunk_elems`
/// elements; `None` if a page alone is larger (or a page's rows are not in
/// the table).
fn pieces(table: &CompactTable, chunk_elems: u32) -> Option<Vec<Piece>> {
    let mut out: Vec<Piece> = Vec::new();
    let (mut start, mut rows) = (0usize, 0u64);
    for (i, p) in table.pages.iter().enumerate() {
        if (p.first as usize).checked_add(p.count as usize)? > table.rows.len() {
            return None;
        }
        let count = u64::from(p.count);
        if count.div_ceil(2) > u64::from(chunk_elems) {
            return None;
        }
        if (rows + count).div_ceil(2) > u64::from(chunk_elems) {
            out.push(Piece { pages: start..i, elems: rows.div_ceil(2).max(1) as u32 });
            (start, rows) = (i, 0);
        }
        rows += count;
    }
    out.push(Piece { pages: start..table.pages.len(), elems: rows.div_ceil(2).max(1) as u32 });
    Some(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use profcol_elf::unwind::{kind, rbp, Page};

    /// The maps as plain memory.
    #[derive(Default)]
    pub(crate) struct MemSink {
        pub rows: FxHashMap<u32, u64>,
        pub pages: FxHashMap<(u32, u32), (u32, u32)>,
        pub rules: FxHashMap<u32, Rule>,
        /// `unwind_files` and `unwind_wanted` as maps.
        pub files: FxHashMap<profcol_ebpf::unwind::KernelFile, (u32, Vec<profcol_ebpf::unwind::FileSegment>)>,
        pub wanted: FxHashMap<profcol_ebpf::unwind::KernelFile, profcol_ebpf::unwind::Want>,
        /// Writes of `files`.
        pub file_writes: usize,
        /// Elements per row chunk, for checking that no write crosses one
        /// (0: [`CHUNK_ELEMS`]).
        pub chunk_elems: u32,
        /// Chunks given back, in order.
        pub released: Vec<u32>,
    }

    impl crate::ebpf::unwind::FileSink for MemSink {
        fn set_file(
            &mut self,
            file: profcol_ebpf::unwind::KernelFile,
            table: u32,
            segs: &[profcol_ebpf::unwind::FileSegment],
        ) -> Result<(), String> {
            self.files.insert(file, (table, segs.to_vec()));
            self.file_writes += 1;
            Ok(())
        }
        fn remove_files(&mut self, files: &[profcol_ebpf::unwind::KernelFile]) {
            for f in files {
                assert!(self.files.remove(f).is_some(), "{f:?} removed but never written");
            }
        }
        fn wanted(&mut self, out: &mut Vec<(profcol_ebpf::unwind::KernelFile, profcol_ebpf::unwind::Want)>) {
            out.extend(self.wanted.iter().map(|(f, w)| (*f, *w)));
        }
        fn remove_wanted(&mut self, files: &[profcol_ebpf::unwind::KernelFile]) {
            for f in files {
                self.wanted.remove(f);
            }
        }
    }

    impl Sink for MemSink {
        fn write_rows(&mut self, at: u32, elems: &[u64]) -> Result<(), String> {
            let chunk = if self.chunk_elems == 0 { CHUNK_ELEMS } else { self.chunk_elems };
            assert!(!elems.is_empty());
            assert_eq!(
                at / chunk,
                (at + elems.len() as u32 - 1) / chunk,
                "{} elements at {at} cross a chunk",
                elems.len()
            );
            for (i, &e) in elems.iter().enumerate() {
                self.rows.insert(at + i as u32, e);
            }
            Ok(())
        }
        fn set_page(&mut self, table: u32, page: u32, first: u32, count: u32) -> Result<(), String> {
            self.pages.insert((table, page), (first, count));
            Ok(())
        }
        fn remove_page(&mut self, table: u32, page: u32) {
            self.pages.remove(&(table, page));
        }
        fn set_rule(&mut self, id: u32, rule: Rule) -> Result<(), String> {
            self.rules.insert(id, rule);
            Ok(())
        }
        fn release_chunk(&mut self, index: u32) {
            self.released.push(index);
        }
    }

    impl MemSink {
        /// The rule the BPF program would find for `vaddr` in table `id`.
        pub(crate) fn rule_at(&self, id: u32, vaddr: u64) -> Option<Rule> {
            let &(first, count) = self.pages.get(&(id, (vaddr >> 16) as u32))?;
            let row = |i: u32| {
                let e = self.rows[&(i / 2)];
                if i % 2 == 1 {
                    (e >> 32) as u32
                } else {
                    e as u32
                }
            };
            let lo = (vaddr & 0xffff) as u32;
            let last = (first..first + count).rev().find(|&i| row(i) >> 16 <= lo)?;
            Some(self.rules[&(row(last) & 0xffff)])
        }
    }

    fn rule(off: i32) -> Rule {
        Rule { kind: kind::CFA_RSP, rbp: rbp::SAME, rbp_offset: 0, cfa_offset: off }
    }

    /// A table of `rows` rows in page 1, rule offsets `base + i`.
    fn table(rows: u32, base: i32) -> CompactTable {
        CompactTable {
            rules: (0..rows).map(|i| rule(base + i as i32)).collect(),
            pages: vec![Page { page: 1, first: 0, count: rows }],
            rows: (0..rows).map(|i| (i * 16) << 16 | i).collect(),
        }
    }

    fn key(n: u8) -> TableKey {
        TableKey::BuildId(Arc::from(format!("{n:02x}")))
    }

    #[test]
    fn loads_remap_rules_and_read_back() {
        let now = Instant::now();
        let mut sink = MemSink::default();
        let mut s = TableStore::new(1 << 20, 1 << 17, 1024, 64);
        let a = s.load(key(1), &table(5, 8), &mut sink, now).unwrap();
        let b = s.load(key(2), &table(3, 10), &mut sink, now).unwrap();
        assert_ne!(a, b);
        // Table b shares rules 10 and 11 with a (ids 2, 3) and adds none.
        assert_eq!(sink.rules.len(), 5);
        for i in 0..5u64 {
            assert_eq!(sink.rule_at(a, 0x10000 + i * 16 + 3), Some(rule(8 + i as i32)));
        }
        for i in 0..3u64 {
            assert_eq!(sink.rule_at(b, 0x10000 + i * 16), Some(rule(10 + i as i32)));
        }
        assert_eq!(s.bytes(), (3 * 8 + 16) + (2 * 8 + 16));
    }

    #[test]
    fn evicts_the_least_recently_used() {
        let t0 = Instant::now();
        let mut sink = MemSink::default();
        // Room for two tables of 100 rows (50 elements + one page each).
        let mut s = TableStore::new(2 * (50 * 8 + 16), 1000, 1024, 1000);
        let a = s.load(key(1), &table(100, 0), &mut sink, t0).unwrap();
        let b = s.load(key(2), &table(100, 0), &mut sink, t0 + Duration::from_secs(1)).unwrap();
        s.touch(a, t0 + Duration::from_secs(2));
        // a was used after b was loaded: b goes although a is older.
        let c = s.load(key(3), &table(100, 0), &mut sink, t0 + Duration::from_secs(3)).unwrap();
        assert_eq!(s.id(&key(2)), None);
        assert!(!sink.pages.contains_key(&(b, 1)));
        assert_eq!(s.take_evicted(), vec![key(2)]);
        s.touch(c, t0 + Duration::from_secs(4));
        // Now a is the least recently used.
        s.load(key(4), &table(100, 0), &mut sink, t0 + Duration::from_secs(5)).unwrap();
        assert_eq!(s.id(&key(1)), None);
        assert!(!sink.pages.contains_key(&(a, 1)));
        assert_eq!(s.take_evicted(), vec![key(1)]);
        assert_eq!(s.id(&key(3)), Some(c));
        assert_eq!(s.evictions, 2);
        // Too large on its own.
        assert_eq!(s.load(key(5), &table(300, 0), &mut sink, t0).unwrap_err(), LoadRefused::TooLarge);
        assert!(s.bytes() <= 2 * (50 * 8 + 16));
    }

    #[test]
    fn unused_tables_drop_after_the_grace_and_space_coalesces() {
        let t0 = Instant::now();
        let mut sink = MemSink::default();
        let mut s = TableStore::with_chunks(1 << 20, 300, 300, 1024, 1000);
        sink.chunk_elems = 300;
        s.load(key(1), &table(200, 0), &mut sink, t0).unwrap();
        s.load(key(2), &table(200, 0), &mut sink, t0).unwrap();
        let c = s.load(key(3), &table(200, 0), &mut sink, t0).unwrap();
        s.touch(c, t0 + UNUSED_GRACE / 2);
        assert_eq!(s.drop_unused(t0 + UNUSED_GRACE / 2, &mut sink).len(), 0);
        let mut dropped = s.drop_unused(t0 + UNUSED_GRACE, &mut sink);
        dropped.sort_by_key(|k| format!("{k:?}"));
        assert_eq!(dropped, vec![key(1), key(2)]);
        assert_eq!(s.id(&key(3)), Some(c));
        // a and b were adjacent: 200 elements in one run fit again.
        s.load(key(4), &table(400, 0), &mut sink, t0).unwrap();
        assert!(s.rules.len() <= 1000);
        // The rule dictionary is bounded.
        let mut small = TableStore::new(1 << 20, 1000, 1024, 4);
        assert_eq!(small.load(key(9), &table(5, 0), &mut sink, t0).unwrap_err(), LoadRefused::RulesFull);
    }

    /// A table of `pages` pages of `rows` rows each (page `i + 1`), rule
    /// offsets `i * rows + j`.
    fn paged_table(pages: u32, rows: u32) -> CompactTable {
        CompactTable {
            rules: (0..pages * rows).map(|i| rule(i as i32)).collect(),
            pages: (0..pages).map(|i| Page { page: i + 1, first: i * rows, count: rows }).collect(),
            rows: (0..pages).flat_map(|i| (0..rows).map(move |j| (j * 16) << 16 | (i * rows + j))).collect(),
        }
    }

    #[test]
    fn a_table_larger_than_a_chunk_is_cut_at_pages_and_reads_back() {
        let now = Instant::now();
        // Chunks of 100 elements (200 rows); pages of 75 rows: two pages
        // (150 rows, 75 elements) per piece, the third starts the next.
        let mut sink = MemSink { chunk_elems: 100, ..MemSink::default() };
        let mut s = TableStore::with_chunks(1 << 20, 1000, 100, 1024, 1000);
        let t = paged_table(5, 75);
        let id = s.load(key(1), &t, &mut sink, now).unwrap();
        for i in 0..5u64 {
            for j in [0u64, 1, 37, 74] {
                let vaddr = ((i + 1) << 16) + j * 16 + 5;
                assert_eq!(sink.rule_at(id, vaddr), Some(rule((i * 75 + j) as i32)), "page {i} row {j}");
            }
            // No page's rows cross a chunk (200 rows each).
            let (first, count) = sink.pages[&(id, i as u32 + 1)];
            assert_eq!(first / 200, (first + count - 1) / 200, "page {i} at rows {first}..+{count}");
        }
        // Three pieces: 75 + 75 + 38 elements (75, 75 | 75, 75 | 75 rows).
        assert_eq!(s.bytes(), (75 + 75 + 38) * 8 + 5 * PAGE_ENTRY_BYTES as u64);
        // A page larger than a chunk cannot load.
        let big = paged_table(1, 201);
        assert_eq!(s.load(key(2), &big, &mut sink, now).unwrap_err(), LoadRefused::TooLarge);
    }

    #[test]
    fn a_chunk_goes_back_when_its_last_table_does() {
        let t0 = Instant::now();
        let mut sink = MemSink { chunk_elems: 100, ..MemSink::default() };
        let mut s = TableStore::with_chunks(1 << 20, 400, 100, 1024, 1000);
        // a and b share chunk 0 (40 elements each); c (60) goes to chunk 1.
        s.load(key(1), &table(80, 0), &mut sink, t0).unwrap();
        s.load(key(2), &table(80, 0), &mut sink, t0).unwrap();
        s.load(key(3), &table(120, 0), &mut sink, t0 + Duration::from_secs(5)).unwrap();
        assert!(sink.released.is_empty());
        let b = s.id(&key(2)).unwrap();
        s.touch(b, t0 + Duration::from_secs(5));
        // a goes: chunk 0 still holds b.
        assert_eq!(s.drop_unused(t0 + UNUSED_GRACE, &mut sink), vec![key(1)]);
        assert!(sink.released.is_empty());
        // b and c go: both chunks are given back.
        let mut dropped = s.drop_unused(t0 + UNUSED_GRACE * 2, &mut sink);
        dropped.sort_by_key(|k| format!("{k:?}"));
        assert_eq!(dropped, vec![key(2), key(3)]);
        sink.released.sort();
        assert_eq!(sink.released, vec![0, 1]);
        assert_eq!(s.bytes(), 0);
        // The space is whole again, chunk by chunk: a 100-element table fits.
        s.load(key(4), &table(200, 0), &mut sink, t0).unwrap();
    }
}
