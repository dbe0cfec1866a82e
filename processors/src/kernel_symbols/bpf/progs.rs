//! The set of JIT-ed BPF functions live in one generation.
//!
//! BPF programs are more like kernel functions than modules: each program
//! (and each of its subprograms) is one symbol with a known length, loaded
//! and unloaded on its own. The set is small and copied on change.

use std::sync::Arc;

/// Default length given to a `[bpf]` kallsyms symbol, whose real length
/// kallsyms does not say (capped by the next BPF symbol).
pub(crate) const KALLSYMS_FALLBACK_LEN: u32 = 4096;

/// A source line of a BPF function (from BTF line info).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BpfLine {
    /// First JIT-ed address of the line.
    pub addr: u64,
    pub file: Arc<str>,
    pub line: u32,
}

/// One JIT-ed BPF function (a program or a subprogram).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BpfFunc {
    pub start: u64,
    pub len: u32,
    /// Program id; 0 when known only from kallsyms or a KSYMBOL record.
    pub prog_id: u32,
    /// The kernel's symbol name: `bpf_prog_<tag>_<func>`.
    pub name: Arc<str>,
    /// The function's name from the program's BTF, where it has BTF.
    pub func: Option<Arc<str>>,
    /// Source lines sorted by address; empty without line info.
    pub lines: Arc<[BpfLine]>,
}

impl BpfFunc {
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.start && addr - self.start < u64::from(self.len.max(1))
    }

    /// Source line covering `addr`.
    pub fn line(&self, addr: u64) -> Option<&BpfLine> {
        let i = self.lines.partition_point(|l| l.addr <= addr).checked_sub(1)?;
        Some(&self.lines[i])
    }
}

/// Immutable, sorted by start, non-overlapping.
#[derive(Debug, Clone, Default)]
pub(crate) struct BpfFuncs {
    funcs: Arc<[BpfFunc]>,
}

impl BpfFuncs {
    pub(crate) fn new(mut funcs: Vec<BpfFunc>) -> Self {
        funcs.sort_by_key(|f| f.start);
        funcs.dedup_by_key(|f| f.start);
        BpfFuncs { funcs: funcs.into() }
    }

    /// From `[bpf]` kallsyms lines: lengths unknown, so each runs to the next
    /// BPF symbol, at most [`KALLSYMS_FALLBACK_LEN`].
    pub(crate) fn from_kallsyms(lines: &[crate::kernel_symbols::kallsyms::BpfLine]) -> Self {
        let mut starts: Vec<_> = lines.iter().map(|l| (l.addr, l.name.clone())).collect();
        starts.sort();
        let funcs = (0..starts.len())
            .map(|i| {
                let (start, ref name) = starts[i];
                let gap = starts.get(i + 1).map_or(u64::MAX, |n| n.0 - start);
                BpfFunc {
                    start,
                    len: gap.min(u64::from(KALLSYMS_FALLBACK_LEN)) as u32,
                    prog_id: 0,
                    name: Arc::from(&**name),
                    func: None,
                    lines: Arc::from([]),
                }
            })
            .collect();
        BpfFuncs::new(funcs)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &BpfFunc> {
        self.funcs.iter()
    }
}
