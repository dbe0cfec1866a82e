//! Parser of /proc/kallsyms text into per-module [`SymbolTable`]s.
//!
//! Line format (kernel/kallsyms.c): `ADDR TYPE NAME[\t[MODULE]]`. Only text
//! symbols (T t W w) are kept; `__pfx_` padding symbols are skipped so no
//! address resolves to padding; `[bpf]` lines are returned apart, because
//! BPF programs are tracked by their own source of truth.

use rustc_hash::FxHashMap;

use super::table::{self, BuildStats, Entry, Rank, SymbolTable, TableBuilder, Unsorted};

/// Prefix of the CONFIG_FUNCTION_PADDING symbols placed before functions.
const PFX: &str = "__pfx_";

/// What to build from a kallsyms read.
pub struct ParseOptions<'f> {
    /// Skip vmlinux lines (its table never changes after boot).
    pub vmlinux: bool,
    /// Whether to build the table of a named module; unchanged modules keep
    /// the table they have.
    pub module: &'f dyn Fn(&str) -> bool,
}

impl Default for ParseOptions<'_> {
    fn default() -> Self {
        ParseOptions { vmlinux: true, module: &|_| true }
    }
}

/// A `[bpf]` line: a JIT-ed BPF function whose length kallsyms does not say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BpfLine {
    pub addr: u64,
    pub name: Box<str>,
}

/// Counts of what one parse saw and dropped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ParseStats {
    pub lines: u64,
    /// Symbols in the built tables.
    pub symbols: u64,
    pub pfx_skipped: u64,
    /// Data and other non-text symbols.
    pub non_text: u64,
    /// Lines with missing fields, bad hex, bad UTF-8, or blank.
    pub malformed: u64,
    pub truncated: u64,
    pub aliases: u64,
    pub(crate) out_of_range: u64,
    /// Lines of modules not rebuilt because they did not change.
    pub unchanged: u64,
    /// Text lines whose address reads as 0 (kallsyms read without privilege).
    pub(crate) zero_addr: u64,
}

/// Result of one parse.
#[derive(Debug, Default)]
pub struct Parsed {
    pub vmlinux: Option<SymbolTable>,
    /// Module name and its table, in order of first appearance.
    pub modules: Vec<(Box<str>, SymbolTable)>,
    pub bpf: Vec<BpfLine>,
    pub stats: ParseStats,
    /// Time spent reading the file ([`read_and_parse`]; 0 from [`parse`]).
    pub(crate) read_ns: u64,
}

/// Parses kallsyms text. Never fails: bad lines are counted and skipped.
///
/// vmlinux's table is built as its lines stream by (kallsyms lists it in
/// address order); each module's symbols are collected and sorted (a
/// module lists them in its symbol table's order). If vmlinux's lines are
/// not in order the text is parsed again, collecting every table.
pub fn parse(text: &[u8], opts: &ParseOptions<'_>) -> Parsed {
    let hint = text.len() / BYTES_PER_SYMBOL;
    let mut p = Parser::new(opts, true, hint);
    if p.feed(text).is_ok() {
        return p.finish();
    }
    let mut p = Parser::new(opts, false, hint);
    p.feed(text).expect("collecting tables accepts any order");
    p.finish()
}

/// Reads and parses a kallsyms file ([`parse`]) without holding its whole
/// text: it is read in chunks into one buffer, each chunk's whole lines
/// parsed while they are still in cache, so the read allocates a fixed
/// 256 KiB instead of the file's size (~5 MiB, grown by doubling for
/// /proc, whose size reads as 0). If vmlinux's lines are not in address
/// order the file is read again whole and parsed by [`parse`].
pub fn read_and_parse(path: &std::path::Path, opts: &ParseOptions<'_>) -> std::io::Result<Parsed> {
    let file = std::fs::File::open(path)?;
    let hint = file.metadata().map_or(0, |m| m.len() as usize);
    match parse_reader(file, opts, CHUNK, hint)? {
        Ok(parsed) => Ok(parsed),
        Err(Unsorted) => {
            let t = std::time::Instant::now();
            let text = std::fs::read(path)?;
            let read_ns = t.elapsed().as_nanos() as u64;
            Ok(Parsed { read_ns, ..parse(&text, opts) })
        }
    }
}

/// Bytes read per chunk: fits the L2 cache with the tables being built.
const CHUNK: usize = 256 << 10;

/// About one kept symbol per 85 bytes of kallsyms text.
const BYTES_PER_SYMBOL: usize = 85;

/// The size assumed for a file whose size reads as 0 (/proc): a capacity
/// hint only, what is not used is given back when the tables are built.
const UNKNOWN_SIZE: usize = 8 << 20;

/// [`read_and_parse`] from any reader, `chunk` bytes at a time (a line
/// longer than that grows the buffer); `Err(Unsorted)` when vmlinux's
/// lines are out of address order. `size`: the expected size, 0 if not
/// known.
fn parse_reader(
    mut r: impl std::io::Read,
    opts: &ParseOptions<'_>,
    chunk: usize,
    size: usize,
) -> std::io::Result<Result<Parsed, Unsorted>> {
    let size = if size == 0 { UNKNOWN_SIZE } else { size };
    let mut p = Parser::new(opts, true, size / BYTES_PER_SYMBOL);
    let mut buf = vec![0u8; chunk.max(1)];
    let mut filled = 0;
    let mut read_ns = 0u64;
    loop {
        if filled == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        let t = std::time::Instant::now();
        let n = match r.read(&mut buf[filled..]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        read_ns += t.elapsed().as_nanos() as u64;
        if n == 0 {
            // The last line, which may have no newline.
            if let Err(u) = p.feed(&buf[..filled]) {
                return Ok(Err(u));
            }
            break;
        }
        filled += n;
        // Whole lines only: the rest moves to the front for the next read.
        let Some(last) = memchr::memrchr(b'\n', &buf[filled - n..filled]).map(|i| filled - n + i) else {
            continue;
        };
        if let Err(u) = p.feed(&buf[..=last]) {
            return Ok(Err(u));
        }
        buf.copy_within(last + 1..filled, 0);
        filled -= last + 1;
    }
    let mut parsed = p.finish();
    parsed.read_ns = read_ns;
    Ok(Ok(parsed))
}

/// One table being built: streamed straight into its layout, or its
/// symbols collected (names copied) to be sorted.
enum Acc {
    Stream(TableBuilder),
    Collect(Collected),
}

/// A table's symbols as they came, names copied into one string.
#[derive(Default)]
struct Collected {
    /// Address, rank, end of the name in `names` (it starts where the one
    /// before ends), padded.
    entries: Vec<(u64, u32, usize, bool)>,
    names: String,
}

impl Acc {
    fn new(stream: bool, capacity: usize) -> Self {
        if stream {
            Acc::Stream(TableBuilder::with_capacity(capacity))
        } else {
            Acc::Collect(Collected::default())
        }
    }

    #[inline(always)]
    fn push(&mut self, addr: u64, kind: u8, name: &str, padded: bool) -> Result<(), Unsorted> {
        match self {
            Acc::Stream(b) => b.push(addr, Rank::Kind(kind), name, padded),
            Acc::Collect(c) => {
                c.names.push_str(name);
                c.entries.push((addr, table::rank(kind, name), c.names.len(), padded));
                Ok(())
            }
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Acc::Stream(b) => b.is_empty(),
            Acc::Collect(c) => c.entries.is_empty(),
        }
    }

    fn finish(self, stats: &mut BuildStats) -> SymbolTable {
        match self {
            Acc::Stream(b) => b.finish(stats),
            Acc::Collect(c) => {
                let mut start = 0;
                let entries = c
                    .entries
                    .iter()
                    .map(|&(addr, rank, end, padded)| {
                        let name = &c.names[start..end];
                        start = end;
                        Entry { addr, rank, name, padded }
                    })
                    .collect();
                table::build(entries, stats)
            }
        }
    }
}

/// A parse in progress, fed whole lines; holds no borrow of the text, so
/// the text can come in chunks.
struct Parser<'o, 'f> {
    opts: &'o ParseOptions<'f>,
    stats: ParseStats,
    vmlinux: Acc,
    modules: Vec<(Box<str>, Acc)>,
    module_index: FxHashMap<Box<str>, Option<usize>>,
    /// Module lines come grouped, so the last module looked up and its slot.
    current: Option<(Box<str>, Option<usize>)>,
    bpf: Vec<BpfLine>,
    /// The name after the last `__pfx_` line, when the text it was in
    /// ended: kallsyms is sorted by address, so the function it pads is
    /// among the next lines.
    padding_for: Vec<u8>,
}

impl<'o, 'f> Parser<'o, 'f> {
    fn new(opts: &'o ParseOptions<'f>, stream: bool, symbols: usize) -> Self {
        Parser {
            opts,
            stats: ParseStats::default(),
            vmlinux: Acc::new(stream, if opts.vmlinux { symbols } else { 0 }),
            modules: Vec::new(),
            module_index: FxHashMap::default(),
            current: None,
            bpf: Vec::new(),
            padding_for: Vec::new(),
        }
    }

    /// Parses `text`: whole lines (the last may lack its newline only at
    /// the end of the input).
    fn feed(&mut self, text: &[u8]) -> Result<(), Unsorted> {
        let carried = std::mem::take(&mut self.padding_for);
        let mut padding_for: &[u8] = &carried;
        // `padding_for` when a `__pfx_` line of this text set it in the
        // kernel's layout (so it is printable ASCII), else empty.
        let mut fast_pad: &str = "";
        let stats = &mut self.stats;
        let mut pos = 0;
        while pos < text.len() {
            stats.lines += 1;
            // One pass over each line in the kernel's layout: the fixed fields
            // are read in place, padding and data lines are dropped on their
            // type byte and prefix, and a kept name is checked while it is
            // scanned for its end; anything else takes the general path.
            let (l, padded) = match fast_line(text, pos, fast_pad) {
                Fast::Kept(l, next, padded) => {
                    pos = next;
                    (l, padded)
                }
                Fast::NonText(next) => {
                    stats.non_text += 1;
                    pos = next;
                    continue;
                }
                Fast::Padding(name, next) => {
                    stats.pfx_skipped += 1;
                    padding_for = name.as_bytes();
                    fast_pad = name;
                    pos = next;
                    continue;
                }
                Fast::General => {
                    let (line, next) = match memchr::memchr(b'\n', &text[pos..]) {
                        Some(i) => (&text[pos..pos + i], pos + i + 1),
                        None => (&text[pos..], text.len()),
                    };
                    pos = next;
                    let Some(l) = split_line(line) else {
                        stats.malformed += 1;
                        continue;
                    };
                    if !matches!(l.kind, b'T' | b't' | b'W' | b'w') {
                        stats.non_text += 1;
                        continue;
                    }
                    if let Some(padded) = l.name.strip_prefix(PFX) {
                        stats.pfx_skipped += 1;
                        padding_for = padded.as_bytes();
                        fast_pad = "";
                        continue;
                    }
                    (l, false)
                }
            };
            if l.addr == 0 {
                stats.zero_addr += 1;
            }
            let padded = padded || !padding_for.is_empty() && same_bytes(l.name.as_bytes(), padding_for);
            match l.module {
                None if self.opts.vmlinux => self.vmlinux.push(l.addr, l.kind, l.name, padded)?,
                None => stats.unchanged += 1,
                Some("bpf") => self.bpf.push(BpfLine { addr: l.addr, name: l.name.into() }),
                Some(m) => {
                    let slot = match &self.current {
                        Some((name, slot)) if **name == *m => *slot,
                        _ => {
                            let slot = match self.module_index.get(m) {
                                Some(&slot) => slot,
                                None => {
                                    let slot = (self.opts.module)(m).then(|| {
                                        // Modules list their symbols in their
                                        // symbol table's order: collect them.
                                        self.modules.push((m.into(), Acc::new(false, 0)));
                                        self.modules.len() - 1
                                    });
                                    self.module_index.insert(m.into(), slot);
                                    slot
                                }
                            };
                            self.current = Some((m.into(), slot));
                            slot
                        }
                    };
                    match slot {
                        Some(i) => self.modules[i].1.push(l.addr, l.kind, l.name, padded)?,
                        None => stats.unchanged += 1,
                    }
                }
            }
        }
        self.padding_for = padding_for.to_vec();
        Ok(())
    }

    fn finish(self) -> Parsed {
        let mut stats = self.stats;
        let mut bs = BuildStats::default();
        let vmlinux = (!self.vmlinux.is_empty()).then(|| self.vmlinux.finish(&mut bs));
        let modules: Vec<(Box<str>, SymbolTable)> =
            self.modules.into_iter().map(|(name, acc)| (name, acc.finish(&mut bs))).collect();
        stats.symbols =
            vmlinux.as_ref().map_or(0, |t| t.len() as u64) + modules.iter().map(|(_, t)| t.len() as u64).sum::<u64>();
        stats.truncated = bs.truncated;
        stats.aliases = bs.aliases;
        stats.out_of_range = bs.out_of_range;
        Parsed { vmlinux, modules, bpf: self.bpf, stats, read_ns: 0 }
    }
}

struct Line<'a> {
    addr: u64,
    kind: u8,
    name: &'a str,
    module: Option<&'a str>,
}

/// What the one-pass reader made of the line at a position, with where
/// the next line starts.
enum Fast<'a> {
    /// A kept line, where the next starts, and whether it is the function
    /// the `__pfx_` line before padded (when found so without a scan).
    Kept(Line<'a>, usize, bool),
    NonText(usize),
    /// A `__pfx_` line and the name it pads.
    Padding(&'a str, usize),
    /// Not the kernel's layout (or a name it does not check): split it.
    General,
}

/// Start of the line after the one holding `from`.
#[inline]
fn next_line(text: &[u8], from: usize) -> usize {
    memchr::memchr(b'\n', &text[from..]).map_or(text.len(), |i| from + i + 1)
}

/// Whether 16 bytes hold no newline (two 8-byte words, no per-byte loop).
#[inline]
fn no_newline16(b: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let has_nl = |w: u64| {
        let x = w ^ (ONES * u64::from(b'\n'));
        x.wrapping_sub(ONES) & !x & HIGH != 0
    };
    let w0 = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    let w1 = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    !has_nl(w0) && !has_nl(w1)
}

/// `a == b`, 8 bytes at a time with no call to `memcmp` (the last word
/// overlaps the one before it).
#[inline(always)]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n < 8 {
        return a == b;
    }
    if n <= 32 {
        // Four words, the last ones moved back to end at `n`: no loop.
        let (i1, i2, i3) = (8.min(n - 8), 16.min(n - 8), n - 8);
        let diff = (word_at(a, 0) ^ word_at(b, 0))
            | (word_at(a, i1) ^ word_at(b, i1))
            | (word_at(a, i2) ^ word_at(b, i2))
            | (word_at(a, i3) ^ word_at(b, i3));
        return diff == 0;
    }
    let mut i = 0;
    while i + 8 < n {
        if word_at(a, i) != word_at(b, i) {
            return false;
        }
        i += 8;
    }
    word_at(a, n - 8) == word_at(b, n - 8)
}

/// Index of the first byte at or after `from` that is not printable ASCII
/// (`<= b' '` or `>= 0x7f`), or `text.len()`.
#[inline(always)]
fn first_unprintable(text: &[u8], from: usize) -> usize {
    // Most names end within 32 bytes: four words looked at together, so
    // where the name ends costs no branch (a loop over words mispredicts
    // its exit on nearly every line).
    if let Some(w) = text.get(from..from + 32) {
        // Each word's hit bits gathered into one byte, bit i for byte i.
        let mask = |k: usize| {
            let h = unprintable_bits(word_at(w, k));
            ((h >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u32
        };
        let mask = mask(0) | (mask(8) << 8) | (mask(16) << 16) | (mask(24) << 24);
        if mask != 0 {
            return from + mask.trailing_zeros() as usize;
        }
        return first_unprintable_loop(text, from + 32);
    }
    first_unprintable_loop(text, from)
}

/// The 8 bytes at `s[i..]`, little-endian.
#[inline(always)]
fn word_at(s: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(s[i..i + 8].try_into().expect("8 bytes"))
}

/// The high bit of each byte of `w` that is not printable ASCII (`<= b' '`
/// or `>= 0x7f`): exact for the lowest such byte (a borrow or carry from
/// it may mark bytes above it).
#[inline(always)]
fn unprintable_bits(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // < 0x21: the borrow trick; >= 0x7f: 0x7f + 1 carries into the high bit.
    ((w.wrapping_sub(ONES * 0x21) & !w) | (w.wrapping_add(ONES) | w)) & HIGH
}

/// [`first_unprintable`] a word at a time.
#[inline]
fn first_unprintable_loop(text: &[u8], from: usize) -> usize {
    let mut i = from;
    while i + 8 <= text.len() {
        let hit = unprintable_bits(word_at(text, i));
        if hit != 0 {
            return i + (hit.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < text.len() && text[i] > b' ' && text[i] < 0x7f {
        i += 1;
    }
    i
}

/// The line at `pos` read in the kernel's layout, `%016lx %c %s[\t[%s]]`,
/// without first looking for its end: the same lines and results as
/// splitting at the newline and then [`fast_split`], in one pass.
#[inline]
fn fast_line<'t>(text: &'t [u8], pos: usize, pad: &'t str) -> Fast<'t> {
    let n = text.len();
    // Address, type, name's first byte, all on this line.
    if n - pos <= 19 || text[pos + 16] != b' ' || text[pos + 18] != b' ' || text[pos + 19] == b'\n' {
        return Fast::General;
    }
    let kind = text[pos + 17];
    if kind == b'\n' || !no_newline16(&text[pos..pos + 16]) {
        return Fast::General;
    }
    let name_at = pos + 19;
    if !matches!(kind, b'T' | b't' | b'W' | b'w') {
        // The name's end is most often the newline; a name is short, so
        // the 8-byte scan finds it sooner than a memchr call.
        let end = first_unprintable(text, name_at);
        return Fast::NonText(if end < n && text[end] == b'\n' { end + 1 } else { next_line(text, end) });
    }
    if text[name_at..].starts_with(PFX.as_bytes()) {
        let from = name_at + PFX.len();
        // What it pads ends at the tab or the newline; any other byte (the
        // general path would split there) is not the kernel's layout.
        let end = first_unprintable(text, from);
        // SAFETY: checked by `first_unprintable` to be printable ASCII.
        let name = unsafe { std::str::from_utf8_unchecked(&text[from..end]) };
        if end == n || text[end] == b'\n' {
            return Fast::Padding(name, (end + 1).min(n));
        }
        if text[end] != b'\t' {
            return Fast::General;
        }
        return Fast::Padding(name, next_line(text, end));
    }
    let Some(addr) = parse_hex16(&text[pos..pos + 16]) else { return Fast::General };
    // Most often this is the function the `__pfx_` line before pads: if the
    // name is that one, up to the newline, it needs no scan for its end.
    let after = name_at + pad.len();
    if !pad.is_empty() && after < n && text[after] == b'\n' && same_bytes(&text[name_at..after], pad.as_bytes()) {
        return Fast::Kept(Line { addr, kind, name: pad, module: None }, after + 1, true);
    }
    // The name ends at the first byte that is not printable ASCII, found
    // 8 bytes at a time; it must be the tab or the newline.
    let end = first_unprintable(text, name_at);
    if end < n && text[end] != b'\t' && text[end] != b'\n' {
        return Fast::General;
    }
    if end == name_at {
        return Fast::General;
    }
    // SAFETY: checked in the loop to be printable ASCII.
    let name = unsafe { std::str::from_utf8_unchecked(&text[name_at..end]) };
    if end == n || text[end] == b'\n' {
        return Fast::Kept(Line { addr, kind, name, module: None }, (end + 1).min(n), false);
    }
    let line_end = memchr::memchr(b'\n', &text[end..]).map_or(n, |i| end + i);
    let Some(m) = text[end + 1..line_end].strip_prefix(b"[").and_then(|m| m.strip_suffix(b"]")) else {
        return Fast::General;
    };
    if m.is_empty() || m.iter().any(|&b| b == b' ' || b == b'\t' || b == b'[' || b == b']') {
        return Fast::General;
    }
    let Ok(module) = std::str::from_utf8(m) else { return Fast::General };
    Fast::Kept(Line { addr, kind, name, module: Some(module) }, (line_end + 1).min(n), false)
}

/// Splits one line; `None` when it is malformed.
fn split_line(line: &[u8]) -> Option<Line<'_>> {
    fast_split(line).or_else(|| slow_split(line))
}

/// The kernel's own layout, `%016lx %c %s[\t[%s]]`: fixed offsets, no scan
/// for the address and type. Anything else takes the general path.
#[inline]
fn fast_split(line: &[u8]) -> Option<Line<'_>> {
    if line.len() < 20 || line[16] != b' ' || line[18] != b' ' {
        return None;
    }
    let addr = parse_hex(&line[..16])?;
    let kind = line[17];
    let rest = &line[19..];
    // Names are short: a plain loop beats a memchr call here, and checks
    // that the name is printable ASCII on the way.
    let mut end = 0;
    while end < rest.len() && rest[end] != b'\t' {
        if rest[end] <= b' ' || rest[end] >= 0x7f {
            return None;
        }
        end += 1;
    }
    let tab = (end < rest.len()).then_some(end);
    let (name, module) = match tab {
        None => (rest, None),
        Some(i) => {
            let m = rest[i + 1..].strip_prefix(b"[")?.strip_suffix(b"]")?;
            if m.is_empty() || m.iter().any(|&b| b == b' ' || b == b'\t' || b == b'[' || b == b']') {
                return None;
            }
            (&rest[..i], Some(std::str::from_utf8(m).ok()?))
        }
    };
    // Printable ASCII (what kernels emit) is valid UTF-8; anything else,
    // spaces included, took the general path above.
    if name.is_empty() {
        return None;
    }
    // SAFETY: checked in the loop to be ASCII.
    let name = unsafe { std::str::from_utf8_unchecked(name) };
    Some(Line { addr, kind, name, module })
}

fn slow_split(line: &[u8]) -> Option<Line<'_>> {
    let mut fields = line.split(|&b| b == b' ' || b == b'\t').filter(|f| !f.is_empty());
    let addr = parse_hex(fields.next()?)?;
    let kind = match fields.next()? {
        [k] => *k,
        _ => return None,
    };
    let name = std::str::from_utf8(fields.next()?).ok()?;
    let module = match fields.next() {
        None => None,
        Some(m) => {
            let m = m.strip_prefix(b"[")?.strip_suffix(b"]")?;
            if m.is_empty() {
                return None;
            }
            Some(std::str::from_utf8(m).ok()?)
        }
    };
    if fields.next().is_some() {
        return None;
    }
    Some(Line { addr, kind, name, module })
}

/// Hex digit values; 0x80 marks a non-digit.
const HEX: [u8; 256] = {
    let mut t = [0x80u8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// 16 hex digits (either case), 8 at a time: the same as [`parse_hex`]
/// on them, without a table lookup and a shift per digit.
#[inline]
fn parse_hex16(s: &[u8]) -> Option<u64> {
    let (hi, lo) = s.split_at_checked(8)?;
    Some((u64::from(hex8(hi)?) << 32) | u64::from(hex8(lo.get(..8)?)?))
}

/// The value of 8 hex digits, or `None` if a byte is not one.
#[inline]
fn hex8(s: &[u8]) -> Option<u32> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let w = u64::from_le_bytes(s.try_into().ok()?);
    // For bytes below 0x80, a byte's high bit after `(x | 0x80) - lo` says
    // x >= lo, after `(hi | 0x80) - x` that x <= hi.
    let ge = |x: u64, lo: u64| (x | HIGH).wrapping_sub(ONES * lo) & HIGH;
    let le = |x: u64, hi: u64| ((ONES * hi) | HIGH).wrapping_sub(x) & HIGH;
    // `| 0x20` folds A-F onto a-f (and leaves digits as they are).
    let folded = w | (ONES * 0x20);
    let digit = ge(w, b'0'.into()) & le(w, b'9'.into());
    let alpha = ge(folded, b'a'.into()) & le(folded, b'f'.into());
    if w & HIGH != 0 || digit | alpha != HIGH {
        return None;
    }
    // Each byte's value: its low nibble, plus 9 for a letter (bit 6 set).
    let v = (w & (ONES * 0x0f)) + ((w >> 6) & ONES) * 9;
    // The first digit is the lowest byte: pack nibbles, most significant first.
    let v = v.swap_bytes();
    let v = (v | (v >> 4)) & 0x00ff_00ff_00ff_00ff;
    let v = (v | (v >> 8)) & 0x0000_ffff_0000_ffff;
    let v = (v | (v >> 16)) & 0x0000_0000_ffff_ffff;
    Some(v as u32)
}

fn parse_hex(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    let mut v = 0u64;
    let mut bad = 0u8;
    for &b in s {
        let d = HEX[b as usize];
        bad |= d;
        v = (v << 4) | u64::from(d & 0x0f);
    }
    (bad & 0x80 == 0).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_fields() {
        let l = split_line(b"ffffffffc0a00000 t foo\t[mod]").unwrap();
        assert_eq!((l.addr, l.kind, l.name, l.module), (0xffffffffc0a00000, b't', "foo", Some("mod")));
        let l = split_line(b"ffffffff81000000 T _stext").unwrap();
        assert_eq!(l.module, None);
        assert!(split_line(b"").is_none());
        assert!(split_line(b"xyz T a").is_none());
        assert!(split_line(b"1234 T").is_none());
        assert!(split_line(b"1234 TT a").is_none());
        assert!(split_line(b"1234 T a [m").is_none());
        assert!(split_line(b"11112222333344445 T a").is_none());
    }

    #[test]
    fn fast_path_agrees_with_general_path() {
        let lines: [&[u8]; 6] = [
            b"ffffffff81000000 T _stext",
            b"ffffffffc0a00000 t foo\t[mod]",
            b"ffffffffc0a00000 t foo\t[]",
            b"ffffffffc0a00000 t foo\t[a b]",
            b"ffffffffc0a00000 t foo bar",
            b"ffffffffc0a0000z t foo",
        ];
        for l in lines {
            fn key(x: Option<Line<'_>>) -> Option<(u64, u8, &str, Option<&str>)> {
                x.map(|x| (x.addr, x.kind, x.name, x.module))
            }
            if let Some(f) = fast_split(l) {
                assert_eq!(key(Some(f)), key(slow_split(l)), "{}", String::from_utf8_lossy(l));
            }
        }
    }

    /// The one-pass reader sorts every line as splitting it at its newline
    /// and reading it with the general path does, on lines built to trip
    /// it: newlines inside the fixed fields, empty names, tabs, spaces,
    /// CR, bad modules, a last line without its newline.
    #[test]
    fn one_pass_agrees_with_splitting_lines() {
        let text: &[u8] = b"ffffffff81000000 T a\n\
ffffffff81000010 t __pfx_b\n\
ffffffff81000020 t b\n\
ffffffff8100000\n t c\n\
ffffffff8100000\n D x\n\
ffffffff8100000\n t __pfx_z\n\
ffffffff81000030 D\n\
ffffffff81000030 D \n\
ffffffff81000040 T\tx\n\
ffffffff81000050 T \td\n\
ffffffff81000060 T e f\n\
ffffffff81000070 T g\r\n\
ffffffff81000080 d data\n\
ffffffff810000b0 T long_name_with space_inside\n\
ffffffff810000c0 T long_name_with_del\x7fx\n\
ffffffff810000d0 T long_name_non_ascii_\xc3\xa9\n\
ffffffff810000e0 T a_rather_long_function_name_of_40_bytes\n\
ffffffff810000f0 T exactly8\tmod\n\
ffffffff81000090 t __pfx_h\t[m]\n\
ffffffffc0000000 t h\t[m]\n\
ffffffffc0000010 t i\t[a b]\n\
ffffffffc0000020 t j\t[]\n\
ffffffffc0000030 t k\t[m\n\
\n\
ffffffff8100zz00 T bad_hex\n\
ffffffff81\nffffffff810000a0 T q\n\
ffffffffc0000040 t __pfx_\n\
ffffffff81000100 t __pfx_sp ace\n\
ffffffff81000110 t __pfx_\xc3\xa9\n\
ffffffff81000120 t \xc3\xa9\n\
ffffffff81000130 t __pfx_bad\xff\n\
ffffffff81000140 t __pfx_del\x7f\t[m]\n\
ffffffff81000150 t __pfx_tab\t[m]\n\
ffffffff81000160 d data_with_a_name_longer_than_8\t[m]\n\
ffffffffc0000050 T last\t[m]";
        let mut want = ParseStats::default();
        let mut kept: Vec<(u64, String, Option<String>)> = Vec::new();
        for line in text.split(|&b| b == b'\n') {
            want.lines += 1;
            let Some(l) = split_line(line) else {
                want.malformed += 1;
                continue;
            };
            if !matches!(l.kind, b'T' | b't' | b'W' | b'w') {
                want.non_text += 1;
            } else if l.name.starts_with(PFX) {
                want.pfx_skipped += 1;
            } else {
                kept.push((l.addr, l.name.to_string(), l.module.map(str::to_string)));
            }
        }
        let p = parse(text, &ParseOptions::default());
        assert_eq!(
            (p.stats.lines, p.stats.malformed, p.stats.non_text, p.stats.pfx_skipped),
            (want.lines, want.malformed, want.non_text, want.pfx_skipped)
        );
        let mut got: Vec<(u64, String, Option<String>)> =
            p.vmlinux.iter().flat_map(|t| t.iter()).map(|(a, n)| (a, n, None)).collect();
        for (m, t) in &p.modules {
            got.extend(t.iter().map(|(a, n)| (a, n, Some(m.to_string()))));
        }
        got.sort();
        kept.sort();
        assert_eq!(got, kept);
    }

    /// Stats, every symbol as (module, address, name, padded), `[bpf]` lines.
    type Summary = (ParseStats, Vec<(Option<String>, u64, String, bool)>, Vec<BpfLine>);

    /// Everything a parse gives, names decoded, to compare two parses.
    fn summary(p: &Parsed) -> Summary {
        let mut syms = Vec::new();
        let tables = p.vmlinux.iter().map(|t| (None, t)).chain(p.modules.iter().map(|(m, t)| (Some(m.to_string()), t)));
        for (m, t) in tables {
            syms.extend(t.iter().map(|(a, n)| (m.clone(), a, n, t.padded_start(a))));
        }
        (p.stats, syms, p.bpf.clone())
    }

    /// Text in the kernel's layout with every quirk the parser handles:
    /// padding (one `__pfx_` line right before its function, one before
    /// an alias), aliases at one address (where the later, better ranked
    /// name replaces a block's first name and a front-coded one), data
    /// lines, module lines out of address order with their own padding
    /// and aliases, `[bpf]` lines, names with odd bytes (the general
    /// path), a name longer than 255 bytes, blank and malformed lines.
    fn quirky_text() -> Vec<u8> {
        let mut t = String::new();
        for i in 0..40u64 {
            let a = 0xffffffff81000000 + 0x40 * i;
            t += &format!("{:016x} t __pfx_ext4_fn_{i}\n{:016x} t ext4_fn_{i}\n", a - 0x10, a);
            if i % 3 == 0 {
                t += &format!("{a:016x} T __ext4_fn_{i}_alias\n{a:016x} T ext4_fn_{i}_global\n");
            }
            if i % 7 == 0 {
                t += &format!("{:016x} d ext4_data_{i}\n", a + 8);
            }
        }
        // The longer name wins and is cut; a strong name replaces a cut one.
        t += &format!("ffffffff82000000 T long_alias_first\nffffffff82000000 T long_{}\n", "x".repeat(300));
        t += &format!("ffffffff82000008 W weak_{}\nffffffff82000008 T strong\n", "y".repeat(300));
        t += "ffffffff82000010 T odd\u{e9}name\n";
        t += "\nnot a line\n";
        t += "ffffffffc0000200 t m_b\t[mod]\nffffffffc0000100 t __pfx_m_a\t[mod]\n";
        t += "ffffffffc0000110 t m_a\t[mod]\nffffffffc0000110 T m_a_global\t[mod]\n";
        t += "ffffffffc0100000 t n_a\t[other]\nffffffffc0000300 t m_c\t[mod]\n";
        t += "ffffffffc0200000 t bpf_prog_1\t[bpf]\n";
        t += "ffffffff82000020 T tail_no_newline";
        t.into_bytes()
    }

    /// Reading in chunks of any size, lines cut anywhere between reads,
    /// parses exactly as the whole text does.
    #[test]
    fn chunked_read_parses_like_whole_text() {
        let text = quirky_text();
        let whole = parse(&text, &ParseOptions::default());
        assert_eq!((whole.stats.aliases, whole.stats.truncated, whole.stats.malformed), (31, 1, 2));
        let v = whole.vmlinux.as_ref().unwrap();
        let long = v.lookup(0xffffffff82000000).unwrap().0.to_string();
        assert!(long.starts_with("long_xx") && long.len() == table::MAX_NAME, "{long}");
        assert_eq!(v.lookup(0xffffffff82000008).unwrap().0, "strong");
        assert_eq!(v.lookup(0xffffffff81000000).unwrap().0, "ext4_fn_0_global");
        assert!(v.padded_start(0xffffffff81000000) && v.padded_start(0xffffffff81000040));
        for chunk in (1..80).chain([127, 128, 1000, 1 << 16]) {
            let got = parse_reader(&text[..], &ParseOptions::default(), chunk, 0).unwrap().unwrap();
            assert_eq!(summary(&got), summary(&whole), "chunk {chunk}");
        }
    }

    /// Out-of-order vmlinux lines: the reader says so (the file is then
    /// read whole) and [`read_and_parse`] gives what [`parse`] gives.
    #[test]
    fn chunked_read_of_unsorted_vmlinux_falls_back() {
        let text = b"ffffffff81000040 t c\nffffffff81000000 T a\nffffffffc0000000 t m\t[mod]\n";
        assert!(matches!(parse_reader(&text[..], &ParseOptions::default(), 8, 0), Ok(Err(Unsorted))));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kallsyms");
        std::fs::write(&path, text).unwrap();
        let read = read_and_parse(&path, &ParseOptions::default()).unwrap();
        assert_eq!(summary(&read), summary(&parse(text, &ParseOptions::default())));
        assert_eq!(read.vmlinux.unwrap().len(), 2);
        let quirky = quirky_text();
        std::fs::write(&path, &quirky).unwrap();
        let read = read_and_parse(&path, &ParseOptions::default()).unwrap();
        assert_eq!(summary(&read), summary(&parse(&quirky, &ParseOptions::default())));
        assert!(read_and_parse(&dir.path().join("missing"), &ParseOptions::default()).is_err());
    }

    /// A module's lines, in any order, with aliases and padding, give the
    /// table the same lines sorted give; a module not wanted is counted.
    #[test]
    fn module_lines_in_any_order() {
        let sorted = b"ffffffffc0000100 t __pfx_a\t[m]\n\
ffffffffc0000110 t a\t[m]\n\
ffffffffc0000110 T a_global\t[m]\n\
ffffffffc0000200 t b\t[m]\n\
ffffffffc0000300 t c\t[skip]\n";
        let shuffled = b"ffffffffc0000200 t b\t[m]\n\
ffffffffc0000300 t c\t[skip]\n\
ffffffffc0000100 t __pfx_a\t[m]\n\
ffffffffc0000110 t a\t[m]\n\
ffffffffc0000110 T a_global\t[m]\n";
        let opts = ParseOptions { vmlinux: true, module: &|m| m != "skip" };
        let (s, u) = (parse(sorted, &opts), parse(shuffled, &opts));
        assert_eq!(summary(&s), summary(&u));
        let (_, syms, _) = summary(&u);
        assert_eq!(
            syms,
            vec![
                (Some("m".into()), 0xffffffffc0000110, "a_global".into(), true),
                (Some("m".into()), 0xffffffffc0000200, "b".into(), false)
            ]
        );
        assert_eq!((u.stats.unchanged, u.stats.aliases, u.stats.pfx_skipped), (1, 1, 1));
    }

    #[test]
    fn same_bytes_is_slice_equality() {
        let a: Vec<u8> = (0..70u8).collect();
        for n in 0..=70usize {
            for m in [n, n.saturating_sub(1)] {
                assert_eq!(same_bytes(&a[..n], &a[..m]), n == m);
            }
            for k in 0..n {
                let mut b = a[..n].to_vec();
                b[k] ^= 1;
                assert!(!same_bytes(&a[..n], &b), "{n} {k}");
            }
            let copy = a[..n].to_vec();
            assert!(same_bytes(&a[..n], &copy));
        }
    }

    /// The 8-digit reader agrees with the per-digit one on every byte value
    /// at every position, and on random and edge addresses.
    #[test]
    fn parse_hex16_matches_parse_hex() {
        let mut x = 0x9e3779b97f4a7c15u64;
        let mut cases: Vec<[u8; 16]> = Vec::new();
        for v in [0u64, u64::MAX, 0xffffffff81000000, 0x0123456789abcdef] {
            cases.push(format!("{v:016x}").into_bytes().try_into().unwrap());
            cases.push(format!("{v:016X}").into_bytes().try_into().unwrap());
        }
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            cases.push(format!("{x:016x}").into_bytes().try_into().unwrap());
        }
        for b in 0..=255u8 {
            for at in 0..16 {
                let mut c = *b"ffffffff81a0bC9d";
                c[at] = b;
                cases.push(c);
            }
        }
        for c in cases {
            assert_eq!(parse_hex16(&c), parse_hex(&c), "{}", String::from_utf8_lossy(&c));
        }
        assert_eq!(parse_hex16(b"0123"), None);
    }

    /// The 8-byte scan finds what a byte loop finds, for every byte value
    /// at every position of a word and next to others.
    #[test]
    fn first_unprintable_matches_a_byte_loop() {
        let naive = |t: &[u8], from: usize| {
            t[from..].iter().position(|&b| b <= b' ' || b >= 0x7f).map_or(t.len(), |i| from + i)
        };
        for b in 0..=255u8 {
            for at in 0..20 {
                for other in [None, Some(0xffu8), Some(b'\t'), Some(0x7f)] {
                    for len in [20, 45, 80] {
                        for at in [at, at + 17, at + 25].into_iter().filter(|&a| a < len) {
                            let mut t = vec![b'a'; len];
                            t[at] = b;
                            if let Some(o) = other {
                                t[(at + 3) % len] = o;
                            }
                            for from in [0, 1, 5, 9] {
                                assert_eq!(first_unprintable(&t, from), naive(&t, from), "{t:?} from {from}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn groups_modules_and_skips() {
        let text = b"ffffffff81000000 T a\n\
ffffffff81000010 t __pfx_b\n\
ffffffff81000020 t b\n\
ffffffff81000030 D data\n\
garbage\n\
ffffffffc0000000 t m1\t[mod]\n\
ffffffffc0001000 t p\t[bpf]\n";
        let p = parse(text, &ParseOptions::default());
        let v = p.vmlinux.unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v.lookup(0xffffffff81000025).map(|(n, o)| (n.to_string(), o)), Some(("b".to_string(), 5)));
        assert_eq!(p.modules.len(), 1);
        assert_eq!(p.bpf.len(), 1);
        assert_eq!(p.stats.malformed, 1);
        assert_eq!(p.stats.pfx_skipped, 1);
        assert_eq!(p.stats.non_text, 1);
    }

    /// Lines out of address order (streaming refuses them) give the same
    /// tables as the same lines in order.
    #[test]
    fn unsorted_input_parses_like_sorted() {
        let sorted = b"ffffffff81000000 T a\n\
ffffffff81000010 t __pfx_b\n\
ffffffff81000020 t b\n\
ffffffff81000020 T b_alias\n\
ffffffff81000040 t c\n\
ffffffffc0000000 t m1\t[mod]\n\
ffffffffc0000100 t m2\t[mod]\n";
        let unsorted = b"ffffffff81000040 t c\n\
ffffffff81000000 T a\n\
ffffffff81000010 t __pfx_b\n\
ffffffff81000020 t b\n\
ffffffff81000020 T b_alias\n\
ffffffffc0000100 t m2\t[mod]\n\
ffffffffc0000000 t m1\t[mod]\n";
        let list = |p: &Parsed| {
            let mut v: Vec<(u64, String)> =
                p.vmlinux.as_ref().unwrap().iter().map(|(a, n)| (a, n.to_string())).collect();
            v.extend(p.modules[0].1.iter().map(|(a, n)| (a, n.to_string())));
            v
        };
        let (s, u) = (parse(sorted, &ParseOptions::default()), parse(unsorted, &ParseOptions::default()));
        assert_eq!(list(&s), list(&u));
        assert_eq!(list(&s)[1], (0xffffffff81000020, "b_alias".to_string()));
        assert_eq!(s.stats, u.stats);
        assert!(s.vmlinux.as_ref().unwrap().padded_start(0xffffffff81000020));
        assert!(u.vmlinux.as_ref().unwrap().padded_start(0xffffffff81000020));
    }
}

#[cfg(test)]
mod perf_probe {
    #[test]
    #[ignore = "profiling aid: KS_PROBE=file cargo test --release -- --ignored probe"]
    fn probe() {
        let Ok(p) = std::env::var("KS_PROBE") else { return };
        let text = std::fs::read(&p).unwrap();
        for _ in 0..3 {
            let t = std::time::Instant::now();
            for _ in 0..100 {
                std::hint::black_box(super::parse(&text, &super::ParseOptions::default()));
            }
            let parse = t.elapsed() / 100;
            let t = std::time::Instant::now();
            for _ in 0..100 {
                std::hint::black_box(super::read_and_parse(p.as_ref(), &super::ParseOptions::default()).unwrap());
            }
            let rp = t.elapsed() / 100;
            let t = std::time::Instant::now();
            for _ in 0..100 {
                std::hint::black_box(std::fs::read(&p).unwrap());
            }
            let read = t.elapsed() / 100;
            let t = std::time::Instant::now();
            for _ in 0..100 {
                let text = std::fs::read(&p).unwrap();
                std::hint::black_box(super::parse(&text, &super::ParseOptions::default()));
            }
            eprintln!(
                "parse: {parse:?} per run; read_and_parse: {rp:?}; fs::read alone: {read:?}; fs::read + parse: {:?}",
                t.elapsed() / 100
            );
        }
    }
}

#[cfg(test)]
mod lookup_probe {
    #[test]
    #[ignore = "profiling aid: KS_PROBE=file cargo test --release -- --ignored lookup_probe"]
    fn lookup_probe() {
        let Ok(p) = std::env::var("KS_PROBE") else { return };
        let text = std::fs::read(p).unwrap();
        let t = super::parse(&text, &super::ParseOptions::default()).vmlinux.unwrap();
        let (lo, hi) = (t.base(), t.last_addr());
        let mut x = 0x9e3779b97f4a7c15u64;
        let n_addrs: usize = std::env::var("KS_N").map_or(1 << 16, |v| v.parse().unwrap());
        let addrs: Vec<u64> = (0..n_addrs)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                lo + x % (hi - lo)
            })
            .collect();
        for _ in 0..3 {
            let s = std::time::Instant::now();
            let mut n = 0u64;
            for _ in 0..(20 << 16) / n_addrs {
                for &a in &addrs {
                    n += std::hint::black_box(t.lookup(a)).map_or(0, |(_, o)| o);
                }
            }
            let only = s.elapsed().as_nanos() as f64 / (20 << 16) as f64;
            let s = std::time::Instant::now();
            let mut buf = super::super::table::NameBuf::new();
            for _ in 0..(20 << 16) / n_addrs {
                for &a in &addrs {
                    if let Some((name, _)) = t.lookup(a) {
                        n += std::hint::black_box(name.decode(&mut buf)).len() as u64;
                    }
                }
            }
            let with = s.elapsed().as_nanos() as f64 / (20 << 16) as f64;
            eprintln!("lookup {only:.1} ns, with name {with:.1} ns ({n})");
        }
    }
}
