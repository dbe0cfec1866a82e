//! Compact unwind tables for x86-64 from `.eh_frame` and `.debug_frame`.
//!
//! A sampled user stack is walked in the kernel (BPF) with these tables
//! when the code keeps no frame pointers. The walk needs, per instruction
//! address, only three things: how to find the canonical frame address
//! (CFA), where the return address is, and where the caller's `rbp` is
//! (the one callee-saved register a later CFA rule may depend on). So the
//! DWARF CFI of every FDE is evaluated here (with `gimli`) into rows
//! `address → Rule`, rows with the same rule as the previous one merged,
//! and everything outside the subset real compilers emit is marked
//! [`kind::UNSUPPORTED`] so the walk stops there instead of guessing.
//!
//! The subset: CFA = `rsp`/`rbp` + offset; the return address at CFA − 8
//! (or undefined: the outermost frame, e.g. `_start`); `rbp` unchanged or
//! saved at CFA + n; and the PLT's CFA expression
//! (`rsp + 8 + ((rip & 15) >= k) * 8`, binutils' lazy and IBT PLTs); and
//! signal trampolines (glibc's `__restore_rt`: a CIE with augmentation
//! `S`, CFA = `*(rsp + n)`, every register at `rsp + m` in the
//! `ucontext`), which become one [`kind::SIGNAL`] rule.
//!
//! Go binaries keep frame pointers in Go code and describe it only in
//! `.debug_frame`, without saying where `rbp` is saved; their tables take
//! `.eh_frame` (the C parts of a cgo binary) alone and mark the rest of
//! their executable segments [`kind::FRAME_POINTER`].
//!
//! [`CompactTable`] is the form the BPF maps hold, after the OTel eBPF
//! profiler's "stack delta pages": the address space is cut into 64 KiB
//! pages; each page lists its rows as 4-byte words (low 16 bits of the
//! address, 16-bit rule id) after a row carried over at the page start,
//! and rules are interned (a few hundred distinct ones per binary). A
//! lookup is one page lookup and a binary search of at most 17 steps.

use crate::{ElfFile, Error};
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, LittleEndian, Register, RegisterRule, UnwindContext,
    UnwindSection, X86_64,
};
use object::elf::{FileHeader64, EM_X86_64, SHF_COMPRESSED};
use object::read::elf::{FileHeader, SectionHeader};
use object::Endianness;
use rustc_hash::FxHashMap;

/// What a row says about the CFA (and whether the walk may go on).
pub mod kind {
    /// The rules here are outside the supported subset: stop.
    pub(crate) const UNSUPPORTED: u8 = 0;
    /// CFA = rsp + cfa_offset.
    pub const CFA_RSP: u8 = 1;
    /// CFA = rbp + cfa_offset.
    pub(crate) const CFA_RBP: u8 = 2;
    /// PLT entry: CFA = rsp + 8 + ((rip & 15) >= cfa_offset ? 8 : 0).
    pub(crate) const PLT: u8 = 3;
    /// The return address is undefined: the outermost frame.
    pub(crate) const OUTERMOST: u8 = 4;
    /// No FDE covers the address (a gap between functions).
    pub(crate) const NO_INFO: u8 = 5;
    /// Code known to keep frame pointers (Go): one frame-pointer step.
    pub(crate) const FRAME_POINTER: u8 = 6;
    /// A signal trampoline: rsp points at the kernel's `ucontext`; the
    /// interrupted rsp is at rsp + cfa_offset, rip right after it (+ 8)
    /// and rbp at rsp + rbp_offset.
    pub(crate) const SIGNAL: u8 = 7;
    /// Go's `runtime.asmcgocall` right after it called C on the system
    /// stack: the goroutine `g` is at rsp + cfa_offset, the depth it left
    /// below `g.stack.hi` at rsp + rbp_offset; the goroutine's stack
    /// pointer at the call (`g.stack.hi` - depth) holds the return address
    /// into `runtime.cgocall`.
    pub(crate) const GO_CGO_CALL: u8 = 8;
}

/// Where the caller's `rbp` is.
pub mod rbp {
    /// Unchanged by this frame.
    pub const SAME: u8 = 0;
    /// Saved at CFA + rbp_offset.
    pub(crate) const AT_CFA: u8 = 1;
    /// Not recoverable by the subset (a later rbp-based CFA stops).
    pub const UNKNOWN: u8 = 2;
}

/// One unwind rule: 8 bytes, laid out as `struct unwind_rule` in the BPF C.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    pub kind: u8,
    pub rbp: u8,
    pub rbp_offset: i16,
    pub cfa_offset: i32,
}

impl Rule {
    pub(crate) const UNSUPPORTED: Rule = Rule { kind: kind::UNSUPPORTED, rbp: rbp::SAME, rbp_offset: 0, cfa_offset: 0 };
    pub(crate) const NO_INFO: Rule = Rule { kind: kind::NO_INFO, rbp: rbp::SAME, rbp_offset: 0, cfa_offset: 0 };
    pub(crate) const FRAME_POINTER: Rule =
        Rule { kind: kind::FRAME_POINTER, rbp: rbp::SAME, rbp_offset: 0, cfa_offset: 0 };

    /// The 8 bytes of `struct unwind_rule` (native endian).
    pub fn to_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = self.kind;
        b[1] = self.rbp;
        b[2..4].copy_from_slice(&self.rbp_offset.to_ne_bytes());
        b[4..8].copy_from_slice(&self.cfa_offset.to_ne_bytes());
        b
    }
}

/// `address` starts a range (up to the next row) governed by `rule`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub address: u64,
    pub rule: Rule,
}

/// Rows sorted by address; the last row is always a [`kind::NO_INFO`]
/// end marker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnwindTable {
    pub rows: Vec<Row>,
}

/// What building a table saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Bytes of `.eh_frame` and `.debug_frame` read.
    pub cfi_bytes: u64,
    pub fdes: u64,
    /// FDEs that failed to parse or evaluate (skipped: their range has no info).
    pub bad_fdes: u64,
    /// Rows whose rule is [`kind::UNSUPPORTED`].
    pub unsupported_rows: u64,
    /// A Go binary: code outside `.eh_frame`'s FDEs is
    /// [`kind::FRAME_POINTER`] and `.debug_frame` is not read.
    pub go: bool,
}

/// Why no table could be built.
#[derive(Debug, thiserror::Error)]
pub enum UnwindError {
    #[error("{0}")]
    Elf(#[from] Error),
    #[error("unwind tables are built for x86-64 ELF64 files only")]
    Architecture,
    #[error("the file has no .eh_frame or .debug_frame")]
    NoCfi,
    #[error("more than 65535 distinct unwind rules")]
    TooManyRules,
}

const RA: Register = X86_64::RA;
const RSP: Register = X86_64::RSP;
const RBP: Register = X86_64::RBP;

/// The CFA expression of binutils' PLT entries, with `DW_OP_lit<k>` at
/// [`PLT_LIT_AT`]: `rsp + 8 + ((rip & 15) >= k) << 3`.
const PLT_EXPR: [u8; 11] = [0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x00, 0x2a, 0x33, 0x24, 0x22];
const PLT_LIT_AT: usize = 6;

fn plt_threshold(expr: &[u8]) -> Option<i32> {
    if expr.len() != PLT_EXPR.len() {
        return None;
    }
    let lit = expr[PLT_LIT_AT];
    let same = expr.iter().zip(PLT_EXPR.iter()).enumerate().all(|(i, (a, b))| i == PLT_LIT_AT || a == b);
    (same && (0x30..=0x4f).contains(&lit)).then(|| i32::from(lit - 0x30))
}

/// One FDE found by the first pass: what it covers and where it is. Its
/// rows are evaluated in the second, in address order, straight into the
/// table: no FDE's rows are held apart (they were ~10× the table's bytes
/// at the peak of a build).
struct FdeAt {
    start: u64,
    end: u64,
    /// 0 for `.eh_frame`, 1 for `.debug_frame` (the first wins an overlap).
    priority: u8,
    /// Offset of the FDE in its section.
    offset: usize,
}

/// Rows of a table per byte of CFI, at most, in the files measured
/// (0.19–0.26): the output is sized once from the CFI's size.
const ROWS_PER_CFI_BYTE_DIV: usize = 4;
/// Rows reserved at most up front; a larger table grows as usual,
/// so a file claiming a huge CFI section reserves no more than this.
const MAX_RESERVED_ROWS: usize = 1 << 22;

impl ElfFile {
    /// Builds the unwind table of an x86-64 ELF64 file from `.eh_frame`
    /// and `.debug_frame` (uncompressed); addresses are the file's virtual
    /// addresses.
    pub fn unwind_table(&self) -> Result<(UnwindTable, TableStats), UnwindError> {
        let mut rows = Merged::new(None);
        let mut stats = self.merge_cfi(&mut rows)?;
        let mut table = UnwindTable { rows: rows.rows };
        if stats.go {
            table = self.go_table(table);
        }
        stats.unsupported_rows = table.rows.iter().filter(|r| r.rule.kind == kind::UNSUPPORTED).count() as u64;
        Ok((table, stats))
    }

    /// [`Self::unwind_table`] in the compact form, built as the rows come:
    /// equal to `unwind_table()?.0.compact()`, but the full table (16 bytes
    /// a row: ~13 MB for a 274 MB Rust binary) never exists at once, only
    /// the compact one (4 bytes a row). Go binaries, whose tables are
    /// small, go through the full table (their gaps are filled after the
    /// merge).
    pub fn compact_unwind_table(&self) -> Result<(CompactTable, TableStats), UnwindError> {
        if self.class != crate::Class::Elf64 {
            return Err(UnwindError::Architecture);
        }
        if self.is_go()? {
            let (table, stats) = self.unwind_table()?;
            return Ok((table.compact()?, stats));
        }
        let mut builder = CompactBuilder::default();
        let mut rows = Merged::new(Some(&mut builder));
        let mut stats = self.merge_cfi(&mut rows)?;
        rows.finish();
        stats.unsupported_rows = builder.unsupported;
        Ok((builder.finish()?, stats))
    }

    /// Whether this is a Go binary (see [`TableStats::go`]).
    fn is_go(&self) -> Result<bool, UnwindError> {
        let data = self.bytes.get();
        let h = FileHeader64::<Endianness>::parse(data).map_err(|_| Error::Malformed("ELF header"))?;
        let e = h.endian().map_err(|_| Error::Malformed("byte order"))?;
        let sections = h.sections(e, data).map_err(|_| Error::Malformed("section headers"))?;
        Ok(self.go_build_id().is_some()
            || sections.section_by_name(e, b".gopclntab").is_some()
            || sections.section_by_name(e, b".go.buildinfo").is_some())
    }

    /// Merges the rows of every FDE of `.eh_frame` and `.debug_frame` (not
    /// for Go binaries) into `out`, in address order.
    fn merge_cfi(&self, out: &mut Merged<'_>) -> Result<TableStats, UnwindError> {
        if self.class != crate::Class::Elf64 {
            return Err(UnwindError::Architecture);
        }
        let data = self.bytes.get();
        let h = FileHeader64::<Endianness>::parse(data).map_err(|_| Error::Malformed("ELF header"))?;
        let e = h.endian().map_err(|_| Error::Malformed("byte order"))?;
        if h.e_machine(e) != EM_X86_64 || e != Endianness::Little {
            return Err(UnwindError::Architecture);
        }
        let sections = h.sections(e, data).map_err(|_| Error::Malformed("section headers"))?;
        let section = |name: &[u8]| {
            let (_, sh) = sections.section_by_name(e, name)?;
            if (sh.sh_flags(e) & SHF_COMPRESSED).0 != 0 {
                return None;
            }
            let bytes = sh.data(e, data).ok()?;
            Some((sh.sh_addr(e), bytes))
        };
        let text = section(b".text").map_or(0, |(a, _)| a);
        let go = self.is_go()?;
        let mut stats = TableStats { go, ..TableStats::default() };
        let mut fdes = Vec::new();
        let eh = section(b".eh_frame").map(|(addr, bytes)| {
            stats.cfi_bytes += bytes.len() as u64;
            (BaseAddresses::default().set_eh_frame(addr).set_text(text), EhFrame::new(bytes, LittleEndian))
        });
        let df = section(b".debug_frame").filter(|_| !go).map(|(_, bytes)| {
            stats.cfi_bytes += bytes.len() as u64;
            let mut df = DebugFrame::new(bytes, LittleEndian);
            df.set_address_size(8);
            (BaseAddresses::default(), df)
        });
        if eh.is_none() && df.is_none() {
            return Err(UnwindError::NoCfi);
        }
        if let Some((bases, eh)) = &eh {
            scan(eh, bases, 0, &mut fdes, &mut stats);
        }
        if let Some((bases, df)) = &df {
            scan(df, bases, 1, &mut fdes, &mut stats);
        }
        let mut ctx = UnwindContext::new();
        let mut bad = 0u64;
        // Reserved once, for the rows that will be kept (pages not written
        // to are not memory the process is charged for).
        let capacity =
            (usize::try_from(stats.cfi_bytes).unwrap_or(0) / ROWS_PER_CFI_BYTE_DIV + 2).min(MAX_RESERVED_ROWS);
        match out.to.as_mut() {
            Some(b) => b.words.reserve(capacity),
            None => out.rows.reserve(capacity),
        }
        merge(fdes, out, |f, rows| {
            let ok = match (f.priority, &eh, &df) {
                (0, Some((bases, eh)), _) => rows_of(eh, bases, &mut ctx, f.offset, rows),
                (1, _, Some((bases, df))) => rows_of(df, bases, &mut ctx, f.offset, rows),
                _ => false,
            };
            bad += u64::from(!ok);
            ok
        });
        stats.bad_fdes += bad;
        Ok(stats)
    }

    /// A Go binary's table: code no FDE covers is Go code, walked by frame
    /// pointers; `runtime.asmcgocall`'s call into C gets its own rule.
    fn go_table(&self, mut table: UnwindTable) -> UnwindTable {
        let code: Vec<(u64, u64)> = self
            .load_segments()
            .iter()
            .filter(|s| s.executable)
            .map(|s| (s.vaddr, s.vaddr.saturating_add(s.filesz)))
            .collect();
        table = table.fill_gaps(&code, Rule::FRAME_POINTER);
        if let Some((call, rule)) = self.go_cgo_call() {
            table = table.with_rule(call, call + CALL_RAX.len() as u64, rule);
        }
        table
    }
}

impl ElfFile {
    /// The address ranges of the FDEs in `.eh_frame` (where functions
    /// start and end, for code no symbol names), sorted by start.
    pub fn fde_ranges(&self) -> Vec<(u64, u64)> {
        let Ok((addr, bytes, text)) = self.eh_frame() else { return Vec::new() };
        let bases = BaseAddresses::default().set_eh_frame(addr).set_text(text);
        let eh = EhFrame::new(bytes, LittleEndian);
        let mut out = Vec::new();
        let mut entries = eh.entries(&bases);
        while let Ok(Some(entry)) = entries.next() {
            if let CieOrFde::Fde(partial) = entry {
                if let Ok(fde) = partial.parse(EhFrame::cie_from_offset) {
                    out.push((fde.initial_address(), fde.end_address()));
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// The `call *%rax` in `runtime.asmcgocall` (by symbol) and its
    /// [`kind::GO_CGO_CALL`] rule, read off the instructions before it that
    /// save `g` and the stack depth (Go 1.x: `mov %rdi,G(%rsp); mov
    /// 8(%rdi),%rdi; sub %rdx,%rdi; mov %rdi,D(%rsp)`); None when the
    /// symbol is gone (a stripped binary) or the code differs.
    fn go_cgo_call(&self) -> Option<(u64, Rule)> {
        let (found, _) = self.find_functions(&["runtime.asmcgocall.abi0", "runtime.asmcgocall"]);
        let f = found.into_iter().flatten().next()?;
        let start = usize::try_from(f.file_offset).ok()?;
        let code = self.bytes.get().get(start..start.checked_add(usize::try_from(f.size.min(512)).ok()?)?)?;
        // g.stack.hi - the entry rsp: the depth asmcgocall saves.
        const DEPTH: [u8; 7] = [0x48, 0x8b, 0x7f, 0x08, 0x48, 0x29, 0xd7];
        let at = code.windows(DEPTH.len()).position(|w| w == DEPTH)?;
        let g = match code.get(at.checked_sub(5)?..at)? {
            [0x48, 0x89, 0x7c, 0x24, g] => *g,
            _ => return None,
        };
        let (depth, after) = match code.get(at + DEPTH.len()..)? {
            [0x48, 0x89, 0x7c, 0x24, d, ..] => (*d, at + DEPTH.len() + 5),
            [0x48, 0x89, 0x3c, 0x24, ..] => (0, at + DEPTH.len() + 4),
            _ => return None,
        };
        let call = after + code.get(after..)?.windows(2).take(16).position(|w| w == CALL_RAX)?;
        let rule =
            Rule { kind: kind::GO_CGO_CALL, rbp: rbp::SAME, rbp_offset: i16::from(depth), cfa_offset: i32::from(g) };
        Some((f.address + call as u64, rule))
    }

    /// `.eh_frame`'s address and bytes, and `.text`'s address.
    fn eh_frame(&self) -> Result<(u64, &[u8], u64), UnwindError> {
        let data = self.bytes.get();
        let h = FileHeader64::<Endianness>::parse(data).map_err(|_| Error::Malformed("ELF header"))?;
        let e = h.endian().map_err(|_| Error::Malformed("byte order"))?;
        let sections = h.sections(e, data).map_err(|_| Error::Malformed("section headers"))?;
        let text = sections.section_by_name(e, b".text").map_or(0, |(_, sh)| sh.sh_addr(e));
        let (_, sh) = sections.section_by_name(e, b".eh_frame").ok_or(UnwindError::NoCfi)?;
        let bytes = sh.data(e, data).map_err(|_| Error::Malformed(".eh_frame"))?;
        Ok((sh.sh_addr(e), bytes, text))
    }
}

/// The first pass: every FDE of `section` with the range it covers.
fn scan<'a, S: UnwindSection<gimli::EndianSlice<'a, LittleEndian>, Offset = O>, O: gimli::UnwindOffset>(
    section: &S,
    bases: &BaseAddresses,
    priority: u8,
    out: &mut Vec<FdeAt>,
    stats: &mut TableStats,
) {
    let mut entries = section.entries(bases);
    loop {
        let entry = match entries.next() {
            Ok(Some(e)) => e,
            Ok(None) => break,
            // The rest of the section cannot be walked: keep what was read.
            Err(_) => {
                stats.bad_fdes += 1;
                break;
            }
        };
        let CieOrFde::Fde(partial) = entry else { continue };
        stats.fdes += 1;
        let Ok(fde) = partial.parse(S::cie_from_offset) else {
            stats.bad_fdes += 1;
            continue;
        };
        let (start, end) = (fde.initial_address(), fde.end_address());
        if start < end {
            out.push(FdeAt { start, end, priority, offset: fde.offset() });
        }
    }
}

/// The second pass, for one FDE: its rows into `out` (cleared first);
/// false when it cannot be evaluated or has none.
fn rows_of<'a, S: UnwindSection<gimli::EndianSlice<'a, LittleEndian>, Offset = O>, O: gimli::UnwindOffset>(
    section: &S,
    bases: &BaseAddresses,
    ctx: &mut UnwindContext<usize>,
    offset: usize,
    out: &mut Vec<Row>,
) -> bool {
    out.clear();
    let ok = (|| -> gimli::Result<()> {
        let fde = section.fde_from_offset(bases, O::from(offset), S::cie_from_offset)?;
        let signal = fde.cie().is_signal_trampoline();
        let mut table = fde.rows(section, bases, ctx)?;
        while let Some(row) = table.next_row()? {
            let rule = if signal { signal_rule_of(row, section) } else { rule_of(row, section) };
            out.push(Row { address: row.start_address(), rule });
        }
        Ok(())
    })();
    ok.is_ok() && !out.is_empty()
}

fn rule_of<'a, S: UnwindSection<gimli::EndianSlice<'a, LittleEndian>>>(
    row: &gimli::UnwindTableRow<usize>,
    section: &S,
) -> Rule {
    let ra_undefined = match row.register(RA) {
        Some(RegisterRule::Offset(-8)) => false,
        Some(RegisterRule::Undefined) => true,
        _ => return Rule::UNSUPPORTED,
    };
    let (kind, cfa_offset) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let Ok(off) = i32::try_from(*offset) else { return Rule::UNSUPPORTED };
            match *register {
                RSP => (kind::CFA_RSP, off),
                RBP => (kind::CFA_RBP, off),
                _ => return Rule::UNSUPPORTED,
            }
        }
        CfaRule::Expression(expr) => match expr.get(section).ok().and_then(|x| plt_threshold(x.0.slice())) {
            Some(k) => (kind::PLT, k),
            None => return Rule::UNSUPPORTED,
        },
    };
    let (rbp, rbp_offset) = match row.register(RBP) {
        None | Some(RegisterRule::SameValue) => (rbp::SAME, 0),
        Some(RegisterRule::Offset(n)) => match i16::try_from(n) {
            Ok(n) => (rbp::AT_CFA, n),
            Err(_) => (rbp::UNKNOWN, 0),
        },
        Some(_) => (rbp::UNKNOWN, 0),
    };
    let kind = if ra_undefined { kind::OUTERMOST } else { kind };
    Rule { kind, rbp, rbp_offset, cfa_offset }
}

/// `rsp + n` (`DW_OP_breg7 n`), then the rest of `expr`.
fn rsp_plus(expr: &[u8]) -> Option<(i64, &[u8])> {
    let (&op, mut rest) = expr.split_first()?;
    if op != 0x77 {
        return None;
    }
    let (mut value, mut shift) = (0i64, 0u32);
    loop {
        let (&b, r) = rest.split_first()?;
        rest = r;
        if shift >= 63 {
            return None;
        }
        value |= i64::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            if shift < 64 && b & 0x40 != 0 {
                value |= -1i64 << shift;
            }
            return Some((value, rest));
        }
    }
}

/// The rule of a signal trampoline's row (glibc's `__restore_rt`): CFA =
/// `*(rsp + n)` (`DW_OP_breg7 n; DW_OP_deref`), rip saved at `rsp + n + 8`
/// (the kernel's sigcontext keeps rip right after rsp) and rbp at
/// `rsp + m`. Anything else is [`kind::UNSUPPORTED`].
fn signal_rule_of<'a, S: UnwindSection<gimli::EndianSlice<'a, LittleEndian>>>(
    row: &gimli::UnwindTableRow<usize>,
    section: &S,
) -> Rule {
    let at_rsp = |rule: Option<RegisterRule<usize>>| match rule {
        Some(RegisterRule::Expression(e)) => {
            e.get(section).ok().and_then(|x| rsp_plus(x.0.slice()).filter(|(_, rest)| rest.is_empty())).map(|v| v.0)
        }
        _ => None,
    };
    let CfaRule::Expression(cfa) = row.cfa() else { return Rule::UNSUPPORTED };
    let rsp_at = cfa.get(section).ok().and_then(|x| match rsp_plus(x.0.slice()) {
        Some((n, [0x06])) => Some(n),
        _ => None,
    });
    let (Some(rsp_at), Some(rip_at), Some(rbp_at)) = (rsp_at, at_rsp(row.register(RA)), at_rsp(row.register(RBP)))
    else {
        return Rule::UNSUPPORTED;
    };
    match (i32::try_from(rsp_at), i16::try_from(rbp_at)) {
        (Ok(cfa_offset), Ok(rbp_offset)) if rip_at == rsp_at + 8 => {
            Rule { kind: kind::SIGNAL, rbp: rbp::SAME, rbp_offset, cfa_offset }
        }
        _ => Rule::UNSUPPORTED,
    }
}

/// `call *%rax`.
const CALL_RAX: [u8; 2] = [0xff, 0xd0];

/// Rows as [`merge`] makes them: a row whose address equals the last
/// one's replaces it, and a row whose rule equals the one before it is
/// dropped. Only the last row can change, or go when its replacement
/// equals the row before it; so with a builder (`to`), every row but the
/// last two is final and goes on to it at once.
struct Merged<'a> {
    rows: Vec<Row>,
    to: Option<&'a mut CompactBuilder>,
}

impl<'a> Merged<'a> {
    fn new(to: Option<&'a mut CompactBuilder>) -> Self {
        Merged { rows: Vec::new(), to }
    }

    fn push(&mut self, r: Row) {
        let rows = &mut self.rows;
        if let Some(last) = rows.last_mut() {
            if last.address == r.address {
                *last = r;
                // The previous row may now equal this one's predecessor.
                if rows.len() >= 2 && rows[rows.len() - 2].rule == r.rule {
                    rows.pop();
                }
                return;
            }
            if last.rule == r.rule {
                return;
            }
        }
        rows.push(r);
        if let Some(b) = self.to.as_mut() {
            if let [first, second, third] = rows[..] {
                b.push(first);
                rows[0] = second;
                rows[1] = third;
                rows.truncate(2);
            }
        }
    }

    /// Hands the rows still held to the builder.
    fn finish(&mut self) {
        if let Some(b) = self.to.as_mut() {
            for r in self.rows.drain(..) {
                b.push(r);
            }
        }
    }
}

/// Sorts FDEs, evaluates each one not overlapping an earlier (or
/// higher-priority) one with `rows_of` (false: no rows, it covers
/// nothing), fills gaps with NO_INFO and merges equal neighbours into
/// `out`.
fn merge(mut fdes: Vec<FdeAt>, out: &mut Merged<'_>, mut rows_of: impl FnMut(&FdeAt, &mut Vec<Row>) -> bool) {
    fdes.sort_unstable_by_key(|f| (f.start, f.priority));
    let mut fde_rows: Vec<Row> = Vec::new();
    let mut covered_end = 0u64;
    for f in &fdes {
        if f.start < covered_end || !rows_of(f, &mut fde_rows) {
            continue;
        }
        if f.start > covered_end && covered_end != 0 {
            out.push(Row { address: covered_end, rule: Rule::NO_INFO });
        }
        for r in &fde_rows {
            if r.address >= f.start && r.address < f.end {
                out.push(*r);
            }
        }
        covered_end = f.end;
    }
    if covered_end != 0 {
        out.push(Row { address: covered_end, rule: Rule::NO_INFO });
    }
    // A full table is not shrunk: it lives only until it is compacted, and
    // a shrink would be one more allocation of its size.
}

/// Builds a [`CompactTable`] from a table's rows in order: each row is
/// placed when the next one (where its rule ends) comes.
#[derive(Default)]
struct CompactBuilder {
    rules: Vec<Rule>,
    // Looked up once per row: a fast hash (rules are 8 plain bytes).
    ids: FxHashMap<Rule, u16>,
    pages: Vec<Page>,
    words: Vec<u32>,
    held: Option<Row>,
    /// Rows whose rule is [`kind::UNSUPPORTED`].
    unsupported: u64,
    error: Option<UnwindError>,
}

impl CompactBuilder {
    fn push(&mut self, row: Row) {
        if let Some(prev) = self.held.replace(row) {
            self.place(prev, row.address);
        }
    }

    fn finish(mut self) -> Result<CompactTable, UnwindError> {
        if let Some(last) = self.held.take() {
            self.place(last, last.address + 1);
        }
        match self.error {
            Some(e) => Err(e),
            None => Ok(CompactTable { rules: self.rules, pages: self.pages, rows: self.words }),
        }
    }

    /// `row`'s rule holds up to `end`: it starts its own page and is
    /// carried into each later page it covers.
    fn place(&mut self, row: Row, end: u64) {
        self.unsupported += u64::from(row.rule.kind == kind::UNSUPPORTED);
        if self.error.is_some() {
            return;
        }
        let first_page = row.address >> PAGE_SHIFT;
        let last_page = (end - 1) >> PAGE_SHIFT;
        if row.rule.kind == kind::NO_INFO && self.pages.last().is_none_or(|p| u64::from(p.page) != first_page) {
            // A page that starts without info needs no carried row, and
            // pages wholly without info are left out.
            return;
        }
        let id = match self.ids.get(&row.rule) {
            Some(&id) => id,
            None => {
                let Ok(id) = u16::try_from(self.rules.len()) else {
                    self.error = Some(UnwindError::TooManyRules);
                    return;
                };
                self.rules.push(row.rule);
                self.ids.insert(row.rule, id);
                id
            }
        };
        for page in first_page..=last_page {
            let Ok(page32) = u32::try_from(page) else { break };
            let lo = if page == first_page { (row.address & 0xffff) as u32 } else { 0 };
            if row.rule.kind == kind::NO_INFO && page != first_page {
                break;
            }
            if self.pages.last().is_none_or(|p| p.page != page32) {
                self.pages.push(Page { page: page32, first: self.words.len() as u32, count: 0 });
            }
            self.words.push((lo << 16) | u32::from(id));
            if let Some(p) = self.pages.last_mut() {
                p.count += 1;
            }
        }
    }
}

impl UnwindTable {
    /// The rule for `address` (NO_INFO outside every FDE).
    pub fn rule_at(&self, address: u64) -> Rule {
        let i = self.rows.partition_point(|r| r.address <= address);
        match i.checked_sub(1) {
            Some(i) => self.rows[i].rule,
            None => Rule::NO_INFO,
        }
    }

    /// This table with every address of `ranges` it has no info for
    /// governed by `fill` instead.
    pub(crate) fn fill_gaps(&self, ranges: &[(u64, u64)], fill: Rule) -> UnwindTable {
        let mut bounds: Vec<u64> =
            self.rows.iter().map(|r| r.address).chain(ranges.iter().flat_map(|&(s, e)| [s, e])).collect();
        bounds.sort_unstable();
        bounds.dedup();
        let inside = |a: u64| ranges.iter().any(|&(s, e)| a >= s && a < e);
        let mut rows: Vec<Row> = Vec::with_capacity(bounds.len());
        for address in bounds {
            let mut rule = self.rule_at(address);
            if rule.kind == kind::NO_INFO && inside(address) {
                rule = fill;
            }
            // No leading no-info row; no row equal to the one before.
            if rows.last().map_or(rule.kind != kind::NO_INFO, |r| r.rule != rule) {
                rows.push(Row { address, rule });
            }
        }
        UnwindTable { rows }
    }

    /// This table with `rule` for `[start, end)`.
    pub(crate) fn with_rule(&self, start: u64, end: u64, rule: Rule) -> UnwindTable {
        let after = self.rule_at(end);
        let mut rows: Vec<Row> = self.rows.iter().filter(|r| r.address < start).copied().collect();
        rows.push(Row { address: start, rule });
        rows.push(Row { address: end, rule: after });
        rows.extend(self.rows.iter().filter(|r| r.address > end).copied());
        rows.dedup_by(|b, a| a.rule == b.rule);
        UnwindTable { rows }
    }

    /// The compact, paged form the BPF maps hold.
    pub fn compact(&self) -> Result<CompactTable, UnwindError> {
        let mut b = CompactBuilder {
            // A word per row, and one per page a row is carried into (few).
            words: Vec::with_capacity(self.rows.len() + self.rows.len() / 64),
            ..CompactBuilder::default()
        };
        for &row in &self.rows {
            b.push(row);
        }
        b.finish()
    }
}

/// log2 of the page size of [`CompactTable`].
pub(crate) const PAGE_SHIFT: u32 = 16;

/// One 64 KiB page: its rows are `rows[first .. first + count]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Page {
    /// `address >> PAGE_SHIFT`.
    pub page: u32,
    pub first: u32,
    pub count: u32,
}

/// An unwind table as the BPF maps hold it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactTable {
    /// Distinct rules; rows refer to them by index.
    pub rules: Vec<Rule>,
    /// Pages with rows, ascending.
    pub pages: Vec<Page>,
    /// `(address & 0xffff) << 16 | rule index`, ascending within each page.
    pub rows: Vec<u32>,
}

/// Bytes of one page entry in the BPF hash map (key and value).
pub const PAGE_ENTRY_BYTES: usize = 16;

impl CompactTable {
    /// Bytes the table takes in the BPF maps: rows, page entries, rules.
    pub fn bytes(&self) -> usize {
        self.rows.len() * 4 + self.pages.len() * PAGE_ENTRY_BYTES + self.rules.len() * 8
    }

    /// The rule for `address`, as the BPF program finds it: the page, then
    /// the last row at or below the address's low 16 bits.
    pub fn rule_at(&self, address: u64) -> Rule {
        let Ok(page) = u32::try_from(address >> PAGE_SHIFT) else { return Rule::NO_INFO };
        let Ok(p) = self.pages.binary_search_by_key(&page, |p| p.page) else { return Rule::NO_INFO };
        let p = self.pages[p];
        let rows = &self.rows[p.first as usize..(p.first + p.count) as usize];
        let lo = (address & 0xffff) as u32;
        let i = rows.partition_point(|w| (w >> 16) <= lo);
        match i.checked_sub(1) {
            Some(i) => self.rules[(rows[i] & 0xffff) as usize],
            None => Rule::NO_INFO,
        }
    }
}
