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
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

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
unsafe impl Plain for bpf_prog_info {}
unsafe impl Plain for bpf_btf_info {}
unsafe impl Plain for bpf_func_info {}
unsafe impl Plain for bpf_line_info {}
unsafe impl Plain for perf_event_attr {}
unsafe impl Plain for perf_event_header {}
unsafe impl Plain for KsymbolRecord {}
unsafe impl Plain for BpfEventRecord {}
unsafe impl Plain for u32 {}
unsafe impl Plain for u64 {}
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

// The mapping is shared memory accessed only through atomics.
unsafe impl Send for MappedU64s {}
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
pub trait ObjInfo: Plain {}
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
pub unsafe fn obj_info<T: ObjInfo>(fd: BorrowedFd<'_>, info: &mut T) -> io::Result<()> {
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

/// A read-only private mapping of a whole file; None when the file is empty
/// or cannot be mapped (sysfs BTF before Linux 6.16, which also refuses
/// shared mappings).
pub fn map_read_only(file: &std::fs::File) -> Option<memmap2::Mmap> {
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
    use std::os::fd::AsFd;

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
}
