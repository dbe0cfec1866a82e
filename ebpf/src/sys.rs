//! The kernel ABI profcol hands to bpf(2) and perf_event_open(2), in one
//! place: the structs are aya-obj's bindgen output of `include/uapi/linux`
//! (`bpf.h`, `perf_event.h`, generated per target architecture), re-exported
//! here; the two syscalls are wrapped so the sizes they pass are always
//! `size_of` the generated type; and the commands profcol uses get safe,
//! typed helpers. Fields are set and read by name, never by byte offset.
//!
//! The kernel accepts a struct larger than its own when the extra tail is
//! zero, and a smaller one from an older userspace, so the generated sizes
//! work on older and newer kernels alike.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

pub use aya_obj::generated::{
    bpf_attr, bpf_btf_info, bpf_cmd, bpf_func_info, bpf_line_info, bpf_prog_info, bpf_prog_type, perf_event_attr,
    perf_event_header, perf_event_mmap_page, perf_event_sample_format, perf_event_type, perf_sw_ids, perf_type_id,
    BPF_OBJ_NAME_LEN, BPF_TAG_SIZE, PERF_FLAG_FD_CLOEXEC,
};

/// `PERF_RECORD_KSYMBOL` up to its name. `perf_event.h` describes record
/// bodies only in comments, so bindgen emits no struct for them:
/// `{ header; u64 addr; u32 len; u16 ksym_type; u16 flags; char name[];
/// struct sample_id sample_id; }`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KsymbolRecord {
    pub header: perf_event_header,
    pub addr: u64,
    pub len: u32,
    pub ksym_type: u16,
    pub flags: u16,
}

/// `KsymbolRecord::flags` bit: the symbol is going away
/// (`PERF_RECORD_KSYMBOL_FLAGS_UNREGISTER`).
pub const PERF_RECORD_KSYMBOL_FLAGS_UNREGISTER: u16 = 1 << 0;

/// `PERF_RECORD_BPF_EVENT`: `{ header; u16 type; u16 flags; u32 id;
/// u8 tag[BPF_TAG_SIZE]; struct sample_id sample_id; }`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BpfEventRecord {
    pub header: perf_event_header,
    pub type_: u16,
    pub flags: u16,
    pub id: u32,
    pub tag: [u8; BPF_TAG_SIZE as usize],
}

/// `BpfEventRecord::type_` of a program load (`PERF_BPF_EVENT_PROG_LOAD`).
pub const PERF_BPF_EVENT_PROG_LOAD: u16 = 1;

/// `PERF_RECORD_COMM` up to its name: `{ header; u32 pid, tid;
/// char comm[]; struct sample_id sample_id; }`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CommRecord {
    pub header: perf_event_header,
    pub pid: u32,
    pub tid: u32,
}

/// `perf_event_header::misc` bit of a `PERF_RECORD_COMM`: the process
/// started a new image (`PERF_RECORD_MISC_COMM_EXEC`).
pub const PERF_RECORD_MISC_COMM_EXEC: u16 = 1 << 13;

/// `PERF_RECORD_MMAP2` up to its file name: `{ header; u32 pid, tid;
/// u64 addr, len, pgoff; u32 maj, min; u64 ino, ino_generation;
/// u32 prot, flags; char filename[]; struct sample_id sample_id; }`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Mmap2Record {
    pub header: perf_event_header,
    pub pid: u32,
    pub tid: u32,
    pub addr: u64,
    pub len: u64,
    pub pgoff: u64,
    pub maj: u32,
    pub min: u32,
    pub ino: u64,
    pub ino_generation: u64,
    pub prot: u32,
    pub flags: u32,
}

/// `perf_event_header::misc` bit of a `PERF_RECORD_MMAP2` that carries a
/// build ID in place of the device and inode
/// (`PERF_RECORD_MISC_MMAP_BUILD_ID`).
pub const PERF_RECORD_MISC_MMAP_BUILD_ID: u16 = 1 << 14;

/// `PERF_RECORD_LOST`: `{ header; u64 id; u64 lost; struct sample_id; }`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LostRecord {
    pub header: perf_event_header,
    pub id: u64,
    pub lost: u64,
}

/// The `sample_id` that ends every non-sample record of an event with
/// `sample_id_all` and `sample_type` `PERF_SAMPLE_TID | PERF_SAMPLE_TIME`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SampleIdTidTime {
    pub pid: u32,
    pub tid: u32,
    pub time: u64,
}

/// The `T` that ends `rec` (a trailing `sample_id`); `None` when `rec` is
/// shorter than `T`.
pub fn read_tail<T: Plain>(rec: &[u8]) -> Option<T> {
    read(&rec[rec.len().checked_sub(size_of::<T>())?..])
}

/// Plain kernel data: copied byte for byte to and from the kernel.
///
/// # Safety
/// Implement only for `#[repr(C)]` types made of integers, arrays of them
/// and unions of such, so that every bit pattern (all zeroes included) is a
/// valid value.
pub unsafe trait Plain: Copy + 'static {}

// SAFETY: each is a #[repr(C)] bindgen struct/union of integers and arrays,
// or a record layout above made of the same.
unsafe impl Plain for bpf_attr {}
// SAFETY: as the impl above.
unsafe impl Plain for bpf_prog_info {}
// SAFETY: as the impl above.
unsafe impl Plain for bpf_btf_info {}
// SAFETY: as the impl above.
unsafe impl Plain for bpf_func_info {}
// SAFETY: as the impl above.
unsafe impl Plain for bpf_line_info {}
// SAFETY: as the impl above.
unsafe impl Plain for perf_event_attr {}
// SAFETY: as the impl above.
unsafe impl Plain for perf_event_header {}
// SAFETY: as the impl above.
unsafe impl Plain for KsymbolRecord {}
// SAFETY: as the impl above.
unsafe impl Plain for BpfEventRecord {}
// SAFETY: as the impl above.
unsafe impl Plain for CommRecord {}
// SAFETY: as the impl above.
unsafe impl Plain for Mmap2Record {}
// SAFETY: as the impl above.
unsafe impl Plain for LostRecord {}
// SAFETY: as the impl above.
unsafe impl Plain for SampleIdTidTime {}
// SAFETY: as the impl above.
unsafe impl Plain for u32 {}
// SAFETY: as the impl above.
unsafe impl Plain for u64 {}
// SAFETY: as the impl above.
unsafe impl<const N: usize> Plain for [u8; N] {}

/// An all-zero `T`, the starting point of every struct passed to the kernel.
pub fn zeroed<T: Plain>() -> T {
    // SAFETY: all-zero is a valid T (Plain).
    unsafe { std::mem::zeroed() }
}

/// The `T` at the start of `bytes`, whatever their alignment; `None` when
/// `bytes` is shorter than `T`.
pub fn read<T: Plain>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: at least size_of::<T>() readable bytes; any bit pattern is a
    // valid T (Plain); read_unaligned has no alignment requirement.
    Some(unsafe { bytes.as_ptr().cast::<T>().read_unaligned() })
}

/// Size passed with every bpf(2) call.
const BPF_ATTR_SIZE: usize = size_of::<bpf_attr>();

/// bpf(cmd, attr, size_of::<bpf_attr>()); the non-negative result.
///
/// # Safety
/// Every pointer in `attr` that `cmd` reads or writes must be valid for the
/// length `attr` gives it (the kernel writes through some of them).
pub unsafe fn bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<i64> {
    // SAFETY: attr is a live, writable bpf_attr of BPF_ATTR_SIZE bytes; the
    // caller vouches for the pointers inside it.
    let r = unsafe {
        libc::syscall(libc::SYS_bpf, cmd as libc::c_long, attr as *mut bpf_attr, BPF_ATTR_SIZE as libc::c_long)
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn owned_fd(r: i64) -> OwnedFd {
    // SAFETY: the kernel returned a fresh fd that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(r as i32) }
}

/// The attr of a `*_GET_NEXT_ID` / `*_GET_FD_BY_ID` command.
fn id_attr(id: u32) -> bpf_attr {
    let mut attr = zeroed::<bpf_attr>();
    attr.__bindgen_anon_6.__bindgen_anon_1.start_id = id;
    attr
}

/// The id of the next loaded program after `start` (`Ok(None)` at the end).
pub fn prog_next_id(start: u32) -> io::Result<Option<u32>> {
    let mut attr = id_attr(start);
    // SAFETY: this command's attr holds no pointers.
    match unsafe { bpf(bpf_cmd::BPF_PROG_GET_NEXT_ID, &mut attr) } {
        // SAFETY: every variant of the union is plain integers.
        Ok(_) => Ok(Some(unsafe { attr.__bindgen_anon_6.next_id })),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// An fd for program `id`.
pub fn prog_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = id_attr(id);
    // SAFETY: this command's attr holds no pointers.
    unsafe { bpf(bpf_cmd::BPF_PROG_GET_FD_BY_ID, &mut attr) }.map(owned_fd)
}

/// An fd for BTF object `id`.
pub fn btf_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = id_attr(id);
    // SAFETY: this command's attr holds no pointers.
    unsafe { bpf(bpf_cmd::BPF_BTF_GET_FD_BY_ID, &mut attr) }.map(owned_fd)
}

/// `BPF_MAP_CREATE` of a `BPF_MAP_TYPE_ARRAY` of `elems` 8-byte values
/// that can be mapped into memory (`BPF_F_MMAPABLE`, Linux >= 5.5), named
/// `name` (at most 15 bytes are kept).
pub fn array_create_mmapable(name: &str, elems: u32) -> io::Result<OwnedFd> {
    let mut attr = zeroed::<bpf_attr>();
    // SAFETY: writing plain integers into the map-create variant.
    let u = unsafe { &mut attr.__bindgen_anon_1 };
    u.map_type = aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_ARRAY as u32;
    u.key_size = 4;
    u.value_size = 8;
    u.max_entries = elems;
    u.map_flags = aya_obj::generated::BPF_F_MMAPABLE;
    for (d, &b) in u.map_name.iter_mut().zip(name.as_bytes().iter().take(15)) {
        *d = b as _;
    }
    // SAFETY: this command's attr holds no pointers.
    unsafe { bpf(bpf_cmd::BPF_MAP_CREATE, &mut attr) }.map(owned_fd)
}

/// `BPF_MAP_UPDATE_ELEM` with no key: pushes `value` into a queue or
/// stack map (`ENOSPC` when full).
pub fn map_push<V: Plain>(map: BorrowedFd<'_>, value: &V) -> io::Result<()> {
    let mut attr = zeroed::<bpf_attr>();
    // SAFETY: writing plain integers into the element variant.
    let u = unsafe { &mut attr.__bindgen_anon_2 };
    u.map_fd = map.as_raw_fd() as u32;
    u.__bindgen_anon_1.value = value as *const V as u64;
    // SAFETY: value is live for the call; the kernel only reads it.
    unsafe { bpf(bpf_cmd::BPF_MAP_UPDATE_ELEM, &mut attr) }.map(drop)
}

/// The `u64` elements of a `BPF_F_MMAPABLE` array map, mapped read-write
/// into this process: read and written with plain atomic loads and stores
/// while BPF programs update them, no syscall.
pub struct MappedU64s {
    ptr: std::ptr::NonNull<std::sync::atomic::AtomicU64>,
    len: usize,
}

// SAFETY: the mapping is shared memory accessed only through atomics.
unsafe impl Send for MappedU64s {}
// SAFETY: as the impl above.
unsafe impl Sync for MappedU64s {}

impl MappedU64s {
    /// Maps the first `len` elements of the array `map` (whose values are
    /// 8 bytes and which has at least `len` elements).
    pub fn new(map: BorrowedFd<'_>, len: usize) -> io::Result<Self> {
        let bytes = (len * 8).max(1);
        // SAFETY: a fresh shared mapping of the map's fd; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("mmap of a BPF array ({len} elements): {e}")));
        }
        let ptr = std::ptr::NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap gave NULL"))?;
        Ok(MappedU64s { ptr, len })
    }

    /// The first element, for plain stores into memory nothing else in
    /// this process reads or writes while they are made.
    pub fn as_mut_ptr(&self) -> *mut u64 {
        self.ptr.as_ptr().cast()
    }

    /// The elements (the kernel keeps the mapping's pages for as long as
    /// it is mapped, whatever happens to the map's fd).
    pub fn elems(&self) -> &[std::sync::atomic::AtomicU64] {
        // SAFETY: `len` 8-byte aligned elements (page-aligned mapping),
        // live until drop, only ever accessed atomically.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for MappedU64s {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), (self.len * 8).max(1)) };
    }
}

/// `BPF_MAP_UPDATE_ELEM`: `map[key] = value` (`BPF_ANY`). For a map of
/// maps the value is the inner map's fd as a `u32`.
pub fn map_update<K: Plain, V: Plain>(map: BorrowedFd<'_>, key: &K, value: &V) -> io::Result<()> {
    let mut attr = zeroed::<bpf_attr>();
    // SAFETY: writing plain integers into the element variant.
    let u = unsafe { &mut attr.__bindgen_anon_2 };
    u.map_fd = map.as_raw_fd() as u32;
    u.key = key as *const K as u64;
    u.__bindgen_anon_1.value = value as *const V as u64;
    // SAFETY: key and value are live for the call; the kernel only reads them.
    unsafe { bpf(bpf_cmd::BPF_MAP_UPDATE_ELEM, &mut attr) }.map(drop)
}

/// `BPF_MAP_DELETE_ELEM`: removes `key` (for an array of maps, empties
/// the slot and drops the map's reference to the inner map).
pub fn map_delete<K: Plain>(map: BorrowedFd<'_>, key: &K) -> io::Result<()> {
    let mut attr = zeroed::<bpf_attr>();
    // SAFETY: writing plain integers into the element variant.
    let u = unsafe { &mut attr.__bindgen_anon_2 };
    u.map_fd = map.as_raw_fd() as u32;
    u.key = key as *const K as u64;
    // SAFETY: key is live for the call; the kernel only reads it.
    unsafe { bpf(bpf_cmd::BPF_MAP_DELETE_ELEM, &mut attr) }.map(drop)
}

/// `BPF_MAP_UPDATE_BATCH`: `map[keys[i]] = values[i]` for every `i` in one
/// syscall (array and hash maps, Linux >= 5.6), instead of one
/// `BPF_MAP_UPDATE_ELEM` each. `keys` and `values` are of the map's key and
/// value sizes and of equal length. On an error, the updates before the
/// failing element stay; the error says how many went in.
pub fn map_update_batch<K: Plain, V: Plain>(map: BorrowedFd<'_>, keys: &[K], values: &[V]) -> io::Result<()> {
    assert_eq!(keys.len(), values.len(), "one value per key");
    let count = u32::try_from(keys.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    if count == 0 {
        return Ok(());
    }
    let mut attr = zeroed::<bpf_attr>();
    attr.batch.map_fd = map.as_raw_fd() as u32;
    attr.batch.keys = keys.as_ptr() as u64;
    attr.batch.values = values.as_ptr() as u64;
    attr.batch.count = count;
    // SAFETY: keys and values are live for `count` elements each; the
    // kernel only reads them (and writes attr.batch.count).
    match unsafe { bpf(bpf_cmd::BPF_MAP_UPDATE_BATCH, &mut attr) } {
        Ok(_) => Ok(()),
        Err(e) => {
            // SAFETY: reading a plain-integer union variant.
            let done = unsafe { attr.batch.count };
            Err(io::Error::new(e.kind(), format!("BPF_MAP_UPDATE_BATCH: {e} after {done} of {count} elements")))
        }
    }
}

/// `BPF_MAP_DELETE_BATCH`: removes every key of `keys` in one syscall (hash
/// maps, Linux >= 5.6). A missing key stops the batch with `ENOENT`; the
/// keys before it are gone.
pub fn map_delete_batch<K: Plain>(map: BorrowedFd<'_>, keys: &[K]) -> io::Result<()> {
    let count = u32::try_from(keys.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    if count == 0 {
        return Ok(());
    }
    let mut attr = zeroed::<bpf_attr>();
    attr.batch.map_fd = map.as_raw_fd() as u32;
    attr.batch.keys = keys.as_ptr() as u64;
    attr.batch.count = count;
    // SAFETY: keys is live for `count` elements; the kernel only reads it.
    unsafe { bpf(bpf_cmd::BPF_MAP_DELETE_BATCH, &mut attr) }.map(drop)
}

/// `BPF_MAP_LOOKUP_BATCH` over a whole hash map: appends every key and
/// value to `keys` and `values`, leaving them in the map, `chunk` elements
/// a syscall (Linux >= 5.6). `chunk` must hold the fullest bucket: the
/// kernel answers `ENOSPC` otherwise, and this retries with a doubled
/// chunk. Elements added while it runs may or may not be read.
pub fn map_read_all<K: Plain, V: Plain>(
    map: BorrowedFd<'_>,
    keys: &mut Vec<K>,
    values: &mut Vec<V>,
    mut chunk: u32,
) -> io::Result<()> {
    // The position token: a bucket index for hash maps (4 bytes; 8 kept).
    let mut token = [0u64; 2];
    let mut started = false;
    loop {
        let have = keys.len();
        keys.reserve(chunk as usize);
        values.reserve(chunk as usize);
        let mut attr = zeroed::<bpf_attr>();
        attr.batch.map_fd = map.as_raw_fd() as u32;
        attr.batch.in_batch = if started { token.as_ptr() as u64 } else { 0 };
        attr.batch.out_batch = token.as_mut_ptr() as u64;
        // SAFETY: (pointer arithmetic only) the spare capacity reserved above.
        attr.batch.keys = unsafe { keys.as_mut_ptr().add(have) } as u64;
        // SAFETY: (pointer arithmetic only) the spare capacity reserved above.
        attr.batch.values = unsafe { values.as_mut_ptr().add(have) } as u64;
        attr.batch.count = chunk;
        // SAFETY: keys and values have `chunk` spare elements of the map's
        // key and value sizes (the caller's K and V); token is 16 writable
        // bytes; the kernel writes at most attr.batch.count elements.
        let r = unsafe { bpf(bpf_cmd::BPF_MAP_LOOKUP_BATCH, &mut attr) };
        // SAFETY: reading a plain-integer union variant.
        let got = unsafe { attr.batch.count }.min(chunk) as usize;
        // SAFETY: the kernel initialised `got` elements past `have` (Plain).
        unsafe {
            keys.set_len(have + got);
            values.set_len(have + got);
        }
        match r {
            Ok(_) => started = true,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && got == 0 && chunk < (1 << 20) => chunk *= 2,
            Err(e) => return Err(io::Error::new(e.kind(), format!("BPF_MAP_LOOKUP_BATCH: {e}"))),
        }
    }
}

/// The info structs `BPF_OBJ_GET_INFO_BY_FD` fills.
pub(crate) trait ObjInfo: Plain {}
impl ObjInfo for bpf_prog_info {}
impl ObjInfo for bpf_btf_info {}

/// The attr asking the kernel to fill `info` (all `size_of::<T>()` bytes).
fn info_attr<T: ObjInfo>(fd: BorrowedFd<'_>, info: &mut T) -> bpf_attr {
    let mut attr = zeroed::<bpf_attr>();
    attr.info.bpf_fd = fd.as_raw_fd() as u32;
    attr.info.info_len = size_of::<T>() as u32;
    attr.info.info = info as *mut T as u64;
    attr
}

/// `BPF_OBJ_GET_INFO_BY_FD` into `info`, which may carry array pointers
/// and counts for the kernel to fill.
///
/// # Safety
/// Each array pointer in `info` with a nonzero count must point to writable
/// memory for that many records of the kernel's record size.
pub(crate) unsafe fn obj_info<T: ObjInfo>(fd: BorrowedFd<'_>, info: &mut T) -> io::Result<()> {
    let mut attr = info_attr(fd, info);
    // SAFETY: attr.info points at `info`, writable for info_len bytes; the
    // caller vouches for the pointers inside `info`.
    unsafe { bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr) }.map(drop)
}

/// A program's fixed info: name, tag, BTF id and the length of each array.
pub fn prog_info(fd: BorrowedFd<'_>) -> io::Result<bpf_prog_info> {
    let mut info = zeroed::<bpf_prog_info>();
    // SAFETY: a zeroed bpf_prog_info asks for no arrays.
    unsafe { obj_info(fd, &mut info) }?;
    Ok(info)
}

/// The per-function arrays of a program's info.
#[derive(Default)]
pub struct ProgArrays {
    /// Start address of each JIT-ed function (0 where addresses are hidden).
    pub jited_ksyms: Vec<u64>,
    /// Length of each JIT-ed function.
    pub jited_func_lens: Vec<u32>,
    /// BTF FUNC type of each function.
    pub func_info: Vec<bpf_func_info>,
    /// Source line records, in instruction order.
    pub line_info: Vec<bpf_line_info>,
    /// JIT-ed address of each `line_info` record.
    pub jited_line_info: Vec<u64>,
    /// Tag of each function.
    pub prog_tags: Vec<[u8; BPF_TAG_SIZE as usize]>,
}

/// A zeroed buffer of `n` records when the kernel's record size is ours;
/// empty (so not asked for) otherwise.
fn records<T: Plain>(n: u32, kernel_rec_size: u32) -> Vec<T> {
    if kernel_rec_size as usize == size_of::<T>() {
        vec![zeroed(); n as usize]
    } else {
        Vec::new()
    }
}

/// A program's arrays, as many of each as `counts` (from [`prog_info`])
/// says; an array whose record size the kernel reports differently from
/// the generated struct is left empty. Also returns the info of this call.
pub fn prog_info_arrays(fd: BorrowedFd<'_>, counts: &bpf_prog_info) -> io::Result<(bpf_prog_info, ProgArrays)> {
    let mut a = ProgArrays {
        jited_ksyms: vec![0; counts.nr_jited_ksyms as usize],
        jited_func_lens: vec![0; counts.nr_jited_func_lens as usize],
        func_info: records(counts.nr_func_info, counts.func_info_rec_size),
        line_info: records(counts.nr_line_info, counts.line_info_rec_size),
        jited_line_info: records(counts.nr_jited_line_info, counts.jited_line_info_rec_size),
        prog_tags: vec![[0; BPF_TAG_SIZE as usize]; counts.nr_prog_tags as usize],
    };
    let mut info = zeroed::<bpf_prog_info>();
    info.nr_jited_ksyms = a.jited_ksyms.len() as u32;
    info.jited_ksyms = a.jited_ksyms.as_mut_ptr() as u64;
    info.nr_jited_func_lens = a.jited_func_lens.len() as u32;
    info.jited_func_lens = a.jited_func_lens.as_mut_ptr() as u64;
    info.nr_func_info = a.func_info.len() as u32;
    info.func_info_rec_size = size_of::<bpf_func_info>() as u32;
    info.func_info = a.func_info.as_mut_ptr() as u64;
    info.nr_line_info = a.line_info.len() as u32;
    info.line_info_rec_size = size_of::<bpf_line_info>() as u32;
    info.line_info = a.line_info.as_mut_ptr() as u64;
    info.nr_jited_line_info = a.jited_line_info.len() as u32;
    info.jited_line_info_rec_size = size_of::<u64>() as u32;
    info.jited_line_info = a.jited_line_info.as_mut_ptr() as u64;
    info.nr_prog_tags = a.prog_tags.len() as u32;
    info.prog_tags = a.prog_tags.as_mut_ptr() as u64;
    // SAFETY: each pointer is a live Vec of exactly its count of records,
    // each of the kernel's record size (checked by `records`; ksyms, lens
    // and tags have fixed sizes in the ABI).
    unsafe { obj_info(fd, &mut info) }?;
    // The kernel fills min(asked, present) and reports how many are present.
    a.jited_ksyms.truncate(info.nr_jited_ksyms as usize);
    a.jited_func_lens.truncate(info.nr_jited_func_lens as usize);
    a.func_info.truncate(info.nr_func_info as usize);
    a.line_info.truncate(info.nr_line_info as usize);
    a.jited_line_info.truncate(info.nr_jited_line_info as usize);
    a.prog_tags.truncate(info.nr_prog_tags as usize);
    Ok((info, a))
}

/// The raw bytes of the BTF object behind `fd`.
pub fn btf_data(fd: BorrowedFd<'_>) -> io::Result<Vec<u8>> {
    let mut sized = zeroed::<bpf_btf_info>();
    // SAFETY: a zeroed bpf_btf_info asks for no data.
    unsafe { obj_info(fd, &mut sized) }?;
    let mut data = vec![0u8; sized.btf_size as usize];
    let mut info = zeroed::<bpf_btf_info>();
    info.btf = data.as_mut_ptr() as u64;
    info.btf_size = data.len() as u32;
    // SAFETY: info.btf points at btf_size writable bytes.
    unsafe { obj_info(fd, &mut info) }?;
    data.truncate(info.btf_size as usize);
    Ok(data)
}

/// Loads raw BTF; used to give test programs func and line info.
pub fn btf_load(btf: &[u8]) -> io::Result<OwnedFd> {
    let mut attr = zeroed::<bpf_attr>();
    attr.__bindgen_anon_7.btf = btf.as_ptr() as u64;
    attr.__bindgen_anon_7.btf_size = btf.len() as u32;
    // SAFETY: btf points at btf_size readable bytes; no log buffer.
    unsafe { bpf(bpf_cmd::BPF_BTF_LOAD, &mut attr) }.map(owned_fd)
}

/// What a program load needs beyond the instructions.
pub struct ProgLoad<'a> {
    pub prog_type: bpf_prog_type,
    /// Raw 8-byte instructions.
    pub insns: &'a [u64],
    /// Program name (the first `BPF_OBJ_NAME_LEN - 1` bytes are kept).
    pub name: &'a str,
    /// BTF that `func_info` and `line_info` refer to; without it they are
    /// not passed.
    pub btf_fd: Option<BorrowedFd<'a>>,
    pub func_info: &'a [bpf_func_info],
    pub line_info: &'a [bpf_line_info],
}

/// `BPF_PROG_LOAD` with a GPL license; used by tests to load a program they
/// then look up.
pub fn prog_load(p: &ProgLoad<'_>) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let mut attr = zeroed::<bpf_attr>();
    // SAFETY: bpf_attr is zeroed and every variant is plain integers, so
    // the BPF_PROG_LOAD variant is valid to borrow.
    let load = unsafe { &mut attr.__bindgen_anon_3 };
    load.prog_type = p.prog_type as u32;
    load.insn_cnt = p.insns.len() as u32;
    load.insns = p.insns.as_ptr() as u64;
    load.license = license.as_ptr() as u64;
    for (d, s) in load.prog_name.iter_mut().zip(p.name.bytes().take(BPF_OBJ_NAME_LEN as usize - 1)) {
        *d = s as libc::c_char;
    }
    if let Some(fd) = p.btf_fd {
        load.prog_btf_fd = fd.as_raw_fd() as u32;
        load.func_info_rec_size = size_of::<bpf_func_info>() as u32;
        load.func_info = p.func_info.as_ptr() as u64;
        load.func_info_cnt = p.func_info.len() as u32;
        load.line_info_rec_size = size_of::<bpf_line_info>() as u32;
        load.line_info = p.line_info.as_ptr() as u64;
        load.line_info_cnt = p.line_info.len() as u32;
    }
    // SAFETY: insns, license, func_info and line_info are live slices of the
    // counts given; no log buffer.
    unsafe { bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr) }.map(owned_fd)
}

/// `BPF_PROG_TEST_RUN`: runs the program `repeat` times over the packet
/// `data` in the calling thread; returns its return value and the mean
/// run time in ns. Used by tests to keep a program on a CPU.
pub fn prog_test_run(fd: BorrowedFd<'_>, data: &[u8], repeat: u32) -> io::Result<(u32, u32)> {
    let mut attr = zeroed::<bpf_attr>();
    // SAFETY: bpf_attr is zeroed and every variant is plain integers, so
    // the BPF_PROG_TEST_RUN variant is valid to borrow.
    let t = unsafe { &mut attr.test };
    t.prog_fd = fd.as_raw_fd() as u32;
    t.data_in = data.as_ptr() as u64;
    t.data_size_in = data.len() as u32;
    t.repeat = repeat;
    // SAFETY: data_in is a live slice of data_size_in bytes; no output buffers.
    unsafe { bpf(bpf_cmd::BPF_PROG_TEST_RUN, &mut attr) }?;
    // SAFETY: as above, the variant the kernel filled in.
    let t = unsafe { attr.test };
    Ok((t.retval, t.duration))
}

/// `attr` as handed to the kernel: `size` set to the generated struct's.
fn sized_perf_attr(attr: &perf_event_attr) -> perf_event_attr {
    let mut a = *attr;
    a.size = size_of::<perf_event_attr>() as u32;
    a
}

/// perf_event_open(2); `attr.size` is set here and the fd is always
/// close-on-exec (`PERF_FLAG_FD_CLOEXEC` is added to `flags`).
pub fn perf_event_open(
    attr: &perf_event_attr,
    pid: i32,
    cpu: i32,
    group_fd: Option<BorrowedFd<'_>>,
    flags: u32,
) -> io::Result<OwnedFd> {
    // A copy: the kernel writes its own size back into attr on E2BIG.
    let mut a = sized_perf_attr(attr);
    let group = group_fd.map_or(-1, |fd| fd.as_raw_fd());
    // SAFETY: `a` is a live, writable perf_event_attr of a.size bytes; the
    // kernel only reads user memory through its pointer fields.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &mut a as *mut perf_event_attr,
            pid as libc::c_int,
            cpu as libc::c_int,
            group as libc::c_int,
            (flags | PERF_FLAG_FD_CLOEXEC) as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned_fd(fd))
}

/// `struct procmap_query` (`linux/fs.h`, Linux 6.11+, 104 bytes; the
/// generated bindings cover `bpf.h` and `perf_event.h` only).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcmapQuery {
    pub size: u64,
    pub query_flags: u64,
    pub query_addr: u64,
    pub vma_start: u64,
    pub vma_end: u64,
    pub vma_flags: u64,
    pub vma_page_size: u64,
    pub vma_offset: u64,
    pub inode: u64,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub vma_name_size: u32,
    pub build_id_size: u32,
    pub vma_name_addr: u64,
    pub build_id_addr: u64,
}

/// `ProcmapQuery::query_flags` bits (`PROCMAP_QUERY_*`).
pub const PROCMAP_QUERY_VMA_EXECUTABLE: u64 = 0x04;
pub const PROCMAP_QUERY_COVERING_OR_NEXT_VMA: u64 = 0x10;
pub const PROCMAP_QUERY_FILE_BACKED_VMA: u64 = 0x20;

/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: libc::c_ulong =
    (3 << 30) | ((size_of::<ProcmapQuery>() as libc::c_ulong) << 16) | ((b'f' as libc::c_ulong) << 8) | 17;

/// The `PROCMAP_QUERY` ioctl on an open `/proc/PID/maps`: the VMA that
/// `flags` select at (or after) `addr`, its path written into `name` when
/// given (`vma_name_size` then says how many bytes, NUL included).
/// Kernels before 6.11 answer `ENOTTY`.
pub fn procmap_query(maps: BorrowedFd<'_>, flags: u64, addr: u64, name: Option<&mut [u8]>) -> io::Result<ProcmapQuery> {
    let mut q = ProcmapQuery {
        size: size_of::<ProcmapQuery>() as u64,
        query_flags: flags,
        query_addr: addr,
        ..Default::default()
    };
    if let Some(name) = name {
        q.vma_name_size = u32::try_from(name.len()).unwrap_or(u32::MAX);
        q.vma_name_addr = name.as_mut_ptr() as u64;
    }
    // SAFETY: q is a live procmap_query whose size field says so; the name
    // buffer, when given, is at least vma_name_size writable bytes and
    // outlives the call.
    let rc = unsafe { libc::ioctl(maps.as_raw_fd(), PROCMAP_QUERY as _, &mut q as *mut ProcmapQuery) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(q)
}

/// The size of a memory page (`sysconf(_SC_PAGESIZE)`).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// Sets `O_NONBLOCK` on `fd` (`FIONBIO`).
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: FIONBIO reads one int through a valid pointer.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONBIO, &on) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A fresh nonblocking, close-on-exec eventfd(2) with a zero counter.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the returned fd is owned below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned_fd(fd.into()))
}

/// Adds one to an eventfd's counter: whoever polls it wakes up.
pub fn eventfd_signal(fd: BorrowedFd<'_>) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64. It fails only on a counter
    // at its maximum (one per signal: never near), when the fd is readable
    // anyway.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), size_of::<u64>()) };
}

/// Reads and resets an eventfd's counter without blocking; 0 when it was
/// not signalled.
pub fn eventfd_take(fd: BorrowedFd<'_>) -> u64 {
    let mut count = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a valid 8-byte buffer.
    let n = unsafe { libc::read(fd.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
    if n == count.len() as isize {
        u64::from_ne_bytes(count)
    } else {
        0
    }
}

/// The kernel's list of online CPUs.
pub const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";

/// The CPUs of a `0-3,6` style list (the format of [`ONLINE_CPUS`], a
/// newline after it). Anything else is an error naming the bad text, an
/// empty list included: no CPU online is not a state this process can read
/// in, and taken as true it would detach every CPU's event. `source` names
/// where the text came from, for the error.
pub(crate) fn parse_cpu_list(source: &str, text: &str) -> io::Result<Vec<u32>> {
    let bad = |what: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{source}: {what} in the CPU list {text:?} (expected e.g. \"0-3,6\")"),
        )
    };
    if text.trim().is_empty() {
        return Err(bad("no CPU".into()));
    }
    let mut out = Vec::new();
    for part in text.trim().split(',') {
        let num = |n: &str| n.parse::<u32>().map_err(|_| bad(format!("{n:?} is not a CPU number")));
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let a = num(part)?;
                (a, a)
            }
        };
        if b < a {
            return Err(bad(format!("range {part:?} runs backwards")));
        }
        if b - a > 1 << 16 {
            return Err(bad(format!("range {part:?} is longer than any machine's")));
        }
        out.extend(a..=b);
    }
    Ok(out)
}

/// The online CPUs, read once from [`ONLINE_CPUS`].
pub fn online_cpus() -> io::Result<Vec<u32>> {
    OnlineCpus::default().read()
}

/// The online CPU list, its file kept open: a re-read is one `pread` at
/// offset 0 (sysfs makes the text anew), not a path walk, an open and a
/// close (a few percent of an idle node agent's CPU when a periodic
/// re-read was done by path).
#[derive(Default)]
pub struct OnlineCpus {
    file: Option<std::fs::File>,
}

impl OnlineCpus {
    /// The online CPUs now (see [`parse_cpu_list`]).
    pub fn read(&mut self) -> io::Result<Vec<u32>> {
        use std::os::unix::fs::FileExt;
        let with_path = |e: io::Error| io::Error::new(e.kind(), format!("{ONLINE_CPUS}: {e}"));
        let file = match &mut self.file {
            Some(f) => f,
            None => self.file.insert(std::fs::File::open(ONLINE_CPUS).map_err(with_path)?),
        };
        // One read as a rule; a longer list (thousands of sparse CPUs) in
        // more, never cut short.
        let (mut text, mut buf) = (Vec::new(), [0u8; 4096]);
        let whole = loop {
            match file.read_at(&mut buf, text.len() as u64) {
                Ok(n) => {
                    text.extend_from_slice(&buf[..n]);
                    if n < buf.len() || text.len() > 1 << 20 {
                        break Ok(());
                    }
                }
                Err(e) => break Err(e),
            }
        };
        if let Err(e) = whole {
            self.file = None; // opened again next time
            return Err(with_path(e));
        }
        parse_cpu_list(ONLINE_CPUS, &String::from_utf8_lossy(&text))
    }
}

/// A perf event's ring, mapped: the kernel's `perf_event_mmap_page`, then
/// a power of two of pages the kernel writes records into. The reader
/// consumes them through `data_tail`; a record that wraps around the end
/// of the data area is copied whole into a buffer the ring keeps (no
/// allocation once it has grown to the largest record).
pub struct PerfRing {
    fd: OwnedFd,
    base: std::ptr::NonNull<u8>,
    /// Bytes of the data area (after the header page).
    data_len: usize,
    page: usize,
    scratch: Vec<u8>,
}

// SAFETY: the mapping is owned by the ring; through &self only the fd is
// used, and the records are only read through &mut self.
unsafe impl Send for PerfRing {}
// SAFETY: as the impl above.
unsafe impl Sync for PerfRing {}

impl PerfRing {
    /// Maps the ring of the perf event `fd` with `data_bytes` of records
    /// (a power-of-two multiple of [`page_size`]; the kernel refuses other
    /// sizes).
    pub fn new(fd: OwnedFd, data_bytes: usize) -> io::Result<Self> {
        let page = page_size();
        // SAFETY: mapping a perf event fd read-write as the perf ABI
        // requires (the kernel checks the size); checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page + data_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("mmap of a perf ring ({data_bytes} bytes of data): {e}")));
        }
        let base = std::ptr::NonNull::new(base.cast()).ok_or_else(|| io::Error::other("mmap gave NULL"))?;
        Ok(PerfRing { fd, base, data_len: data_bytes, page, scratch: Vec::new() })
    }

    /// Opens the perf event `attr` for every process on `cpu` and maps its
    /// ring with `data_bytes` of records (see [`PerfRing::new`]).
    pub fn open(attr: &perf_event_attr, cpu: u32, data_bytes: usize) -> io::Result<Self> {
        let cpu = i32::try_from(cpu).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        PerfRing::new(perf_event_open(attr, -1, cpu, None, 0)?, data_bytes)
    }

    /// The event's fd (readable when the ring passed its wakeup watermark).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// `data_head` (written by the kernel) and `data_tail` (written by the
    /// reader) of the shared `perf_event_mmap_page`.
    fn head_tail(&self) -> (&AtomicU64, &AtomicU64) {
        let page = self.base.as_ptr().cast::<perf_event_mmap_page>();
        // SAFETY: the first mapped page is the kernel's perf_event_mmap_page,
        // mapped as long as self; data_head and data_tail are aligned u64s
        // shared with the kernel, so they are only accessed atomically.
        unsafe {
            (
                AtomicU64::from_ptr(std::ptr::addr_of_mut!((*page).data_head)),
                AtomicU64::from_ptr(std::ptr::addr_of_mut!((*page).data_tail)),
            )
        }
    }

    /// Hands every record in the ring to `f` (header included, in the
    /// order written) and frees their space. Returns `false` when a record
    /// header was malformed (never expected: the kernel writes whole
    /// records); the rest of the ring is then dropped, so one bad header
    /// cannot stall the ring.
    pub fn drain(&mut self, mut f: impl FnMut(&[u8])) -> bool {
        // Kept across drains (taken for the borrow of head and tail).
        let mut scratch = std::mem::take(&mut self.scratch);
        let (head_at, tail_at) = self.head_tail();
        let head = head_at.load(Ordering::Acquire);
        let mut tail = tail_at.load(Ordering::Relaxed);
        // SAFETY: the data area follows the header page, data_len bytes,
        // mapped as long as self.
        let data = unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(self.page), self.data_len) };
        const HEADER: usize = size_of::<perf_event_header>();
        let mut well_formed = true;
        while tail < head {
            let at = (tail % self.data_len as u64) as usize;
            let mut header = [0u8; HEADER];
            copy_wrapped(data, at, &mut header);
            let size = read::<perf_event_header>(&header).map_or(0, |h| usize::from(h.size));
            if size < HEADER || tail + size as u64 > head {
                well_formed = false;
                tail = head;
                break;
            }
            scratch.clear();
            scratch.resize(size, 0);
            copy_wrapped(data, at, &mut scratch);
            f(&scratch);
            tail += size as u64;
        }
        tail_at.store(tail, Ordering::Release);
        self.scratch = scratch;
        well_formed
    }
}

impl AsRawFd for PerfRing {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for PerfRing {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.page + self.data_len) };
    }
}

/// Fills `out` from `data` starting at `at`, continuing at the start of
/// `data` past its end (a ring's record that wraps around).
fn copy_wrapped(data: &[u8], at: usize, out: &mut [u8]) {
    let first = out.len().min(data.len() - at);
    out[..first].copy_from_slice(&data[at..at + first]);
    let rest = out.len() - first;
    out[first..].copy_from_slice(&data[..rest]);
}

/// A read-only private mapping of a whole file; None when the file is empty
/// or cannot be mapped (sysfs BTF before Linux 6.16, which also refuses
/// shared mappings).
pub(crate) fn map_read_only(file: &std::fs::File) -> Option<memmap2::Mmap> {
    if file.metadata().ok()?.len() == 0 {
        return None;
    }
    // SAFETY: read-only and private; the files mapped here (the kernel's
    // BTF) do not change while mapped.
    unsafe { memmap2::MmapOptions::new().map_copy_read_only(file) }.ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn sizes_handed_to_the_kernel_are_the_generated_sizes() {
        assert_eq!(BPF_ATTR_SIZE, size_of::<bpf_attr>());
        let file = std::fs::File::open("/dev/null").unwrap();
        let mut prog = zeroed::<bpf_prog_info>();
        let attr = info_attr(file.as_fd(), &mut prog);
        // SAFETY: reading a plain-integer union variant.
        let info = unsafe { attr.info };
        assert_eq!(info.info_len as usize, size_of::<bpf_prog_info>());
        assert_eq!(info.info, &mut prog as *mut bpf_prog_info as u64);
        assert_eq!(info.bpf_fd as i32, file.as_raw_fd());
        let mut btf = zeroed::<bpf_btf_info>();
        // SAFETY: as above.
        assert_eq!(unsafe { info_attr(file.as_fd(), &mut btf).info.info_len } as usize, size_of::<bpf_btf_info>());
        let mut perf = zeroed::<perf_event_attr>();
        perf.size = 64; // whatever the caller left there
        assert_eq!(sized_perf_attr(&perf).size as usize, size_of::<perf_event_attr>());
    }

    /// The generated structs are at least the sizes profcol used to write out
    /// by hand (bpf_attr 144, bpf_prog_info 232, PERF_ATTR_SIZE_VER8 128),
    /// and the fields it reads sit where the uapi headers put them.
    #[test]
    fn generated_layouts_match_the_uapi() {
        assert!(size_of::<bpf_attr>() >= 144);
        assert!(size_of::<bpf_prog_info>() >= 232);
        assert!(size_of::<perf_event_attr>() >= 128);
        assert_eq!(size_of::<bpf_btf_info>(), 32);
        assert_eq!(size_of::<bpf_func_info>(), 8);
        assert_eq!(size_of::<bpf_line_info>(), 16);
        assert_eq!(size_of::<perf_event_header>(), 8);
        assert_eq!(offset_of!(perf_event_mmap_page, data_head), 1024);
        assert_eq!(offset_of!(perf_event_mmap_page, data_tail), 1032);
        assert_eq!(offset_of!(bpf_prog_info, nr_jited_ksyms), 104);
        assert_eq!(offset_of!(bpf_prog_info, prog_tags), 184);
        assert_eq!(offset_of!(perf_event_attr, clockid), 92);
        // Name follows the fixed part; tag ends the BPF event body.
        assert_eq!(size_of::<KsymbolRecord>(), 24);
        assert_eq!(size_of::<BpfEventRecord>(), 24);
        assert_eq!(size_of::<CommRecord>(), 16);
        assert_eq!(size_of::<LostRecord>(), 24);
        assert_eq!(size_of::<SampleIdTidTime>(), 16);
        assert_eq!(offset_of!(Mmap2Record, maj), 40);
        assert_eq!(offset_of!(Mmap2Record, ino), 48);
        assert_eq!(size_of::<Mmap2Record>(), 72);
        assert_eq!(size_of::<ProcmapQuery>(), 104);
        assert_eq!(PROCMAP_QUERY, 0xC068_6611);
    }

    #[test]
    fn perf_attr_bitfields_land_on_the_uapi_bits() {
        let mut a = zeroed::<perf_event_attr>();
        a.set_watermark(1);
        a.set_sample_id_all(1);
        a.set_use_clockid(1);
        a.set_ksymbol(1);
        a.set_bpf_event(1);
        // SAFETY: the bitfield unit is 8 initialized bytes inside `a`.
        let flags = unsafe { std::ptr::addr_of!(a._bitfield_1).cast::<u64>().read_unaligned() };
        assert_eq!(flags, (1 << 14) | (1 << 18) | (1 << 25) | (1 << 29) | (1 << 30));
    }

    #[test]
    fn read_is_bounded_and_unaligned() {
        let mut bytes = vec![0u8; 1 + size_of::<perf_event_header>()];
        bytes[1..5].copy_from_slice(&17u32.to_ne_bytes());
        bytes[7..9].copy_from_slice(&40u16.to_ne_bytes());
        let h = read::<perf_event_header>(&bytes[1..]).unwrap();
        assert_eq!((h.type_, h.size), (perf_event_type::PERF_RECORD_KSYMBOL as u32, 40));
        assert!(read::<perf_event_header>(&bytes[2..]).is_none());
    }

    #[test]
    fn cpu_lists_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cpu_list("t", "0-3,5,7-8\n").unwrap(), vec![0, 1, 2, 3, 5, 7, 8]);
        assert_eq!(parse_cpu_list("t", "0\n").unwrap(), vec![0]);
    }

    #[test]
    fn malformed_cpu_lists_are_errors_naming_the_file_and_the_text() {
        for (bad, says) in [
            ("", "no CPU"),
            ("\n", "no CPU"),
            ("3-1", "\"3-1\" runs backwards"),
            ("x", "\"x\" is not a CPU number"),
            ("0-", "\"\" is not a CPU number"),
            ("1,,2", "\"\" is not a CPU number"),
            ("1,a", "\"a\" is not a CPU number"),
            ("0-4294967295", "longer than any machine's"),
            ("-1", "\"\" is not a CPU number"),
        ] {
            let e = parse_cpu_list("/sys/x/online", bad).unwrap_err();
            let msg = e.to_string();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(msg.starts_with("/sys/x/online: "), "{msg}");
            assert!(msg.contains(says), "{bad:?}: {msg}");
            assert!(msg.contains(&format!("{bad:?}")), "the bad text is quoted: {msg}");
        }
    }

    /// The file kept open reads the same list as a fresh open, and a second
    /// read (at offset 0 again) as well.
    #[test]
    fn online_cpus_read_twice_from_one_open_file() {
        let fresh = online_cpus().expect("online CPUs");
        assert!(!fresh.is_empty());
        let mut kept = OnlineCpus::default();
        assert_eq!(kept.read().unwrap(), fresh);
        assert_eq!(kept.read().unwrap(), fresh);
    }

    /// A shared memory file laid out like a perf event's mapping (header
    /// page, then the data area), to drive [`PerfRing`] where the kernel's
    /// own ring cannot be made to wrap on demand.
    fn fake_ring(data_bytes: usize) -> (PerfRing, std::fs::File) {
        // SAFETY: plain syscall; the fd is owned right after.
        let fd = unsafe { libc::memfd_create(c"perf-ring".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "{}", io::Error::last_os_error());
        let fd = owned_fd(fd.into());
        let file = std::fs::File::from(fd.try_clone().unwrap());
        file.set_len((page_size() + data_bytes) as u64).unwrap();
        (PerfRing::new(fd, data_bytes).unwrap(), file)
    }

    /// Writes `bytes` at ring position `pos` (wrapping), as the kernel does.
    fn put(file: &std::fs::File, data_bytes: usize, pos: u64, bytes: &[u8]) {
        use std::os::unix::fs::FileExt;
        for (i, b) in bytes.iter().enumerate() {
            let at = (pos as usize + i) % data_bytes;
            file.write_at(&[*b], (page_size() + at) as u64).unwrap();
        }
    }

    fn set(file: &std::fs::File, field: usize, v: u64) {
        use std::os::unix::fs::FileExt;
        file.write_at(&v.to_ne_bytes(), field as u64).unwrap();
    }

    fn rec(type_: u32, body: &[u8]) -> Vec<u8> {
        let h = perf_event_header { type_, misc: 0, size: (8 + body.len()) as u16 };
        let mut r = Vec::new();
        r.extend_from_slice(&h.type_.to_ne_bytes());
        r.extend_from_slice(&h.misc.to_ne_bytes());
        r.extend_from_slice(&h.size.to_ne_bytes());
        r.extend_from_slice(body);
        r
    }

    #[test]
    fn ring_records_that_wrap_around_the_end_come_whole() {
        let data = page_size();
        let (mut ring, file) = fake_ring(data);
        let head_at = offset_of!(perf_event_mmap_page, data_head);
        let tail_at = offset_of!(perf_event_mmap_page, data_tail);
        // Three records starting 4 bytes before the end: the first one's
        // header wraps, the others lie past the wrap. Positions grow
        // without bound, as the kernel's do.
        let start = 5 * data as u64 - 4;
        let recs = [rec(7, &[1; 24]), rec(8, &[2; 40]), rec(9, &[3; 8])];
        let mut pos = start;
        for r in &recs {
            put(&file, data, pos, r);
            pos += r.len() as u64;
        }
        set(&file, tail_at, start);
        set(&file, head_at, pos);
        let mut seen = Vec::new();
        assert!(ring.drain(|r| seen.push(r.to_vec())));
        assert_eq!(seen, recs);
        // The space is handed back up to the head.
        use std::os::unix::fs::FileExt;
        let mut tail = [0u8; 8];
        file.read_at(&mut tail, tail_at as u64).unwrap();
        assert_eq!(u64::from_ne_bytes(tail), pos);
        // Nothing new: nothing handed out.
        assert!(ring.drain(|_| panic!("no record")));
        // A record header claiming more than was written is malformed: the
        // ring is freed past it rather than stalled on it.
        put(&file, data, pos, &rec(7, &[0; 8])[..6]);
        put(&file, data, pos + 6, &200u16.to_ne_bytes());
        set(&file, head_at, pos + 16);
        assert!(!ring.drain(|_| panic!("no record")));
        file.read_at(&mut tail, tail_at as u64).unwrap();
        assert_eq!(u64::from_ne_bytes(tail), pos + 16);
    }

    #[test]
    fn eventfd_signals_are_taken_once() {
        let fd = eventfd().unwrap();
        assert_eq!(eventfd_take(fd.as_fd()), 0);
        eventfd_signal(fd.as_fd());
        eventfd_signal(fd.as_fd());
        assert_eq!(eventfd_take(fd.as_fd()), 2);
        assert_eq!(eventfd_take(fd.as_fd()), 0);
    }
}
