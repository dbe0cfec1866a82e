//! BPF programs as symbols, read through the bpf syscall: each JIT-ed
//! function's address, length and kernel name (`bpf_prog_<tag>_<func>`),
//! and, where the program has BTF, its function names and source lines.
//!
//! - [`progs`]: the functions of loaded BPF programs, as symbols.
//! - [`btf`]: their function names and source lines, from the program's BTF.
//! - [`history`]: programs loaded and unloaded over time, so samples are named by what was loaded when taken.
//! - [`progress`]: how far the PERF_RECORD_KSYMBOL listener's reports are complete, for batches that wait on it.

pub mod btf;
pub mod history;
pub mod progress;
pub mod progs;

use std::os::fd::AsFd;
use std::sync::Arc;

use profcol_ebpf::sys;

use super::error::{Error, Result};
use progs::{BpfFunc, BpfLine};

fn bpf_err(cmd: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Bpf { cmd, source }
}

/// Every JIT-ed function of every loaded program.
pub fn enumerate() -> Result<Vec<BpfFunc>> {
    let mut out = Vec::new();
    let mut id = 0;
    while let Some(next) = sys::prog_next_id(id).map_err(bpf_err("BPF_PROG_GET_NEXT_ID"))? {
        id = next;
        match prog_funcs(id) {
            Ok(f) => out.extend(f),
            // Unloaded between the two calls: nothing to name.
            Err(Error::Bpf { source, .. }) if source.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The JIT-ed functions of program `id`.
pub fn prog_funcs(id: u32) -> Result<Vec<BpfFunc>> {
    let fd = sys::prog_fd_by_id(id).map_err(bpf_err("BPF_PROG_GET_FD_BY_ID"))?;
    let counts = sys::prog_info(fd.as_fd()).map_err(bpf_err("BPF_OBJ_GET_INFO_BY_FD"))?;
    if counts.nr_jited_ksyms == 0 {
        return Ok(Vec::new()); // not JIT-ed (or addresses hidden)
    }
    let (info, arrays) = sys::prog_info_arrays(fd.as_fd(), &counts).map_err(bpf_err("BPF_OBJ_GET_INFO_BY_FD"))?;
    drop(fd);

    let prog_name_bytes = info.name.map(|c| c as u8);
    let prog_name = cstr(&prog_name_bytes);
    let has_btf_info = !arrays.func_info.is_empty() || !arrays.line_info.is_empty();
    let btf_bytes = if counts.btf_id != 0 && has_btf_info { btf_raw(counts.btf_id).ok() } else { None };
    let btf = match &btf_bytes {
        Some(b) => Some(btf::Btf::parse(b).map_err(|what| Error::Btf { prog_id: id, what })?),
        None => None,
    };

    let mut out: Vec<BpfFunc> = (arrays.jited_ksyms.iter().enumerate())
        .filter(|&(_, &start)| start != 0)
        .map(|(i, &start)| {
            let tag = arrays.prog_tags.get(i).unwrap_or(&info.tag);
            let func = btf.as_ref().and_then(|b| b.func_name(arrays.func_info.get(i)?.type_id));
            // Same rule as the kernel's bpf_get_prog_name().
            let suffix = func.or((i == 0 && !prog_name.is_empty()).then_some(prog_name));
            let mut name = format!("bpf_prog_{}", super::sysfs::hex(tag));
            if let Some(s) = suffix {
                name.push('_');
                name.push_str(s);
            }
            BpfFunc {
                start,
                len: arrays.jited_func_lens.get(i).copied().unwrap_or(0),
                prog_id: id,
                name: name.into(),
                func: func.map(Arc::from),
                lines: Arc::from([]),
            }
        })
        .collect();

    if let Some(b) = &btf {
        let mut all: Vec<BpfLine> = (arrays.line_info.iter().zip(&arrays.jited_line_info))
            .filter_map(|(rec, &addr)| {
                let file = b.str_at(rec.file_name_off)?;
                // line_col: line number above the low 10 column bits.
                Some(BpfLine { addr, file: Arc::from(file), line: rec.line_col >> 10 })
            })
            .collect();
        all.sort_by_key(|l| l.addr);
        for f in &mut out {
            let mine: Vec<BpfLine> = all.iter().filter(|l| f.contains(l.addr)).cloned().collect();
            f.lines = mine.into();
        }
    }
    Ok(out)
}

/// Raw bytes of BTF object `id`.
fn btf_raw(id: u32) -> Result<Vec<u8>> {
    let fd = sys::btf_fd_by_id(id).map_err(bpf_err("BPF_BTF_GET_FD_BY_ID"))?;
    sys::btf_data(fd.as_fd()).map_err(bpf_err("BPF_OBJ_GET_INFO_BY_FD(btf)"))
}

fn cstr(b: &[u8]) -> &str {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    std::str::from_utf8(&b[..end]).unwrap_or("")
}
