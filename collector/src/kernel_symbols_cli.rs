//! `profcol kernel-symbols`: the kernel_symbols store for people and scripts.
//!
//! `lookup` resolves exactly the addresses given (no return-address -1) and
//! prints one line per address, `ADDR NAME+0xOFF [module]`: `[module]` is
//! left out for vmlinux, NAME is `?` when only the module is known, and the
//! line is `ADDR ?` when nothing is. `stats` prints what the store holds.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;

use anyhow::Context;
use profcol_processors::kernel_symbols::snapshot::Symbol;
use profcol_processors::kernel_symbols::store::BpfSource;
use profcol_processors::kernel_symbols::{Store, StoreConfig};

const PROC_KALLSYMS: &str = "/proc/kallsyms";

#[derive(clap::Subcommand, Debug)]
pub(crate) enum KernelSymbolsCmd {
    /// Resolve kernel addresses: one `ADDR NAME+0xOFF [module]` line each.
    Lookup {
        /// kallsyms file to read (a copy of /proc/kallsyms works).
        #[arg(long, value_name = "FILE", default_value = PROC_KALLSYMS)]
        kallsyms: PathBuf,
        /// Directory holding module/ and kernel/notes.
        #[arg(long, value_name = "DIR", default_value = "/sys")]
        sysfs: PathBuf,
        /// Addresses in hex, with or without 0x.
        #[arg(value_name = "ADDR", required = true)]
        addrs: Vec<String>,
    },
    /// Print symbol and module counts, bytes held and parse time.
    Stats {
        #[arg(long, value_name = "FILE", default_value = PROC_KALLSYMS)]
        kallsyms: PathBuf,
        #[arg(long, value_name = "DIR", default_value = "/sys")]
        sysfs: PathBuf,
    },
}

pub(crate) fn run(cmd: KernelSymbolsCmd) -> anyhow::Result<()> {
    match cmd {
        KernelSymbolsCmd::Lookup { kallsyms, sysfs, addrs } => {
            // Parse every address first so a typo fails before the slow read.
            let parsed: Vec<u64> = addrs.iter().map(|a| parse_addr(a)).collect::<anyhow::Result<_>>()?;
            let store = open(&kallsyms, &sysfs)?;
            let g = store.generations().current();
            let mut out = std::io::stdout().lock();
            for addr in parsed {
                writeln!(out, "{}", format_line(addr, g.snapshot.lookup(addr)))?;
            }
            Ok(())
        }
        KernelSymbolsCmd::Stats { kallsyms, sysfs } => {
            let store = open(&kallsyms, &sysfs)?;
            let snap = store.generations().current().snapshot.clone();
            let p = store.last_parse();
            let c = &store.counters;
            let loaded = snap.modules.len();
            let named = snap.modules.iter().filter(|m| m.syms.is_some()).count();
            let ms = |ns: u64| ns as f64 / 1e6;
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "symbols: {} (vmlinux {}, module tables {}, bpf {})",
                snap.symbol_count(),
                snap.vmlinux.len(),
                snap.loose.iter().map(|l| l.syms.len()).sum::<usize>(),
                snap.bpf.live_len()
            )?;
            writeln!(
                out,
                "modules: {loaded} loaded per sysfs ({named} with names), {} kallsyms module tables",
                snap.loose.len()
            )?;
            writeln!(out, "bytes held: {}", snap.heap_bytes())?;
            writeln!(
                out,
                "parse time: {:.1} ms (file read {:.1} ms)",
                ms(c.last_parse_ns.load(Relaxed)),
                ms(c.last_read_ns.load(Relaxed))
            )?;
            writeln!(
                out,
                "lines: {} ({} __pfx_ skipped, {} non-text, {} aliases dropped, {} names truncated, {} malformed)",
                p.lines, p.pfx_skipped, p.non_text, p.aliases, p.truncated, p.malformed
            )?;
            let src = match store.bpf_source() {
                BpfSource::Syscall => "bpf syscall",
                BpfSource::Kallsyms => "[bpf] kallsyms lines",
            };
            writeln!(out, "bpf source: {src}")?;
            Ok(())
        }
    }
}

fn open(kallsyms: &Path, sysfs: &Path) -> anyhow::Result<Store> {
    // BPF programs come from the bpf syscall only when looking at this
    // machine; a kallsyms copy carries its own [bpf] lines.
    let live = kallsyms == Path::new(PROC_KALLSYMS);
    Store::open(StoreConfig { kallsyms: kallsyms.into(), sysfs: sysfs.into(), bpf_syscall: live, ..Default::default() })
        .with_context(|| format!("loading kernel symbols from {}", kallsyms.display()))
}

fn parse_addr(s: &str) -> anyhow::Result<u64> {
    let hex = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")).unwrap_or(s);
    u64::from_str_radix(hex, 16).map_err(|_| {
        anyhow::anyhow!(
            "`{s}` is not a kernel address: give hex addresses such as ffffffff81234567 or 0xffffffff81234567"
        )
    })
}

fn format_line(addr: u64, sym: Option<Symbol<'_>>) -> String {
    match sym {
        Some(Symbol::Kernel { name, off }) => format!("0x{addr:016x} {name}+{off:#x}"),
        Some(Symbol::Module { module, sym: Some((name, off)) }) => {
            format!("0x{addr:016x} {name}+{off:#x} [{}]", module.name)
        }
        Some(Symbol::Module { module, sym: None }) => format!("0x{addr:016x} ? [{}]", module.name),
        Some(Symbol::Loose { module, name, off }) => {
            format!("0x{addr:016x} {name}+{off:#x} [{module}]")
        }
        Some(Symbol::Bpf { func, off, .. }) => {
            format!("0x{addr:016x} {}+{off:#x} [bpf]", func.name)
        }
        None => format!("0x{addr:016x} ?"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_with_or_without_prefix() {
        assert_eq!(parse_addr("0xffffffff81000000").unwrap(), 0xffffffff81000000);
        assert_eq!(parse_addr("ffffffff81000000").unwrap(), 0xffffffff81000000);
        let e = parse_addr("vfs_read").unwrap_err().to_string();
        assert!(e.contains("`vfs_read` is not a kernel address"), "{e}");
    }
}
