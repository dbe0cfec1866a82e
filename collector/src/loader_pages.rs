//! Gives back the pages of the executable that only the dynamic loader
//! reads, and the code that only start-up runs.
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
    let page = page_size();
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
    Some((executable()?.bias.checked_add(addr)?, size))
}

/// How long after the service has started its code is given back once more
/// ([`drop_startup_code`]), for the start-up work that goes on after the
/// components' start returned (the node agent's mapped code stayed the same
/// from 0.5 s to 10 s after it started, docs/PERFORMANCE.md). Not later: what
/// the steady state runs faults back in after a drop, a one-off cost that
/// belongs to start-up.
pub const STARTUP_CODE_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// Drops this executable's code pages from its mappings, as its start-up
/// ends. Configuration, schema checks, BPF loading and the rest of start-up
/// run once, but the pages they ran on would stay resident for as long as
/// the agent runs: a node agent maps ~4 MiB of code in its first second and
/// keeps ~3 MiB once dropped (docs/PERFORMANCE.md, #18). What the steady
/// state runs faults back in from the page cache, a minor fault per page
/// (or per 64 KiB window) once. Pages made private by a write into the text
/// (a debugger's or a uprobe's breakpoint) are left mapped: a drop would
/// lose the breakpoint. Returns the resident bytes dropped.
pub fn drop_startup_code() -> usize {
    let Some(Executable { code: segments, .. }) = executable() else {
        return 0;
    };
    let page = page_size();
    let mut dropped = 0;
    for (start, len) in segments {
        // Whole pages of the segment only.
        let lo = start.next_multiple_of(page);
        let hi = (start + len) / page * page;
        if hi <= lo {
            continue;
        }
        let Some(pages) = page_flags(lo, (hi - lo) / page) else { continue };
        // The runs of pages between private copies, each dropped at once.
        let mut first = 0;
        for run in pages.split(|&f| f == PRIVATE_COPY) {
            let addr = (lo + first * page) as *mut libc::c_void;
            first += run.len() + 1;
            if run.is_empty() {
                continue;
            }
            // SAFETY: the run's pages lie inside the executable's code
            // segment, mapped read-only and executable for the process's
            // life and never written (the written pages, private copies,
            // are not in the run); MADV_DONTNEED on a private file mapping
            // unmaps clean file pages, and a later fetch maps the same bytes
            // from the file again.
            if unsafe { libc::madvise(addr, run.len() * page, libc::MADV_DONTNEED) } == 0 {
                dropped += run.iter().filter(|&&f| f == PRESENT).count() * page;
            }
        }
    }
    dropped
}

/// A page of the mapping, as `/proc/self/pagemap` tells it.
const ABSENT: u8 = 0;
const PRESENT: u8 = 1;
/// Present and anonymous: a private copy of the file's page (written to).
const PRIVATE_COPY: u8 = 2;

/// The state of `n` pages from `addr`: bit 63 of a pagemap entry is
/// "present", bit 61 "file page or shared anonymous".
fn page_flags(addr: usize, n: usize) -> Option<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open("/proc/self/pagemap").ok()?;
    f.seek(SeekFrom::Start((addr / page_size() * 8) as u64)).ok()?;
    let mut entries = vec![0u8; n * 8];
    f.read_exact(&mut entries).ok()?;
    Some(
        entries
            .chunks_exact(8)
            .map(|e| {
                let e = u64::from_le_bytes(e.try_into().unwrap_or([0; 8]));
                match (e >> 63 == 1, e >> 61 & 1 == 1) {
                    (false, _) => ABSENT,
                    (true, true) => PRESENT,
                    (true, false) => PRIVATE_COPY,
                }
            })
            .collect(),
    )
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1)
}

/// ELF program header type and flag (the `elf.h` values).
const PT_LOAD: u32 = 1;
const PF_X: u32 = 1;

/// Where the executable was loaded, as the dynamic loader reports it.
struct Executable {
    /// Its link-time addresses plus this are its addresses in memory.
    bias: usize,
    /// Its executable PT_LOAD segments in memory: (start, length).
    code: Vec<(usize, usize)>,
}

fn executable() -> Option<Executable> {
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, _size: usize, out: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `info` is valid for the call, with `dlpi_phnum` program
        // headers at `dlpi_phdr`; `out` is the `Option<Executable>` passed
        // below. The first object reported is the executable.
        unsafe {
            let info = &*info;
            let mut code = Vec::new();
            for i in 0..usize::from(info.dlpi_phnum) {
                let ph = &*info.dlpi_phdr.add(i);
                if ph.p_type == PT_LOAD && ph.p_flags & PF_X != 0 {
                    code.push(((info.dlpi_addr + ph.p_vaddr) as usize, ph.p_memsz as usize));
                }
            }
            *out.cast::<Option<Executable>>() = Some(Executable { bias: info.dlpi_addr as usize, code });
        }
        1
    }
    let mut exe: Option<Executable> = None;
    // SAFETY: the callback only writes through `out`, which points at `exe`
    // for the duration of the call.
    unsafe { libc::dl_iterate_phdr(Some(first), (&raw mut exe).cast()) };
    exe
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

    #[inline(never)]
    fn marker(x: u64) -> u64 {
        x.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(7)
    }

    #[test]
    fn code_pages_are_dropped_but_private_copies_stay_and_code_runs_on() {
        let segments = executable().expect("the test binary's program headers").code;
        let page = page_size();
        let present = || -> usize {
            segments
                .iter()
                .map(|&(start, len)| {
                    let lo = start.next_multiple_of(page);
                    let n = ((start + len) / page * page).saturating_sub(lo) / page;
                    page_flags(lo, n).unwrap().iter().filter(|&&f| f != ABSENT).count()
                })
                .sum()
        };
        // A private copy of one code page, as a breakpoint makes one: the
        // page writable for a moment and its first byte written back.
        let f = marker as fn(u64) -> u64 as usize;
        let p = f / page * page;
        let expect = marker(3);
        // SAFETY (test): the page stays executable throughout (no thread
        // running it can fault) and the byte written is the byte read.
        unsafe {
            let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
            assert_eq!(libc::mprotect(p as *mut libc::c_void, page, rwx), 0);
            let b = std::ptr::read_volatile(f as *const u8);
            std::ptr::write_volatile(f as *mut u8, b);
            assert_eq!(libc::mprotect(p as *mut libc::c_void, page, libc::PROT_READ | libc::PROT_EXEC), 0);
        }
        assert_eq!(page_flags(p, 1).unwrap()[0], PRIVATE_COPY);
        // Some other present code page, to read back after the drop.
        let (start, _) = segments[0];
        let other = (start.next_multiple_of(page)..)
            .step_by(page)
            .find(|&q| q != p && page_flags(q, 1).unwrap()[0] == PRESENT)
            .unwrap();
        // SAFETY (test): a mapped, readable code page.
        let bytes: Vec<u8> = (0..64).map(|i| unsafe { std::ptr::read_volatile((other + i) as *const u8) }).collect();

        let before = present();
        let dropped = drop_startup_code();
        let after = present();
        // Every present page but the private copy went (pages faulted in
        // between the count and the drop only add to it); the code run
        // since (this test's, other tests' threads) faulted some back, each
        // fault mapping up to 16 cached pages around it.
        assert!(before > 16 && dropped / page + 1 >= before, "{dropped} bytes dropped of {before} pages present");
        assert!(after < before, "{before} pages present before the drop, {after} after");
        assert_eq!(page_flags(p, 1).unwrap()[0], PRIVATE_COPY, "the private copy is kept");
        assert_eq!(marker(3), expect);
        // SAFETY (test): as above; the page faults in again from the file.
        let again: Vec<u8> = (0..64).map(|i| unsafe { std::ptr::read_volatile((other + i) as *const u8) }).collect();
        assert_eq!(bytes, again, "code read back from the file is the same");
    }
}
