//! One module's symbols, held compactly: sorted 32-bit offsets from the
//! module's base and the names front-coded in blocks.
//!
//! Names sorted by address share long prefixes (`ext4_`, `tcp_v4_`, a
//! function and its `.cold` part), so each name but a block's first is kept
//! as the length it shares with the one before plus the rest: ~17 bytes per
//! name instead of ~23 here, and one 32-bit index per block of [`BLOCK`]
//! names instead of one per name. A lookup decodes at most [`BLOCK`] names
//! into the caller's [`NameBuf`]; no per-name allocation and no
//! name -> address map (the rare name lookup scans).

use std::fmt;

/// Longest name kept; longer ones are cut (at a char boundary) so the
/// length fits the one-byte prefix.
pub const MAX_NAME: usize = 255;

/// Names per front-coding block: a lookup decodes at most this many; 8
/// keeps that to a few cache lines and the block index to 0.5 B per name.
const BLOCK: usize = 4;

/// Symbols per bucket of the address index, on average: the index costs
/// 0.5 B per symbol and leaves a search of a few offsets.
const PER_BUCKET: usize = 8;

/// Bytes after the last name, so a decode can copy in fixed 16-byte chunks.
const SLACK: usize = 16;

/// Room for one decoded name (and the slack of the last chunk copied).
pub struct NameBuf([u8; MAX_NAME + SLACK]);

impl NameBuf {
    pub fn new() -> Self {
        NameBuf([0; MAX_NAME + SLACK])
    }
}

impl Default for NameBuf {
    fn default() -> Self {
        Self::new()
    }
}

/// A symbol's name in its table, decoded when asked for: a lookup itself
/// copies no bytes.
#[derive(Clone, Copy)]
pub struct SymName<'a> {
    table: &'a SymbolTable,
    i: u32,
}

impl<'a> SymName<'a> {
    /// The symbol's index in its table: the same index in the same table
    /// is the same name.
    pub fn index(&self) -> u32 {
        self.i
    }

    /// Decodes the name into `buf`.
    #[inline]
    pub fn decode<'b>(&self, buf: &'b mut NameBuf) -> &'b str {
        let len = self.table.decode(self.i as usize, &mut buf.0);
        let bytes = &buf.0[..len];
        debug_assert!(std::str::from_utf8(bytes).is_ok());
        // SAFETY: tables store only `&str` names cut at char boundaries; a
        // decode puts back exactly the bytes of the stored name (a shared
        // prefix is the previous name's bytes where both agree).
        unsafe { std::str::from_utf8_unchecked(bytes) }
    }
}

impl fmt::Display for SymName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.decode(&mut NameBuf::new()))
    }
}

impl fmt::Debug for SymName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.decode(&mut NameBuf::new()), f)
    }
}

impl PartialEq<str> for SymName<'_> {
    fn eq(&self, other: &str) -> bool {
        self.decode(&mut NameBuf::new()) == other
    }
}

impl PartialEq<&str> for SymName<'_> {
    fn eq(&self, other: &&str) -> bool {
        self.decode(&mut NameBuf::new()) == *other
    }
}

/// Immutable symbol table of one module (or vmlinux).
#[derive(Debug, Default, Clone)]
pub struct SymbolTable {
    base: u64,
    offsets: Box<[u32]>,
    /// Bucket `b` holds offsets `b << shift .. (b + 1) << shift`; `first[b]`
    /// is the symbol covering the bucket's start, so the symbol covering any
    /// offset in it is among `first[b] ..= first[b + 1]`.
    first: Box<[u32]>,
    shift: u32,
    /// Where in `names` block `b` (names `b * BLOCK ..`) starts.
    block_at: Box<[u32]>,
    /// A block's first name as `len, bytes`; every other as `shared, rest
    /// len, rest bytes`, `shared` bytes taken from the name before it.
    names: Box<[u8]>,
    /// Bit i: symbol i has `__pfx_` padding right before it, so nothing
    /// returns to its first byte (a call ending the previous function
    /// returns into the padding).
    padded: Box<[u64]>,
}

impl SymbolTable {
    /// Lowest symbol address; offsets are relative to it.
    pub fn base(&self) -> u64 {
        self.base
    }

    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// Address of the last symbol (the table's end is not known from kallsyms).
    pub fn last_addr(&self) -> u64 {
        self.offsets.last().map_or(self.base, |&o| self.base + u64::from(o))
    }

    /// Offset of `addr` from the base, if it can be in this table.
    #[inline]
    fn rel(&self, addr: u64) -> Option<u32> {
        u32::try_from(addr.checked_sub(self.base)?).ok()
    }

    /// Index of the last symbol at or below `rel`: its bucket, then a
    /// search of the few offsets the bucket spans.
    #[inline]
    fn covering(&self, rel: u32) -> Option<usize> {
        // Past the last bucket the last symbol covers it.
        let b = ((rel >> self.shift) as usize).min(self.first.len().checked_sub(2)?);
        let (lo, hi) = (self.first[b], self.first[b + 1]);
        let (lo, hi) = (lo as usize, hi as usize);
        let span = &self.offsets[lo..=hi];
        // A bucket's few offsets are counted without branches (sorted, so
        // the count of those <= rel is the partition point); a crowded
        // bucket is searched.
        let below = if span.len() <= 16 {
            span.iter().map(|&o| usize::from(o <= rel)).sum()
        } else {
            span.partition_point(|&o| o <= rel)
        };
        let i = lo + below;
        // offsets[0] == 0 <= rel, so some symbol is at or below it.
        Some(i - 1)
    }

    /// The symbol covering `addr` (the last one at or below it) and the
    /// distance from its start.
    #[inline]
    pub fn lookup(&self, addr: u64) -> Option<(SymName<'_>, u64)> {
        let rel = self.rel(addr)?;
        let i = self.covering(rel)?;
        Some((SymName { table: self, i: i as u32 }, u64::from(rel - self.offsets[i])))
    }

    /// Whether `addr` is the first byte of a function with padding before
    /// it: then it is not a return address, but the address itself (an
    /// interrupted instruction, a jump target).
    #[inline]
    pub(crate) fn padded_start(&self, addr: u64) -> bool {
        let Some(rel) = self.rel(addr) else { return false };
        match self.covering(rel) {
            Some(i) if self.offsets[i] == rel => self.padded.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1),
            _ => false,
        }
    }

    /// Start address of the symbol covering `addr`.
    pub(crate) fn symbol_start(&self, addr: u64) -> Option<u64> {
        let i = self.covering(self.rel(addr)?)?;
        Some(self.base + u64::from(self.offsets[i]))
    }

    /// Decodes name `i` into `buf` (its block's first name, then the names
    /// after it up to `i`) and returns its length.
    #[inline]
    fn decode(&self, i: usize, buf: &mut [u8; MAX_NAME + SLACK]) -> usize {
        let mut at = self.block_at[i / BLOCK] as usize;
        let mut len = 0;
        at = copy_rest(&self.names, at + 1, usize::from(self.names[at]), buf, &mut len);
        for _ in 0..i % BLOCK {
            let shared = usize::from(self.names[at]);
            len = shared;
            at = copy_rest(&self.names, at + 2, usize::from(self.names[at + 1]), buf, &mut len);
        }
        len
    }

    /// Address of a symbol by name: a linear scan, used only by tools and tests.
    pub fn find(&self, name: &str) -> Option<u64> {
        self.iter().find(|(_, n)| n == name).map(|(a, _)| a)
    }

    /// (address, name) of every symbol, in address order (allocates each
    /// name: for tools and tests).
    pub fn iter(&self) -> impl Iterator<Item = (u64, String)> + '_ {
        let mut buf = NameBuf::new();
        (0..self.len()).map(move |i| {
            let name = SymName { table: self, i: i as u32 }.decode(&mut buf).to_owned();
            (self.base + u64::from(self.offsets[i]), name)
        })
    }

    /// Heap bytes held by this table.
    pub fn heap_bytes(&self) -> usize {
        (self.offsets.len() + self.first.len() + self.block_at.len()) * 4 + self.names.len() + self.padded.len() * 8
    }
}

/// Appends the `n` bytes at `names[at..]` to `buf[*len..]` and returns
/// where the next name starts. Copies whole 16-byte chunks: `names` ends in
/// [`SLACK`] spare bytes and `buf` has room for them, so the chunks never
/// need a length check of their own (names are short: usually one chunk).
#[inline(always)]
fn copy_rest(names: &[u8], at: usize, n: usize, buf: &mut [u8; MAX_NAME + SLACK], len: &mut usize) -> usize {
    let mut k = 0;
    while k < n {
        let (from, to) = (at + k, *len + k);
        buf[to..to + SLACK].copy_from_slice(&names[from..from + SLACK]);
        k += SLACK;
    }
    *len += n;
    at + n
}

/// The architecture's own syscall entry prefix; other entries to the same
/// body (`__ia32_sys_*`, `__do_sys_*`) lose to it.
#[cfg(target_arch = "x86_64")]
const ARCH_SYSCALL: &str = "__x64_sys_";
#[cfg(target_arch = "aarch64")]
const ARCH_SYSCALL: &str = "__arm64_sys_";
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const ARCH_SYSCALL: &str = "sys_";

/// Prefix of the position-independent aliases of early-boot code.
const PI_ALIAS: &str = "__pi_";

/// How much a symbol is preferred when several share one address; higher
/// wins, and the first seen wins among equals. Perf's tie-break
/// (`choose_best_symbol`), with three documented departures:
///
/// 1. a real name over the `init_module` / `cleanup_module` aliases;
/// 2. non-weak over weak (`T t` over `W w`);
/// 3. global over local (`T` over `t`, `W` over `w`);
/// 4. departure: not a `__pi_` alias (`memcpy`, `__x86_indirect_thunk_rax`
///    over `__pi_memcpy`, `__pi___x86_indirect_thunk_rax`: the alias exists
///    for early boot code and is never what ran later);
/// 5. departure: the architecture's own syscall entry (`__x64_sys_getppid`
///    over `__ia32_sys_getppid`, where perf's longer-name rule picks the
///    compat entry on an x86-64 call path);
/// 6. fewer leading underscores;
/// 7. departure: not a range marker (a name ending `_start`, `_end` or
///    `_array`) over one (`__x86_indirect_thunk_rax` over
///    `__x86_indirect_thunk_array`, a static call trampoline over
///    `__static_call_text_start`);
/// 8. the longer name.
pub fn rank(kind: u8, name: &str) -> u32 {
    rank_bytes(kind, name.as_bytes())
}

/// [`rank`] of a name's bytes.
fn rank_bytes(kind: u8, name: &[u8]) -> u32 {
    let real = !matches!(name, b"init_module" | b"cleanup_module");
    let non_weak = matches!(kind, b'T' | b't');
    let global = kind.is_ascii_uppercase();
    let not_pi = !name.starts_with(PI_ALIAS.as_bytes());
    let arch_syscall = name.starts_with(ARCH_SYSCALL.as_bytes());
    let underscores = name.iter().take_while(|&&b| b == b'_').count().min(15) as u32;
    let not_marker = !(name.ends_with(b"_start") || name.ends_with(b"_end") || name.ends_with(b"_array"));
    let len = name.len().min(255) as u32;
    (u32::from(real) << 31)
        | (u32::from(non_weak) << 30)
        | (u32::from(global) << 29)
        | (u32::from(not_pi) << 28)
        | (u32::from(arch_syscall) << 27)
        | ((15 - underscores) << 23)
        | (u32::from(not_marker) << 22)
        | (len << 14)
}

/// One candidate symbol while building; borrows its name from the source.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    pub addr: u64,
    pub rank: u32,
    pub name: &'a str,
    /// A `__pfx_` padding symbol precedes it.
    pub padded: bool,
}

/// Counts of what building dropped.
#[derive(Debug, Default, Clone, Copy)]
pub struct BuildStats {
    /// Losers among several symbols at one address.
    pub aliases: u64,
    /// Names longer than [`MAX_NAME`], kept cut.
    pub truncated: u64,
    /// Symbols more than 4 GiB above the lowest one (cannot be a u32 offset).
    pub(crate) out_of_range: u64,
}

/// An address lower than the one before it: [`TableBuilder`] takes
/// symbols in address order only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unsorted;

/// How a symbol's alias rank is known: computed already, or from its
/// kallsyms type, computed only if another symbol shares its address.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rank {
    Of(u32),
    Kind(u8),
}

impl Rank {
    fn value(self, name: &[u8]) -> u32 {
        match self {
            Rank::Of(r) => r,
            Rank::Kind(k) => rank_bytes(k, name),
        }
    }
}

/// The symbol stored last: another at its address may still replace it.
#[derive(Clone, Copy)]
struct Last {
    addr: u64,
    rank: Rank,
    /// Stored (not dropped as out of range).
    kept: bool,
    /// Its name was cut to [`MAX_NAME`].
    cut: bool,
    /// Where its record starts in `names`.
    at: usize,
}

/// Builds a table from symbols pushed in address order, straight into its
/// final layout: no list of entries, no sort. Each symbol is stored as it
/// comes; one with the address of the symbol before it replaces that
/// symbol's name if it ranks higher (its record is the last one written).
/// Names are copied in, so the text they come from may change between
/// pushes (the file is read in chunks).
pub(crate) struct TableBuilder {
    base: u64,
    offsets: Vec<u32>,
    block_at: Vec<u32>,
    names: Vec<u8>,
    padded: Vec<u64>,
    /// The name stored last, which the next one is front-coded against.
    prev: Vec<u8>,
    last: Option<Last>,
    stats: BuildStats,
}

impl TableBuilder {
    pub(crate) fn is_empty(&self) -> bool {
        self.last.is_none()
    }

    /// `symbols`: how many are expected (a capacity hint).
    pub(crate) fn with_capacity(symbols: usize) -> Self {
        TableBuilder {
            base: 0,
            offsets: Vec::with_capacity(symbols),
            block_at: Vec::with_capacity(symbols / BLOCK + 1),
            names: Vec::with_capacity(symbols * 18 + SLACK),
            padded: Vec::with_capacity(symbols / 64 + 1),
            prev: Vec::with_capacity(MAX_NAME),
            last: None,
            stats: BuildStats::default(),
        }
    }

    /// Adds one symbol; of several at one address the best ranked stays
    /// (the first among equals).
    #[inline]
    pub(crate) fn push(&mut self, addr: u64, rank: Rank, name: &str, padded: bool) -> Result<(), Unsorted> {
        match self.last {
            None => {
                self.base = addr;
                self.store(addr, rank, name, padded);
            }
            Some(l) if l.addr == addr => self.alias(l, rank, name, padded),
            Some(l) if l.addr < addr => self.store(addr, rank, name, padded),
            Some(_) => return Err(Unsorted),
        }
        Ok(())
    }

    #[inline]
    fn store(&mut self, addr: u64, rank: Rank, name: &str, padded: bool) {
        let Ok(off) = u32::try_from(addr - self.base) else {
            self.stats.out_of_range += 1;
            self.last = Some(Last { addr, rank, kept: false, cut: false, at: 0 });
            return;
        };
        let i = self.offsets.len();
        if i.is_multiple_of(64) {
            self.padded.push(0);
        }
        if padded {
            self.padded[i / 64] |= 1 << (i % 64);
        }
        self.offsets.push(off);
        let at = self.names.len();
        if i.is_multiple_of(BLOCK) {
            self.block_at.push(at as u32);
        }
        let (stored, rank, cut) = self.cut(rank, name);
        self.write_name(i, stored);
        self.last = Some(Last { addr, rank, kept: true, cut, at });
    }

    /// `name` cut to [`MAX_NAME`]; a cut name's rank is taken from the
    /// whole name now, since only the cut one is kept.
    #[inline]
    fn cut<'n>(&mut self, rank: Rank, name: &'n str) -> (&'n [u8], Rank, bool) {
        if name.len() <= MAX_NAME {
            return (name.as_bytes(), rank, false);
        }
        let rank = Rank::Of(rank.value(name.as_bytes()));
        (truncate(name, &mut self.stats.truncated).as_bytes(), rank, true)
    }

    /// Appends name `i`'s record, front-coded against `prev` (name `i - 1`)
    /// unless it starts a block, and makes it `prev`.
    #[inline]
    fn write_name(&mut self, i: usize, name: &[u8]) {
        let (shared, header) = if i.is_multiple_of(BLOCK) {
            (0, 1)
        } else {
            let shared = shared_prefix(&self.prev, name);
            (shared, 2)
        };
        let rest = &name[shared..];
        // A block's first name: `len`; any other: `shared, rest len`.
        let (h0, h1) = if header == 1 { (name.len() as u8, 0) } else { (shared as u8, rest.len() as u8) };
        append_record(&mut self.names, header, [h0, h1], rest);
        self.prev.truncate(shared);
        append_short(&mut self.prev, rest);
    }

    /// Another symbol at the address of the one stored last.
    #[cold]
    fn alias(&mut self, mut l: Last, rank: Rank, name: &str, padded: bool) {
        self.stats.aliases += 1;
        if !l.kept {
            // Dropped as out of range, and so is any other at its address.
            return;
        }
        let i = self.offsets.len() - 1;
        if padded {
            self.padded[i / 64] |= 1 << (i % 64);
        }
        let (old, new) = (l.rank.value(&self.prev), rank.value(name.as_bytes()));
        l.rank = Rank::Of(old.max(new));
        if new > old {
            // Rewrite the last record: back to the name before it, which
            // the new one is front-coded against.
            self.names.truncate(l.at);
            if l.cut {
                self.stats.truncated -= 1;
            }
            if !i.is_multiple_of(BLOCK) {
                self.decode_prev(i - 1);
            }
            let (stored, _, cut) = self.cut(rank, name);
            self.write_name(i, stored);
            l.cut = cut;
        }
        self.last = Some(l);
    }

    /// Decodes stored name `i` into `prev` (rare: only when an alias
    /// replaces the name after it).
    fn decode_prev(&mut self, i: usize) {
        let names = &self.names;
        let mut at = self.block_at[i / BLOCK] as usize;
        let len = usize::from(names[at]);
        self.prev.clear();
        self.prev.extend_from_slice(&names[at + 1..at + 1 + len]);
        at += 1 + len;
        for _ in 0..i % BLOCK {
            let (shared, n) = (usize::from(names[at]), usize::from(names[at + 1]));
            self.prev.truncate(shared);
            self.prev.extend_from_slice(&names[at + 2..at + 2 + n]);
            at += 2 + n;
        }
    }

    pub(crate) fn finish(mut self, stats: &mut BuildStats) -> SymbolTable {
        stats.aliases += self.stats.aliases;
        stats.truncated += self.stats.truncated;
        stats.out_of_range += self.stats.out_of_range;
        self.names.extend_from_slice(&[0; SLACK]);
        let (first, shift) = bucket_index(&self.offsets);
        SymbolTable {
            base: self.base,
            offsets: self.offsets.into_boxed_slice(),
            first: first.into_boxed_slice(),
            shift,
            block_at: self.block_at.into_boxed_slice(),
            names: self.names.into_boxed_slice(),
            padded: self.padded.into_boxed_slice(),
        }
    }
}

/// `dst.extend_from_slice(src)` without a call to `memcpy` for the short
/// slices names are made of ([`copy_short`]).
#[inline(always)]
fn append_short(dst: &mut Vec<u8>, src: &[u8]) {
    append_record(dst, 0, [0, 0], src);
}

/// Appends the first `h` bytes of `header` (0 to 2) and then `src`, with
/// one check of the room left and no call to `memcpy` when `src` is short.
#[inline(always)]
fn append_record(dst: &mut Vec<u8>, h: usize, header: [u8; 2], src: &[u8]) {
    let n = src.len();
    if n > 32 {
        dst.extend_from_slice(&header[..h]);
        dst.extend_from_slice(src);
        return;
    }
    let at = dst.len();
    dst.extend_from_slice(&[0; 34]);
    dst[at..at + 2].copy_from_slice(&header);
    copy_short(&mut dst[at + h..at + h + n], src);
    dst.truncate(at + h + n);
}

/// `dst.copy_from_slice(src)` for up to 32 bytes: two 16-, 8- or 4-byte
/// copies that overlap in the middle (no byte past either slice is read),
/// fewer byte by byte.
#[inline(always)]
fn copy_short(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    debug_assert!(n == dst.len() && n <= 32);
    if n >= 16 {
        dst[..16].copy_from_slice(&src[..16]);
        dst[n - 16..].copy_from_slice(&src[n - 16..]);
    } else if n >= 8 {
        dst[..8].copy_from_slice(&src[..8]);
        dst[n - 8..].copy_from_slice(&src[n - 8..]);
    } else if n >= 4 {
        dst[..4].copy_from_slice(&src[..4]);
        dst[n - 4..].copy_from_slice(&src[n - 4..]);
    } else {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = *s;
        }
    }
}

/// The 8 bytes at `s[i..]`, little-endian.
#[inline(always)]
fn word_at(s: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(s[i..i + 8].try_into().expect("8 bytes"))
}

/// Length of the common prefix of `a` and `b`, compared 8 bytes at a time.
#[inline]
fn shared_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    if (8..=32).contains(&n) {
        // Four words, the last ones moved back to end at `n` (overlapping
        // bytes already found equal), the first difference of each taken
        // without a branch: no loop exit to mispredict.
        let first_diff = |k: usize| {
            let i = (8 * k).min(n - 8);
            let x = word_at(a, i) ^ word_at(b, i);
            if x == 0 {
                n
            } else {
                i + (x.trailing_zeros() / 8) as usize
            }
        };
        return first_diff(0).min(first_diff(1)).min(first_diff(2)).min(first_diff(3));
    }
    let mut i = 0;
    while i + 8 <= n {
        let x = u64::from_le_bytes(a[i..i + 8].try_into().expect("8 bytes"))
            ^ u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if x != 0 {
            return i + (x.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// The bucket index of sorted `offsets` (the first is 0): a power-of-two
/// bucket width giving about [`PER_BUCKET`] symbols per bucket, and for
/// each bucket the symbol covering its start, plus one closing entry.
fn bucket_index(offsets: &[u32]) -> (Vec<u32>, u32) {
    let Some(&last) = offsets.last() else { return (Vec::new(), 0) };
    let want = (offsets.len() / PER_BUCKET).max(1) as u64;
    let mut shift = 0;
    while (u64::from(last) >> shift) + 1 > want {
        shift += 1;
    }
    let buckets = (u64::from(last) >> shift) as usize + 1;
    let mut first = Vec::with_capacity(buckets + 1);
    let mut i = 0usize;
    for b in 0..buckets as u64 {
        let start = b << shift;
        while i + 1 < offsets.len() && u64::from(offsets[i + 1]) <= start {
            i += 1;
        }
        first.push(i as u32);
    }
    first.push(offsets.len() as u32 - 1);
    (first, shift)
}

/// Builds a table from candidate entries (any order, duplicates allowed).
pub fn build(mut entries: Vec<Entry<'_>>, stats: &mut BuildStats) -> SymbolTable {
    // kallsyms is sorted by address already (vmlinux and most modules);
    // otherwise a stable sort keeps first-seen order among equals.
    if !entries.windows(2).all(|w| w[0].addr <= w[1].addr) {
        entries.sort_by_key(|e| e.addr);
    }
    let mut b = TableBuilder::with_capacity(entries.len());
    for e in &entries {
        b.push(e.addr, Rank::Of(e.rank), e.name, e.padded).expect("entries are sorted");
    }
    b.finish(stats)
}

fn truncate<'a>(name: &'a str, truncated: &mut u64) -> &'a str {
    if name.len() <= MAX_NAME {
        return name;
    }
    *truncated += 1;
    let mut end = MAX_NAME;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(addr: u64, kind: u8, name: &str) -> Entry<'_> {
        Entry { addr, rank: rank(kind, name), name, padded: false }
    }

    /// Every length up to 40 on either side and every place of the first
    /// difference.
    #[test]
    fn shared_prefix_at_every_length() {
        let base: Vec<u8> = (0..40u8).map(|i| b'a' + i % 26).collect();
        for la in 0..=40 {
            for lb in 0..=40 {
                for diff in 0..=la.min(lb) {
                    let a = &base[..la];
                    let mut b = base[..lb].to_vec();
                    if diff < lb {
                        b[diff] = b'_';
                    }
                    let want = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
                    assert_eq!(shared_prefix(a, &b), want, "{la} {lb} {diff}");
                }
            }
        }
    }

    #[test]
    fn shared_prefix_counts_equal_leading_bytes() {
        let names: [&[u8]; 8] =
            [b"", b"a", b"ab", b"tcp_v4_rcv", b"tcp_v4_rcv.cold", b"tcp_v4_", b"tcp_v6_rcv", b"abcdefghijklmnopq"];
        for a in names {
            for b in names {
                let want = a.iter().zip(b).take_while(|(x, y)| x == y).count();
                assert_eq!(shared_prefix(a, b), want, "{a:?} {b:?}");
            }
        }
    }

    #[test]
    fn append_short_and_record_append_every_length() {
        let src: Vec<u8> = (0..80u8).collect();
        for n in 0..=80 {
            for pre in [0, 3, 17] {
                let mut d: Vec<u8> = vec![0xee; pre];
                append_short(&mut d, &src[..n]);
                let mut want = vec![0xee; pre];
                want.extend_from_slice(&src[..n]);
                assert_eq!(d, want, "{n} after {pre}");
                for h in 0..=2 {
                    let mut d: Vec<u8> = vec![0xee; pre];
                    append_record(&mut d, h, [0xa1, 0xa2], &src[..n]);
                    let mut want = vec![0xee; pre];
                    want.extend_from_slice(&[0xa1, 0xa2][..h]);
                    want.extend_from_slice(&src[..n]);
                    assert_eq!(d, want, "{n} after {pre}, header {h}");
                }
            }
        }
    }

    /// Lookups agree with a search of the sorted addresses, for sparse
    /// symbols and for buckets crowded past the branch-free count.
    #[test]
    fn lookups_agree_with_a_plain_search() {
        let mut x = 0x9e3779b97f4a7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut addrs: Vec<u64> = (0..2000).map(|_| 0x1000 + next() % 0x10_0000).collect();
        // A crowded run: 200 symbols 2 bytes apart.
        addrs.extend((0..200).map(|k| 0x8_0000 + 2 * k));
        addrs.sort_unstable();
        addrs.dedup();
        let names: Vec<String> = addrs.iter().map(|a| format!("f_{a:x}")).collect();
        let entries = addrs.iter().zip(&names).map(|(&a, n)| e(a, b'T', n)).collect();
        let t = build(entries, &mut BuildStats::default());
        let mut probes: Vec<u64> = addrs.iter().flat_map(|&a| [a - 1, a, a + 1]).collect();
        probes.extend((0..5000).map(|_| next() % 0x12_0000));
        for p in probes {
            let want = addrs.partition_point(|&a| a <= p).checked_sub(1).map(|i| (names[i].clone(), p - addrs[i]));
            assert_eq!(t.lookup(p).map(|(n, o)| (n.to_string(), o)), want, "{p:#x}");
        }
    }

    #[test]
    fn lookup_finds_covering_symbol() {
        let mut st = BuildStats::default();
        let t = build(vec![e(0x2000, b't', "b"), e(0x1000, b'T', "a")], &mut st);
        let at = |a| t.lookup(a).map(|(n, o)| (n.to_string(), o));
        assert_eq!(at(0x0fff), None);
        assert_eq!(at(0x1000), Some(("a".into(), 0)));
        assert_eq!(at(0x1fff), Some(("a".into(), 0xfff)));
        assert_eq!(at(0x2005), Some(("b".into(), 5)));
        assert_eq!(t.find("b"), Some(0x2000));
    }

    #[test]
    fn aliases_prefer_global_and_real_names() {
        let mut st = BuildStats::default();
        let t = build(
            vec![
                e(0x10, b't', "init_module"),
                e(0x10, b't', "local_init"),
                e(0x10, b'T', "global_init"),
                e(0x20, b'T', "cleanup_module"),
                e(0x20, b't', "real_exit"),
            ],
            &mut st,
        );
        assert_eq!(t.lookup(0x10).unwrap().0, "global_init");
        assert_eq!(t.lookup(0x20).unwrap().0, "real_exit");
        assert_eq!(st.aliases, 3);
    }

    /// Tie sets as this kernel lists them (one address, kallsyms order) and
    /// the name each must resolve to.
    #[test]
    fn alias_rule_table() {
        let table: &[(&[(u8, &str)], &str)] = &[
            (
                &[(b't', "__do_sys_getppid"), (b'T', "__ia32_sys_getppid"), (b'T', "__x64_sys_getppid")],
                "__x64_sys_getppid",
            ),
            (&[(b'T', "memcpy"), (b'T', "__memcpy"), (b'T', "__pi_memcpy")], "memcpy"),
            (&[(b'T', "__pi_memcpy"), (b'T', "__memcpy"), (b'T', "memcpy")], "memcpy"),
            (
                &[
                    (b'T', "__pi___x86_indirect_thunk_rax"),
                    (b'T', "__x86_indirect_thunk_array"),
                    (b'T', "__x86_indirect_thunk_rax"),
                ],
                "__x86_indirect_thunk_rax",
            ),
            (&[(b'T', "__pi___x86_return_thunk"), (b'T', "__x86_return_thunk")], "__x86_return_thunk"),
            (
                &[(b'T', "srso_alias_untrain_ret"), (b'T', "_stext"), (b'T', "_text"), (b'T', "__pi__text")],
                "srso_alias_untrain_ret",
            ),
            (&[(b't', "cpu_show_not_affected"), (b'W', "cpu_show_ghostwrite")], "cpu_show_not_affected"),
            (&[(b'T', "clkdev_hw_create"), (b't', "__clk_register_clkdev")], "clkdev_hw_create"),
            (
                &[(b'T', "__SCT__tp_func_initcall_level"), (b'T', "__static_call_text_start")],
                "__SCT__tp_func_initcall_level",
            ),
            (
                &[(b't', "__do_compat_sys_rt_sigreturn"), (b'T', "__ia32_compat_sys_rt_sigreturn")],
                "__ia32_compat_sys_rt_sigreturn",
            ),
            (&[(b'T', "irq_entries_start"), (b'T', "__irqentry_text_start")], "irq_entries_start"),
            (&[(b'w', "local_weak"), (b'W', "global_weak")], "global_weak"),
        ];
        for (set, want) in table {
            let mut st = BuildStats::default();
            let t = build(set.iter().map(|&(k, n)| e(0x100, k, n)).collect(), &mut st);
            assert_eq!(t.lookup(0x100).unwrap().0, *want, "{set:?}");
            assert_eq!(st.aliases as usize, set.len() - 1);
        }
    }

    #[test]
    fn long_names_are_cut_at_char_boundary() {
        let mut st = BuildStats::default();
        let long = format!("{}é", "x".repeat(254));
        let t = build(vec![e(1, b'T', &long)], &mut st);
        assert_eq!(t.lookup(1).unwrap().0.to_string().len(), 254);
        assert_eq!(st.truncated, 1);
    }

    /// Names sharing prefixes of every length (none, some, all, a name
    /// that is a prefix of the next and the reverse, multi-byte chars cut
    /// in the middle of the shared part) across several blocks and buckets:
    /// every address gives back its exact name.
    #[test]
    fn front_coded_names_round_trip() {
        let stems = ["ext4_", "ext4_da_", "tcp_v4_", "é_x", "éa", "", "a"];
        let names: Vec<String> = (0..1000)
            .map(|i| match i % 5 {
                0 => format!("{}{}", stems[i % stems.len()], i / 3),
                1 => format!("{}{}.cold", stems[i % stems.len()], i / 3),
                2 => stems[i % stems.len()].to_owned() + "z",
                3 => format!("{}é{}", "y".repeat(i % 300), i),
                _ => format!("f{i}"),
            })
            .collect();
        let mut st = BuildStats::default();
        let entries = names.iter().enumerate().map(|(i, n)| e(0x1000 + 16 * i as u64, b'T', n)).collect();
        let t = build(entries, &mut st);
        assert_eq!(t.len(), names.len());
        let want: Vec<String> = names.iter().map(|n| truncate(n, &mut 0).to_owned()).collect();
        for (i, n) in want.iter().enumerate() {
            let a = 0x1000 + 16 * i as u64;
            let (got, off) = t.lookup(a + 3).unwrap();
            assert_eq!((got.to_string(), off), (n.clone(), 3), "symbol {i}");
            assert_eq!(t.symbol_start(a + 15), Some(a));
        }
        let listed: Vec<String> = t.iter().map(|(_, n)| n.to_string()).collect();
        assert_eq!(listed, want);
        for i in [0, 7, 8, 63, 64, 777, 999] {
            let first = want.iter().position(|n| *n == want[i]).unwrap() as u64;
            assert_eq!(t.find(&want[i]), Some(0x1000 + 16 * first));
        }
        assert!(st.truncated > 0);
    }

    #[test]
    fn padded_bits_and_exact_starts() {
        let mut st = BuildStats::default();
        let entries =
            (0..200u64).map(|i| Entry { addr: 0x100 * (i + 1), rank: 0, name: "f", padded: i % 3 == 0 }).collect();
        let t = build(entries, &mut st);
        for i in 0..200u64 {
            let a = 0x100 * (i + 1);
            assert_eq!(t.padded_start(a), i % 3 == 0, "{i}");
            assert!(!t.padded_start(a + 1));
        }
        assert!(!t.padded_start(0x10));
    }

    /// An alias that outranks the symbol stored last rewrites its name, at
    /// every position in a block (a block's first name, front-coded ones
    /// sharing prefixes with the names around them), and the names after
    /// it are front-coded against the new one; one that loses changes
    /// nothing but the counts; padding marks carry over.
    #[test]
    fn builder_aliases_rewrite_the_last_name() {
        for pos in 0..9usize {
            let names: Vec<String> = (0..9).map(|k| format!("ext4_fn_{}{k}", "a".repeat(k))).collect();
            let mut b = TableBuilder::with_capacity(0);
            let mut want = Vec::new();
            for (k, n) in names.iter().enumerate() {
                let addr = 0x100 + 0x10 * k as u64;
                b.push(addr, Rank::Kind(b't'), n, false).unwrap();
                if k == pos {
                    // Loses (weak), wins (global, padded), loses (local).
                    b.push(addr, Rank::Kind(b'w'), "ext4_fn_weak_one", false).unwrap();
                    b.push(addr, Rank::Kind(b'T'), "ext4_fn_global", true).unwrap();
                    b.push(addr, Rank::Kind(b't'), "ext4_fn_local_again", false).unwrap();
                    want.push((addr, "ext4_fn_global".to_string()));
                } else {
                    want.push((addr, n.clone()));
                }
            }
            let mut st = BuildStats::default();
            let t = b.finish(&mut st);
            assert_eq!(t.iter().collect::<Vec<_>>(), want, "alias at {pos}");
            assert_eq!(st.aliases, 3);
            for k in 0..9u64 {
                assert_eq!(t.padded_start(0x100 + 0x10 * k), k as usize == pos, "{pos} {k}");
            }
        }
    }

    /// A cut name replaced by an alias is no longer counted as cut; one
    /// that replaces a name is; symbols out of range are dropped with
    /// their aliases.
    #[test]
    fn builder_counts_cut_and_out_of_range_aliases() {
        let (long_w, long_t) = (format!("w{}", "x".repeat(300)), format!("t{}", "y".repeat(300)));
        let mut b = TableBuilder::with_capacity(0);
        b.push(0x10, Rank::Kind(b'W'), &long_w, false).unwrap();
        b.push(0x10, Rank::Kind(b'T'), "strong", false).unwrap();
        b.push(0x20, Rank::Kind(b'T'), "short", false).unwrap();
        b.push(0x20, Rank::Kind(b'T'), &long_t, false).unwrap();
        b.push(0x10 + (1 << 32), Rank::Kind(b'T'), "far", false).unwrap();
        b.push(0x10 + (1 << 32), Rank::Kind(b'T'), "far_alias", false).unwrap();
        let mut st = BuildStats::default();
        let t = b.finish(&mut st);
        let names: Vec<String> = t.iter().map(|(_, n)| n).collect();
        assert_eq!(names, vec!["strong".to_string(), long_t[..MAX_NAME].to_string()]);
        assert_eq!((st.aliases, st.truncated, st.out_of_range), (3, 1, 1));
    }

    #[test]
    fn builder_refuses_a_lower_address() {
        let mut b = TableBuilder::with_capacity(2);
        b.push(0x20, Rank::Kind(b'T'), "b", false).unwrap();
        assert_eq!(b.push(0x10, Rank::Kind(b'T'), "a", false), Err(Unsorted));
    }
}
