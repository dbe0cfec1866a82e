//! BPF programs as symbols, read through the bpf syscall: each JIT-ed
//! function's address, length and kernel name (`bpf_prog_<tag>_<func>`),
//! and, where the program has BTF, its function names and source lines.

pub mod btf;
pub mod sys;

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::bpf_progs::{BpfFunc, BpfLine};
use super::error::{Error, Result};

/// Offsets in `struct bpf_prog_info` (232 bytes on 6.x).
mod info {
    pub const SIZE: usize = 232;
    pub const TAG: usize = 8;
    pub const NAME: usize = 64;
    pub const NR_JITED_KSYMS: usize = 104;
    pub const NR_JITED_FUNC_LENS: usize = 108;
    pub const JITED_KSYMS: usize = 112;
    pub const JITED_FUNC_LENS: usize = 120;
    pub const BTF_ID: usize = 128;
    pub const FUNC_INFO_REC_SIZE: usize = 132;
    pub const FUNC_INFO: usize = 136;
    pub const NR_FUNC_INFO: usize = 144;
    pub const NR_LINE_INFO: usize = 148;
    pub const LINE_INFO: usize = 152;
    pub const JITED_LINE_INFO: usize = 160;
    pub const NR_JITED_LINE_INFO: usize = 168;
    pub const LINE_INFO_REC_SIZE: usize = 172;
    pub const JITED_LINE_INFO_REC_SIZE: usize = 176;
    pub const NR_PROG_TAGS: usize = 180;
    pub const PROG_TAGS: usize = 184;
}

fn rd32(b: &[u8], o: usize) -> u32 {
    b.get(o..o + 4).map_or(0, |s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

fn wr32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_ne_bytes());
}

fn wr64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_ne_bytes());
}

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
    let mut first = vec![0u8; info::SIZE];
    sys::obj_info(&fd, &mut first).map_err(bpf_err("BPF_OBJ_GET_INFO_BY_FD"))?;
    let n_ksyms = rd32(&first, info::NR_JITED_KSYMS) as usize;
    if n_ksyms == 0 {
        return Ok(Vec::new()); // not JIT-ed (or addresses hidden)
    }
    let n_lens = rd32(&first, info::NR_JITED_FUNC_LENS) as usize;
    let n_func = rd32(&first, info::NR_FUNC_INFO) as usize;
    let func_rec = rd32(&first, info::FUNC_INFO_REC_SIZE).max(8) as usize;
    let n_line = rd32(&first, info::NR_LINE_INFO) as usize;
    let line_rec = rd32(&first, info::LINE_INFO_REC_SIZE).max(16) as usize;
    let n_jline = rd32(&first, info::NR_JITED_LINE_INFO) as usize;
    let jline_rec = rd32(&first, info::JITED_LINE_INFO_REC_SIZE).max(8) as usize;
    let n_tags = rd32(&first, info::NR_PROG_TAGS) as usize;
    let btf_id = rd32(&first, info::BTF_ID);

    let mut ksyms = vec![0u64; n_ksyms];
    let mut lens = vec![0u32; n_lens];
    let mut funcs = vec![0u8; n_func * func_rec];
    let mut lines = vec![0u8; n_line * line_rec];
    let mut jlines = vec![0u8; n_jline * jline_rec];
    let mut tags = vec![0u8; n_tags * 8];
    let mut second = vec![0u8; info::SIZE];
    wr32(&mut second, info::NR_JITED_KSYMS, n_ksyms as u32);
    wr64(&mut second, info::JITED_KSYMS, ksyms.as_mut_ptr() as u64);
    wr32(&mut second, info::NR_JITED_FUNC_LENS, n_lens as u32);
    wr64(&mut second, info::JITED_FUNC_LENS, lens.as_mut_ptr() as u64);
    wr32(&mut second, info::NR_FUNC_INFO, n_func as u32);
    wr32(&mut second, info::FUNC_INFO_REC_SIZE, func_rec as u32);
    wr64(&mut second, info::FUNC_INFO, funcs.as_mut_ptr() as u64);
    wr32(&mut second, info::NR_LINE_INFO, n_line as u32);
    wr32(&mut second, info::LINE_INFO_REC_SIZE, line_rec as u32);
    wr64(&mut second, info::LINE_INFO, lines.as_mut_ptr() as u64);
    wr32(&mut second, info::NR_JITED_LINE_INFO, n_jline as u32);
    wr32(&mut second, info::JITED_LINE_INFO_REC_SIZE, jline_rec as u32);
    wr64(&mut second, info::JITED_LINE_INFO, jlines.as_mut_ptr() as u64);
    wr32(&mut second, info::NR_PROG_TAGS, n_tags as u32);
    wr64(&mut second, info::PROG_TAGS, tags.as_mut_ptr() as u64);
    sys::obj_info(&fd, &mut second).map_err(bpf_err("BPF_OBJ_GET_INFO_BY_FD"))?;
    drop(fd);

    let prog_tag = &second[info::TAG..info::TAG + 8];
    let prog_name = cstr(&second[info::NAME..info::NAME + 16]);
    let btf_bytes = if btf_id != 0 && (n_func > 0 || n_line > 0) { btf_raw(btf_id).ok() } else { None };
    let btf = match &btf_bytes {
        Some(b) => Some(btf::Btf::parse(b).map_err(|what| Error::Btf { prog_id: id, what })?),
        None => None,
    };

    let mut out: Vec<BpfFunc> = (0..n_ksyms)
        .filter(|&i| ksyms[i] != 0)
        .map(|i| {
            let tag = tags.get(i * 8..i * 8 + 8).unwrap_or(prog_tag);
            let func = btf.as_ref().and_then(|b| {
                let type_id = rd32(funcs.get(i * func_rec..)?, 4);
                b.func_name(type_id)
            });
            // Same rule as the kernel's bpf_get_prog_name().
            let suffix = func.or((i == 0 && !prog_name.is_empty()).then_some(prog_name));
            let mut name = format!("bpf_prog_{}", super::sysfs::hex(tag));
            if let Some(s) = suffix {
                name.push('_');
                name.push_str(s);
            }
            BpfFunc {
                start: ksyms[i],
                len: lens.get(i).copied().unwrap_or(0),
                prog_id: id,
                name: name.into(),
                func: func.map(Arc::from),
                lines: Arc::from([]),
            }
        })
        .collect();

    if let Some(b) = &btf {
        let mut all: Vec<BpfLine> = (0..n_line.min(n_jline))
            .filter_map(|i| {
                let rec = lines.get(i * line_rec..i * line_rec + 16)?;
                let addr = u64::from_ne_bytes(jlines.get(i * jline_rec..i * jline_rec + 8)?.try_into().ok()?);
                let file = b.str_at(rd32(rec, 4))?;
                Some(BpfLine { addr, file: Arc::from(file), line: rd32(rec, 12) >> 10 })
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
    let fd: OwnedFd = sys::btf_fd_by_id(id).map_err(bpf_err("BPF_BTF_GET_FD_BY_ID"))?;
    let mut first = vec![0u8; 32];
    sys::obj_info(&fd, &mut first).map_err(bpf_err("BPF_OBJ_GET_INFO_BY_FD(btf)"))?;
    let size = rd32(&first, 8) as usize;
    let mut data = vec![0u8; size];
    let mut second = vec![0u8; 32];
    wr64(&mut second, 0, data.as_mut_ptr() as u64);
    wr32(&mut second, 8, size as u32);
    sys::obj_info(&fd, &mut second).map_err(bpf_err("BPF_OBJ_GET_INFO_BY_FD(btf)"))?;
    Ok(data)
}

fn cstr(b: &[u8]) -> &str {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    std::str::from_utf8(&b[..end]).unwrap_or("")
}
