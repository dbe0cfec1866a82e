//! Gives back the pages of the executable that only the dynamic loader reads.
//!
//! Before `main`, ld.so applies the relocation table (`.rela.dyn`: 1.3 MB in
//! a release build, one entry per pointer in the binary's data) and never
//! reads it again; its pages would stay resident for as long as the agent
//! runs, ~1.3 MiB of a node agent's ~20 MiB (docs/PERFORMANCE.md, #18).
//! They are clean pages of the file, so dropping them loses nothing: a read
//! would fault them in again.

/// Drops the resident pages wholly inside `.rela.dyn` from this process's
/// mappings. Returns the bytes dropped (0 when the section is missing, e.g.
/// a static executable, or the executable cannot be read).
pub fn drop_relocation_table() -> usize {
    let Some((start, len)) = relocation_table() else {
        return 0;
    };
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
    // Whole pages only: the pages at either end also hold other sections.
    let lo = start.next_multiple_of(page);
    let hi = (start + len) / page * page;
    if hi <= lo {
        return 0;
    }
    // SAFETY: [lo, hi) lies inside the executable's read-only mapping of
    // `.rela.dyn`, which nothing in the process writes or holds references
    // into; MADV_DONTNEED on a private file mapping only unmaps its pages,
    // and a later access reads the same bytes from the file.
    let dropped = unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_DONTNEED) };
    if dropped == 0 {
        hi - lo
    } else {
        0
    }
}

/// The address range of this executable's `.rela.dyn` in memory.
fn relocation_table() -> Option<(usize, usize)> {
    let file = std::fs::File::open("/proc/self/exe").ok()?;
    let elf = profcol_elf::ElfFile::open(&file).ok()?;
    let addr = usize::try_from(elf.section_address(".rela.dyn")?).ok()?;
    let size = usize::try_from(elf.section_size(".rela.dyn")?).ok()?;
    Some((load_bias()?.checked_add(addr)?, size))
}

/// Where the executable was loaded: its link-time addresses plus this.
fn load_bias() -> Option<usize> {
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, _size: usize, out: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `info` is valid for the call; `out` is the `Option<usize>`
        // passed below. The first object reported is the executable.
        unsafe { *out.cast::<Option<usize>>() = Some((*info).dlpi_addr as usize) };
        1
    }
    let mut bias: Option<usize> = None;
    // SAFETY: the callback only writes through `out`, which points at `bias`
    // for the duration of the call.
    unsafe { libc::dl_iterate_phdr(Some(first), (&raw mut bias).cast()) };
    bias
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the page at `addr` is mapped in (`/proc/self/pagemap`).
    fn present(addr: usize) -> bool {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open("/proc/self/pagemap").unwrap();
        f.seek(SeekFrom::Start((addr / 4096 * 8) as u64)).unwrap();
        let mut e = [0u8; 8];
        f.read_exact(&mut e).unwrap();
        u64::from_le_bytes(e) >> 63 == 1
    }

    #[test]
    fn relocation_pages_are_dropped_and_read_back_unchanged() {
        let (start, len) = relocation_table().expect("a PIE test binary has .rela.dyn");
        assert!(len > 64 * 1024, "{len} bytes of relocations");
        let lo = start.next_multiple_of(4096);
        let pages: Vec<usize> = (lo..start + len - 4096).step_by(4096).collect();
        // SAFETY (test): the range is mapped read-only for the process's life.
        let before: Vec<u8> = pages.iter().map(|&p| unsafe { std::ptr::read_volatile(p as *const u8) }).collect();
        assert!(pages.iter().all(|&p| present(p)), "pages just read are present");

        let dropped = drop_relocation_table();
        assert_eq!(dropped, (start + len) / 4096 * 4096 - lo);
        assert!(pages.iter().all(|&p| !present(p)), "dropped pages are not mapped any more");

        // SAFETY (test): as above; the pages fault in again from the file.
        let after: Vec<u8> = pages.iter().map(|&p| unsafe { std::ptr::read_volatile(p as *const u8) }).collect();
        assert_eq!(before, after, "a later read sees the file's bytes");
    }
}
