//! One immutable view of the kernel's text: vmlinux, loaded modules, names
//! of modules no longer loaded, and BPF functions. Lookups walk it without
//! locks; changes build a new snapshot sharing the unchanged tables.

use std::sync::Arc;

use super::bpf::history::BpfHistory;
use super::bpf::progs::{BpfFunc, BpfLine};
use super::sysfs::ModuleMeta;
use super::table::{SymName, SymbolTable};

/// Slack after the last known symbol of a table: kallsyms gives no sizes.
pub(crate) const TAIL_SLACK: u64 = 4096;

/// A module sysfs says is loaded, with its names once kallsyms was read.
#[derive(Debug, Clone)]
pub struct ModuleEntry {
    pub meta: Arc<ModuleMeta>,
    /// `None` while its names have not been read yet.
    pub syms: Option<Arc<SymbolTable>>,
}

/// Names kallsyms lists for a module that owns no range: a module sysfs does
/// not list (stale init symbols kept for ftrace, `__builtin__*` pseudo
/// modules), or any module when there is no sysfs.
#[derive(Debug, Clone)]
pub struct LooseTable {
    pub module: Arc<str>,
    pub syms: Arc<SymbolTable>,
}

#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub vmlinux: Arc<SymbolTable>,
    pub vmlinux_build_id: Option<Arc<[u8]>>,
    /// Sorted by `.text`.
    pub modules: Arc<[ModuleEntry]>,
    /// Every module table kallsyms gave (loaded modules' too, for addresses
    /// outside their core such as init text); consulted after ownership.
    pub loose: Arc<[LooseTable]>,
    /// BPF functions with their lifetimes (the same history in every generation).
    pub bpf: BpfHistory,
}

/// What an address is.
#[derive(Debug, Clone, Copy)]
pub enum Symbol<'a> {
    /// In vmlinux.
    Kernel { name: SymName<'a>, off: u64 },
    /// Inside a loaded module's range; `sym` is `None` until its names are read.
    Module { module: &'a ModuleMeta, sym: Option<(SymName<'a>, u64)> },
    /// Named by a table of a module that does not own the address.
    Loose { module: &'a str, name: SymName<'a>, off: u64 },
    /// In a JIT-ed BPF function.
    Bpf { func: &'a BpfFunc, off: u64, line: Option<&'a BpfLine> },
}

impl Snapshot {
    /// Resolves one address as things are now (BPF functions loaded now).
    pub fn lookup(&self, addr: u64) -> Option<Symbol<'_>> {
        self.lookup_at(addr, u64::MAX - 1)
    }

    /// Resolves one address for a sample taken at `ts_ns`. Order: vmlinux,
    /// BPF functions live at `ts_ns` (exact ranges), then the loaded module
    /// owning the address (so stale names never win over it), then the
    /// nearest symbol of any other module table.
    #[inline]
    pub fn lookup_at(&self, addr: u64, ts_ns: u64) -> Option<Symbol<'_>> {
        let v = &self.vmlinux;
        if !v.is_empty() && addr >= v.base() && addr < v.last_addr() + TAIL_SLACK {
            if let Some((name, off)) = v.lookup(addr) {
                return Some(Symbol::Kernel { name, off });
            }
        }
        if let Some(func) = self.bpf.lookup(addr, ts_ns) {
            return Some(Symbol::Bpf { func, off: addr - func.start, line: func.line(addr) });
        }
        if let Some(m) = self.owner(addr) {
            let sym = m.syms.as_ref().and_then(|t| t.lookup(addr));
            return Some(Symbol::Module { module: &m.meta, sym });
        }
        self.nearest_loose(addr)
    }

    /// Whether `addr` is the first byte of a padded function (vmlinux or a
    /// loaded module): no call returns there, so it is an exact address.
    pub(crate) fn padded_start(&self, addr: u64) -> bool {
        let v = &self.vmlinux;
        if !v.is_empty() && addr >= v.base() && addr <= v.last_addr() {
            return v.padded_start(addr);
        }
        self.owner(addr).and_then(|m| m.syms.as_ref()).is_some_and(|t| t.padded_start(addr))
    }

    /// The loaded module whose `[text, text + coresize)` holds `addr`; with
    /// overlapping ranges the one starting closest below wins.
    fn owner(&self, addr: u64) -> Option<&ModuleEntry> {
        let i = self.modules.partition_point(|m| m.meta.text <= addr).checked_sub(1)?;
        let m = &self.modules[i];
        m.meta.contains(addr).then_some(m)
    }

    fn nearest_loose(&self, addr: u64) -> Option<Symbol<'_>> {
        let mut best: Option<(u64, &LooseTable)> = None;
        for t in self.loose.iter() {
            if addr > t.syms.last_addr() + TAIL_SLACK {
                continue;
            }
            if let Some(start) = t.syms.symbol_start(addr) {
                if best.is_none_or(|(b, _)| start > b) {
                    best = Some((start, t));
                }
            }
        }
        let (_, t) = best?;
        let (name, off) = t.syms.lookup(addr)?;
        Some(Symbol::Loose { module: &t.module, name, off })
    }

    /// Symbols held: vmlinux, every module table, BPF functions.
    pub fn symbol_count(&self) -> usize {
        self.vmlinux.len() + self.loose.iter().map(|l| l.syms.len()).sum::<usize>() + self.bpf.live_len()
    }

    /// Heap bytes of the symbol data of this snapshot.
    pub fn heap_bytes(&self) -> usize {
        self.vmlinux.heap_bytes()
            + self.loose.iter().map(|l| l.syms.heap_bytes()).sum::<usize>()
            + self.bpf.heap_bytes()
    }

    /// Address of a symbol by name (vmlinux, then modules): a scan, for tools.
    pub fn find(&self, name: &str) -> Option<u64> {
        self.vmlinux
            .find(name)
            .or_else(|| self.loose.iter().find_map(|l| l.syms.find(name)))
            .or_else(|| self.bpf.live().find(|f| &*f.name == name).map(|f| f.start))
    }
}
