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
    pub out_of_range: u64,
    /// Lines of modules not rebuilt because they did not change.
    pub unchanged: u64,
    /// Text lines whose address reads as 0 (kallsyms read without privilege).
    pub zero_addr: u64,
}

/// Result of one parse.
#[derive(Debug, Default)]
pub struct Parsed {
    pub vmlinux: Option<SymbolTable>,
    /// Module name and its table, in order of first appearance.
    pub modules: Vec<(Box<str>, SymbolTable)>,
    pub bpf: Vec<BpfLine>,
    pub stats: ParseStats,
}

/// Parses kallsyms text. Never fails: bad lines are counted and skipped.
///
/// Each table is built as its lines stream by (kallsyms lists vmlinux and
/// each module in address order); input that is not in order is parsed
/// again, collecting and sorting each table's symbols first.
pub fn parse(text: &[u8], opts: &ParseOptions<'_>) -> Parsed {
    parse_with(text, opts, true)
        .unwrap_or_else(|Unsorted| parse_with(text, opts, false).expect("collecting tables accepts any order"))
}

/// One table being built: streamed straight into its layout, or collected
/// to be sorted.
enum Acc<'a> {
    Stream(TableBuilder<'a>),
    Collect(Vec<Entry<'a>>),
}

impl<'a> Acc<'a> {
    fn new(stream: bool, capacity: usize) -> Self {
        if stream {
            Acc::Stream(TableBuilder::with_capacity(capacity))
        } else {
            Acc::Collect(Vec::with_capacity(capacity))
        }
    }

    #[inline]
    fn push(&mut self, addr: u64, kind: u8, name: &'a str, padded: bool) -> Result<(), Unsorted> {
        match self {
            Acc::Stream(b) => b.push(addr, Rank::Kind(kind), name, padded),
            Acc::Collect(v) => {
                v.push(Entry { addr, rank: table::rank(kind, name), name, padded });
                Ok(())
            }
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Acc::Stream(b) => b.is_empty(),
            Acc::Collect(v) => v.is_empty(),
        }
    }

    fn finish(self, stats: &mut BuildStats) -> SymbolTable {
        match self {
            Acc::Stream(b) => b.finish(stats),
            Acc::Collect(v) => table::build(v, stats),
        }
    }
}

fn parse_with(text: &[u8], opts: &ParseOptions<'_>, stream: bool) -> Result<Parsed, Unsorted> {
    let mut stats = ParseStats::default();
    // About one kept symbol per 85 bytes of kallsyms text.
    let mut vmlinux = Acc::new(stream, if opts.vmlinux { text.len() / 85 } else { 0 });
    let mut modules: Vec<(&str, Acc<'_>)> = Vec::new();
    let mut module_index: FxHashMap<&str, Option<usize>> = FxHashMap::default();
    let mut bpf = Vec::new();
    // Module lines come grouped, so remember the last module looked up.
    let mut current: Option<(&str, Option<usize>)> = None;
    // The name after the last `__pfx_` line: kallsyms is sorted by address,
    // so the function it pads is among the next lines.
    let mut padding_for: &[u8] = b"";

    let mut pos = 0;
    while pos < text.len() {
        stats.lines += 1;
        // One pass over each line in the kernel's layout: the fixed fields
        // are read in place, padding and data lines are dropped on their
        // type byte and prefix, and a kept name is checked while it is
        // scanned for its end; anything else takes the general path.
        let l = match fast_line(text, pos) {
            Fast::Kept(l, next) => {
                pos = next;
                l
            }
            Fast::NonText(next) => {
                stats.non_text += 1;
                pos = next;
                continue;
            }
            Fast::Padding(name, next) => {
                stats.pfx_skipped += 1;
                padding_for = name;
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
                    continue;
                }
                l
            }
        };
        if l.addr == 0 {
            stats.zero_addr += 1;
        }
        let padded = !padding_for.is_empty() && l.name.as_bytes() == padding_for;
        match l.module {
            None if opts.vmlinux => vmlinux.push(l.addr, l.kind, l.name, padded)?,
            None => stats.unchanged += 1,
            Some("bpf") => bpf.push(BpfLine { addr: l.addr, name: l.name.into() }),
            Some(m) => {
                let slot = match current {
                    Some((name, slot)) if name == m => slot,
                    _ => {
                        let slot = *module_index.entry(m).or_insert_with(|| {
                            (opts.module)(m).then(|| {
                                modules.push((m, Acc::new(stream, 0)));
                                modules.len() - 1
                            })
                        });
                        current = Some((m, slot));
                        slot
                    }
                };
                match slot {
                    Some(i) => modules[i].1.push(l.addr, l.kind, l.name, padded)?,
                    None => stats.unchanged += 1,
                }
            }
        }
    }

    let mut bs = BuildStats::default();
    let vmlinux = (!vmlinux.is_empty()).then(|| vmlinux.finish(&mut bs));
    let modules: Vec<(Box<str>, SymbolTable)> =
        modules.into_iter().map(|(name, acc)| (Box::from(name), acc.finish(&mut bs))).collect();
    stats.symbols =
        vmlinux.as_ref().map_or(0, |t| t.len() as u64) + modules.iter().map(|(_, t)| t.len() as u64).sum::<u64>();
    stats.truncated = bs.truncated;
    stats.aliases = bs.aliases;
    stats.out_of_range = bs.out_of_range;
    Ok(Parsed { vmlinux, modules, bpf, stats })
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
    Kept(Line<'a>, usize),
    NonText(usize),
    /// A `__pfx_` line and the name it pads.
    Padding(&'a [u8], usize),
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

/// Index of the first byte at or after `from` that is not printable ASCII
/// (`<= b' '` or `>= 0x7f`), or `text.len()`.
#[inline]
fn first_unprintable(text: &[u8], from: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut i = from;
    while i + 8 <= text.len() {
        let w = u64::from_le_bytes(text[i..i + 8].try_into().expect("8 bytes"));
        // High bit set in a byte that is < 0x21 (borrow trick; exact for the
        // lowest such byte) or >= 0x7f (0x7f + 1 carries into the high bit).
        let low = w.wrapping_sub(ONES * 0x21) & !w;
        let high = w.wrapping_add(ONES) | w;
        let hit = (low | high) & HIGH;
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
fn fast_line(text: &[u8], pos: usize) -> Fast<'_> {
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
        return Fast::NonText(next_line(text, name_at));
    }
    if text[name_at..].starts_with(PFX.as_bytes()) {
        let from = name_at + PFX.len();
        let end = memchr::memchr2(b'\t', b'\n', &text[from..]).map_or(n, |i| from + i);
        let next = if end < n && text[end] == b'\t' { next_line(text, end) } else { (end + 1).min(n) };
        return Fast::Padding(&text[from..end], next);
    }
    let Some(addr) = parse_hex(&text[pos..pos + 16]) else { return Fast::General };
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
        return Fast::Kept(Line { addr, kind, name, module: None }, (end + 1).min(n));
    }
    let line_end = memchr::memchr(b'\n', &text[end..]).map_or(n, |i| end + i);
    let Some(m) = text[end + 1..line_end].strip_prefix(b"[").and_then(|m| m.strip_suffix(b"]")) else {
        return Fast::General;
    };
    if m.is_empty() || m.iter().any(|&b| b == b' ' || b == b'\t' || b == b'[' || b == b']') {
        return Fast::General;
    }
    let Ok(module) = std::str::from_utf8(m) else { return Fast::General };
    Fast::Kept(Line { addr, kind, name, module: Some(module) }, (line_end + 1).min(n))
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
                    let mut t = vec![b'a'; 20];
                    t[at] = b;
                    if let Some(o) = other {
                        t[(at + 3) % 20] = o;
                    }
                    for from in [0, 1, 5] {
                        assert_eq!(first_unprintable(&t, from), naive(&t, from), "{t:?} from {from}");
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
        let text = std::fs::read(p).unwrap();
        let t = std::time::Instant::now();
        for _ in 0..100 {
            std::hint::black_box(super::parse(&text, &super::ParseOptions::default()));
        }
        eprintln!("parse: {:?} per run", t.elapsed() / 100);
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
