//! One module's symbols, held compactly: sorted 32-bit offsets from the
//! module's base, each with an index into one blob of length-prefixed names.
//!
//! 8 bytes per symbol plus the name bytes; no per-name allocation and no
//! name -> address map (the rare name lookup scans).

/// Longest name kept; longer ones are cut (at a char boundary) so the
/// length fits the one-byte prefix.
pub const MAX_NAME: usize = 255;

/// Immutable symbol table of one module (or vmlinux).
#[derive(Debug, Default, Clone)]
pub struct SymbolTable {
    base: u64,
    offsets: Box<[u32]>,
    name_at: Box<[u32]>,
    blob: Box<[u8]>,
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

    /// The symbol covering `addr` (the last one at or below it) and the
    /// distance from its start.
    #[inline]
    pub fn lookup(&self, addr: u64) -> Option<(&str, u64)> {
        let rel = addr.checked_sub(self.base)?;
        let rel = u32::try_from(rel).ok()?;
        let i = self.offsets.partition_point(|&o| o <= rel).checked_sub(1)?;
        Some((self.name(i), u64::from(rel - self.offsets[i])))
    }

    /// Whether `addr` is the first byte of a function with padding before
    /// it: then it is not a return address, but the address itself (an
    /// interrupted instruction, a jump target).
    #[inline]
    pub fn padded_start(&self, addr: u64) -> bool {
        let Some(rel) = addr.checked_sub(self.base).and_then(|r| u32::try_from(r).ok()) else { return false };
        match self.offsets.binary_search(&rel) {
            Ok(i) => self.padded.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1),
            Err(_) => false,
        }
    }

    /// Start address of the symbol covering `addr`.
    pub fn symbol_start(&self, addr: u64) -> Option<u64> {
        let rel = u32::try_from(addr.checked_sub(self.base)?).ok()?;
        let i = self.offsets.partition_point(|&o| o <= rel).checked_sub(1)?;
        Some(self.base + u64::from(self.offsets[i]))
    }

    fn name(&self, i: usize) -> &str {
        let at = self.name_at[i] as usize;
        let len = self.blob[at] as usize;
        let bytes = &self.blob[at + 1..at + 1 + len];
        debug_assert!(std::str::from_utf8(bytes).is_ok());
        // SAFETY: `build` only stores `&str` names, cut at char boundaries,
        // and the blob is immutable afterwards.
        unsafe { std::str::from_utf8_unchecked(bytes) }
    }

    /// Address of a symbol by name: a linear scan, used only by tools and tests.
    pub fn find(&self, name: &str) -> Option<u64> {
        (0..self.len()).find(|&i| self.name(i) == name).map(|i| self.base + u64::from(self.offsets[i]))
    }

    /// (address, name) of every symbol, in address order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &str)> + '_ {
        (0..self.len()).map(|i| (self.base + u64::from(self.offsets[i]), self.name(i)))
    }

    /// Heap bytes held by this table.
    pub fn heap_bytes(&self) -> usize {
        self.offsets.len() * 4 + self.name_at.len() * 4 + self.blob.len() + self.padded.len() * 8
    }
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
    let real = !matches!(name, "init_module" | "cleanup_module");
    let non_weak = matches!(kind, b'T' | b't');
    let global = kind.is_ascii_uppercase();
    let not_pi = !name.starts_with(PI_ALIAS);
    let arch_syscall = name.starts_with(ARCH_SYSCALL);
    let underscores = name.bytes().take_while(|&b| b == b'_').count().min(15) as u32;
    let not_marker = !(name.ends_with("_start") || name.ends_with("_end") || name.ends_with("_array"));
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
    pub out_of_range: u64,
}

/// Builds a table from candidate entries (any order, duplicates allowed).
pub fn build(mut entries: Vec<Entry<'_>>, stats: &mut BuildStats) -> SymbolTable {
    if entries.is_empty() {
        return SymbolTable::default();
    }
    // kallsyms is sorted by address already (vmlinux and most modules):
    // then keep the best of each run of equal addresses without sorting.
    // Otherwise a stable sort puts the best first, keeping first-seen order
    // among equals.
    let before = entries.len();
    if entries.windows(2).all(|w| w[0].addr <= w[1].addr) {
        let mut w = 0;
        for r in 0..entries.len() {
            if w > 0 && entries[w - 1].addr == entries[r].addr {
                let padded = entries[w - 1].padded | entries[r].padded;
                if entries[r].rank > entries[w - 1].rank {
                    entries[w - 1] = entries[r];
                }
                entries[w - 1].padded = padded;
            } else {
                entries[w] = entries[r];
                w += 1;
            }
        }
        entries.truncate(w);
    } else {
        entries.sort_by_key(|e| (e.addr, std::cmp::Reverse(e.rank)));
        entries.dedup_by(|later, kept| {
            let same = later.addr == kept.addr;
            kept.padded |= same && later.padded;
            same
        });
    }
    stats.aliases += (before - entries.len()) as u64;

    let base = entries[0].addr;
    let mut offsets = Vec::with_capacity(entries.len());
    let mut name_at = Vec::with_capacity(entries.len());
    let name_bytes: usize = entries.iter().map(|e| e.name.len().min(MAX_NAME) + 1).sum();
    let mut blob = Vec::with_capacity(name_bytes);
    let mut padded = vec![0u64; entries.len().div_ceil(64)];
    for e in &entries {
        let Ok(off) = u32::try_from(e.addr - base) else {
            stats.out_of_range += 1;
            continue;
        };
        if e.padded {
            let i = offsets.len();
            padded[i / 64] |= 1 << (i % 64);
        }
        let name = truncate(e.name, &mut stats.truncated);
        offsets.push(off);
        name_at.push(blob.len() as u32);
        blob.push(name.len() as u8);
        blob.extend_from_slice(name.as_bytes());
    }
    SymbolTable {
        base,
        offsets: offsets.into_boxed_slice(),
        name_at: name_at.into_boxed_slice(),
        blob: blob.into_boxed_slice(),
        padded: padded.into_boxed_slice(),
    }
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

    #[test]
    fn lookup_finds_covering_symbol() {
        let mut st = BuildStats::default();
        let t = build(vec![e(0x2000, b't', "b"), e(0x1000, b'T', "a")], &mut st);
        assert_eq!(t.lookup(0x0fff), None);
        assert_eq!(t.lookup(0x1000), Some(("a", 0)));
        assert_eq!(t.lookup(0x1fff), Some(("a", 0xfff)));
        assert_eq!(t.lookup(0x2005), Some(("b", 5)));
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
        assert_eq!(t.lookup(1).unwrap().0.len(), 254);
        assert_eq!(st.truncated, 1);
    }
}
