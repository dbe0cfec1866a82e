//! `profcol symbols lookup`: names addresses of a user-space binary the way
//! the user_symbols processor does (same table: symbols, separate debug
//! files, DWARF lines, inlined frames, demangling).
//!
//! With `--file`, addresses are file offsets, as the processor looks them
//! up (a sample's address − mapping start + mapping file offset; for a
//! return address the processor subtracts 1 first), or ELF virtual
//! addresses with `--vaddr` (what `addr2line -e` takes). With `--build-id`
//! they are virtual addresses: a separate debug file does not map file
//! offsets (its segments hold no bytes). One line per frame, innermost first:
//! `ADDR FUNCTION FILE:LINE`; the callers an inlined function sits in follow
//! as `ADDR   in FUNCTION FILE:LINE`; `ADDR ?` when nothing names it.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use profcol_processors::user_symbols::table::{BinaryTable, Missing, SearchPaths, Want};

#[derive(clap::Subcommand, Debug)]
pub(crate) enum SymbolsCmd {
    /// Name addresses of a binary: by its build id (found under the debug
    /// directories' .build-id trees) or by its file.
    Lookup {
        /// GNU build id in hex (a debug file must exist under DIR/.build-id/).
        #[arg(long, value_name = "ID", conflicts_with = "file", required_unless_present = "file")]
        build_id: Option<String>,
        /// The binary (executable or shared library).
        #[arg(long, value_name = "PATH")]
        file: Option<PathBuf>,
        /// Directories of separate debug files (repeatable).
        #[arg(long = "debug-dir", value_name = "DIR", default_value = "/usr/lib/debug")]
        debug_dirs: Vec<PathBuf>,
        /// Symbol tables only: no DWARF file, line or inlined frames.
        #[arg(long)]
        no_lines: bool,
        /// ADDRs are ELF virtual addresses, not file offsets (always so with --build-id).
        #[arg(long)]
        vaddr: bool,
        /// Addresses in hex, with or without 0x.
        #[arg(value_name = "ADDR", required = true)]
        addrs: Vec<String>,
    },
}

pub(crate) fn run(cmd: SymbolsCmd) -> anyhow::Result<()> {
    let SymbolsCmd::Lookup { build_id, file, debug_dirs, no_lines, mut vaddr, addrs } = cmd;
    let parsed: Vec<u64> = addrs.iter().map(|a| parse_addr(a)).collect::<anyhow::Result<_>>()?;
    let search = SearchPaths { debug_dirs: debug_dirs.clone(), lines: !no_lines, ..SearchPaths::default() };
    let want = match (build_id, file) {
        (Some(id), _) => {
            let id = id.trim().to_ascii_lowercase();
            if id.len() < 4 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                bail!("--build-id {id:?}: expected the hex build id (as `file` or `readelf -n` print it)");
            }
            let found = debug_dirs
                .iter()
                .map(|d| d.join(".build-id").join(&id[..2]).join(format!("{}.debug", &id[2..])))
                .find(|p| p.exists())
                .with_context(|| {
                    format!(
                        "no debug file for build id {id} under {}; pass --debug-dir or --file",
                        debug_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
                    )
                })?;
            vaddr = true;
            Want { key: Arc::from(id), is_build_id: true, path: Arc::from(&*found.to_string_lossy()) }
        }
        (None, Some(path)) => {
            let f = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
            let elf = profcol_elf::ElfFile::open(&f).with_context(|| format!("reading {} as ELF", path.display()))?;
            let (key, is_build_id) = match elf.gnu_build_id() {
                Some(b) => (profcol_elf::notes::hex(b), true),
                None => (profcol_elf::file_id(&f).with_context(|| format!("reading {}", path.display()))?, false),
            };
            Want { key: Arc::from(key), is_build_id, path: Arc::from(&*path.to_string_lossy()) }
        }
        (None, None) => bail!("give --build-id ID or --file PATH"),
    };
    let table = match BinaryTable::load(&want, None, &search) {
        Ok(t) => t,
        Err(Missing::NoFile) => bail!("{}: not readable as the ELF file with id {}", want.path, want.key),
        Err(Missing::NoSymbols) => {
            bail!("{}: no symbols (stripped, and no debug file found under the debug directories)", want.path)
        }
    };
    let mut out = std::io::stdout().lock();
    for addr in parsed {
        let frames = if vaddr { table.resolve_vaddr(addr) } else { table.resolve(addr).to_vec() };
        if frames.is_empty() {
            writeln!(out, "{addr:#x} ?")?;
        }
        for (i, f) in frames.iter().enumerate() {
            let place = if f.file.is_empty() { String::new() } else { format!(" {}:{}", f.file, f.line) };
            let lead = if i == 0 { "" } else { "  in " };
            writeln!(out, "{addr:#x} {lead}{}{place}", f.name)?;
        }
    }
    Ok(())
}

fn parse_addr(a: &str) -> anyhow::Result<u64> {
    let hex = a.strip_prefix("0x").or_else(|| a.strip_prefix("0X")).unwrap_or(a);
    u64::from_str_radix(hex, 16).with_context(|| format!("{a:?} is not a hex address"))
}
