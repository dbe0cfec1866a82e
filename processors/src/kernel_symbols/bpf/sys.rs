//! Raw bpf(2) calls: just the commands symbolization needs, plus program
//! and BTF loading for tests. Layouts follow include/uapi/linux/bpf.h.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

pub const BPF_PROG_LOAD: u32 = 5;
pub const BPF_PROG_GET_NEXT_ID: u32 = 11;
pub const BPF_PROG_GET_FD_BY_ID: u32 = 13;
pub const BPF_OBJ_GET_INFO_BY_FD: u32 = 15;
pub const BPF_BTF_LOAD: u32 = 18;
pub const BPF_BTF_GET_FD_BY_ID: u32 = 19;

/// `union bpf_attr`, as bytes with typed setters (the union is 144 bytes
/// on 6.x; older kernels accept a shorter size if the tail is zero).
#[repr(C, align(8))]
pub struct Attr(pub [u8; 144]);

impl Default for Attr {
    fn default() -> Self {
        Attr([0; 144])
    }
}

impl Attr {
    pub fn u32(mut self, off: usize, v: u32) -> Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    pub fn u64(mut self, off: usize, v: u64) -> Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    pub fn get_u32(&self, off: usize) -> u32 {
        u32::from_ne_bytes(self.0[off..off + 4].try_into().unwrap_or([0; 4]))
    }
}

/// bpf(cmd, attr); returns the non-negative result.
pub fn bpf(cmd: u32, attr: &mut Attr) -> io::Result<i64> {
    // SAFETY: attr points to a live, writable, 144-byte bpf_attr; the kernel
    // reads and writes at most that many bytes.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd as libc::c_long, attr as *mut Attr, 144 as libc::c_long) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn fd_result(r: i64) -> OwnedFd {
    // SAFETY: the kernel returned a fresh fd that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(r as i32) }
}

/// Next program id after `start` (`Ok(None)` at the end).
pub fn prog_next_id(start: u32) -> io::Result<Option<u32>> {
    let mut a = Attr::default().u32(0, start);
    match bpf(BPF_PROG_GET_NEXT_ID, &mut a) {
        Ok(_) => Ok(Some(a.get_u32(4))),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

pub fn prog_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut a = Attr::default().u32(0, id);
    bpf(BPF_PROG_GET_FD_BY_ID, &mut a).map(fd_result)
}

pub fn btf_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut a = Attr::default().u32(0, id);
    bpf(BPF_BTF_GET_FD_BY_ID, &mut a).map(fd_result)
}

/// BPF_OBJ_GET_INFO_BY_FD into `info` (a zeroed or partly filled struct).
pub fn obj_info(fd: &OwnedFd, info: &mut [u8]) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut a =
        Attr::default().u32(0, fd.as_raw_fd() as u32).u32(4, info.len() as u32).u64(8, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a).map(|_| ())
}

/// Loads raw BTF; used to give test programs func and line info.
pub fn btf_load(btf: &[u8]) -> io::Result<OwnedFd> {
    let mut a = Attr::default().u64(0, btf.as_ptr() as u64).u32(16, btf.len() as u32);
    bpf(BPF_BTF_LOAD, &mut a).map(fd_result)
}

/// What a program load needs beyond the instructions.
#[derive(Default)]
pub struct ProgLoad<'a> {
    pub prog_type: u32,
    /// Raw 8-byte instructions.
    pub insns: &'a [u64],
    pub name: &'a str,
    pub btf_fd: Option<&'a OwnedFd>,
    /// `bpf_func_info` records (insn_off, type_id).
    pub func_info: &'a [[u32; 2]],
    /// `bpf_line_info` records (insn_off, file_name_off, line_off, line_col).
    pub line_info: &'a [[u32; 4]],
}

/// BPF_PROG_LOAD; used by tests to load a program they then look up.
pub fn prog_load(p: &ProgLoad<'_>) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    let license = b"GPL\0";
    let mut name = [0u8; 16];
    for (d, s) in name.iter_mut().zip(p.name.bytes().take(15)) {
        *d = s;
    }
    let mut a = Attr::default()
        .u32(0, p.prog_type)
        .u32(4, p.insns.len() as u32)
        .u64(8, p.insns.as_ptr() as u64)
        .u64(16, license.as_ptr() as u64);
    a.0[48..64].copy_from_slice(&name);
    if let Some(fd) = p.btf_fd {
        a = a
            .u32(72, fd.as_raw_fd() as u32)
            .u32(76, 8)
            .u64(80, p.func_info.as_ptr() as u64)
            .u32(88, p.func_info.len() as u32)
            .u32(92, 16)
            .u64(96, p.line_info.as_ptr() as u64)
            .u32(104, p.line_info.len() as u32);
    }
    bpf(BPF_PROG_LOAD, &mut a).map(fd_result)
}
