//! Gives back the pages of the executable that only the dynamic loader
//! reads, the code and read-only data that only start-up uses, and, as
//! batches arrive, those used since the last drop.
//!
//! Before `main`, ld.so applies the relocation table (`.rela.dyn`: 1.3 MB in
//! a release build, one entry per pointer in the binary's data) and never
//! reads it again; its pages would stay resident for as long as the agent
//! runs, ~1.3 MiB of a node agent's ~20 MiB (docs/PERFORMANCE.md, #18).
//! They are clean pages of the file, so dropping them loses nothing: a read
//! would fault them in again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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

/// How long after the service has started its read-only pages are given
/// back once more ([`drop_read_only`]), for the start-up work that goes on
/// after the components' start returned (the node agent's mapped code
/// stayed the same from 0.5 s to 10 s after it started,
/// docs/PERFORMANCE.md). Not later: what the steady state runs faults back
/// in after a drop, a one-off cost that belongs to start-up.
pub const STARTUP_CODE_SETTLE: Duration = Duration::from_secs(2);

/// Drops the pages of this executable's read-only segments (its code, and
/// its read-only data: constants, strings, unwind and exception tables)
/// from its mappings, as start-up ends and between batches
/// ([`drop_read_only_between_batches`]). Configuration, schema checks, BPF
/// loading and the rest of start-up run once, but the pages they ran on
/// and read would stay resident for as long as the agent runs: a node
/// agent maps ~4 MiB of code in its first second and keeps ~3 MiB once
/// dropped (docs/PERFORMANCE.md, #18). What the steady state runs and
/// reads faults back in from the page cache, a minor fault per page (or
/// per 64 KiB window) once. Pages made private by a write (a debugger's or
/// a uprobe's breakpoint) are left mapped: a drop would lose the write.
/// The relocated data (`.data.rel.ro`) is in a writable segment, not
/// touched. Returns the resident bytes dropped.
pub fn drop_read_only() -> usize {
    let Some(Executable { read_only: segments, .. }) = executable() else {
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
            // SAFETY: the run's pages lie inside one of the executable's
            // segments mapped without write permission for the process's
            // life and never written (the written pages, private copies,
            // are not in the run); MADV_DONTNEED on a private file mapping
            // unmaps clean file pages, and a later access maps the same
            // bytes from the file again.
            if unsafe { libc::madvise(addr, run.len() * page, libc::MADV_DONTNEED) } == 0 {
                dropped += run.iter().filter(|&&f| f == PRESENT).count() * page;
            }
        }
    }
    dropped
}

/// Read-only pages are given back at most this often as batches arrive
/// ([`drop_read_only_between_batches`]).
pub const BATCH_DROP_EVERY: Duration = Duration::from_secs(30);

/// Whether [`drop_read_only_between_batches`] and
/// [`drop_read_only_between_starts`] drop: set by the agent's `main`
/// ([`give_back_read_only`]), off in tests and tools.
static GIVE_BACK: AtomicBool = AtomicBool::new(false);
/// When pages were last dropped between batches.
static BATCH_DROPS: Throttle = Throttle::new();

/// Lets one caller at a time through, at most once per period.
struct Throttle {
    /// When a caller was last let through: ms since [`since`]'s start
    /// ([`Throttle::NEVER`]: not yet).
    last_ms: AtomicU64,
}

impl Throttle {
    const NEVER: u64 = u64::MAX;

    const fn new() -> Self {
        Throttle { last_ms: AtomicU64::new(Self::NEVER) }
    }

    /// Whether the caller at `now_ms` goes through: none has for `every_ms`
    /// (or ever), and no other caller took the turn first.
    fn take(&self, now_ms: u64, every_ms: u64) -> bool {
        let last = self.last_ms.load(Ordering::Relaxed);
        (last == Self::NEVER || now_ms.saturating_sub(last) >= every_ms)
            && self.last_ms.compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }
}

/// Turns on [`drop_read_only_between_batches`] and
/// [`drop_read_only_between_starts`] for this process.
pub fn give_back_read_only() {
    GIVE_BACK.store(true, Ordering::Relaxed);
}

/// Drops the read-only pages mapped so far ([`drop_read_only`]) before a
/// receiver starts, once turned on ([`give_back_read_only`]): what the
/// components before it ran (the kernel symbol store's parse, the
/// exporters' set-up) is not resident while the receiver's own start-up
/// (the BPF object's load) maps its code and its rings.
pub fn drop_read_only_between_starts() -> usize {
    if GIVE_BACK.load(Ordering::Relaxed) {
        drop_read_only()
    } else {
        0
    }
}

/// Drops the read-only pages mapped since the last drop
/// ([`drop_read_only`]) as a batch enters a pipeline, at most once per
/// [`BATCH_DROP_EVERY`]. A node agent's report (the receiver's build,
/// symbolization, conversion, encoding, compression) runs once a minute,
/// and its code stayed mapped between reports on top of what the sampler
/// runs every second: at the next report the agent held both and the
/// report's heap at once, its peak (docs/PERFORMANCE.md, #18). Dropped
/// here, a report maps only the code it runs from here on, and what the
/// sampler runs faults back once, a few dozen minor faults a minute. A
/// busy gateway pays one drop per [`BATCH_DROP_EVERY`]. Returns the
/// resident bytes dropped (0 when off or too soon).
pub fn drop_read_only_between_batches() -> usize {
    if !GIVE_BACK.load(Ordering::Relaxed) {
        return 0;
    }
    // Below NEVER: 584 million years.
    let now = u64::try_from(since().elapsed().as_millis()).unwrap_or(Throttle::NEVER - 1);
    if BATCH_DROPS.take(now, BATCH_DROP_EVERY.as_millis() as u64) {
        drop_read_only()
    } else {
        0
    }
}

/// The clock of [`BATCH_DROPS`].
fn since() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
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
const PF_W: u32 = 2;

/// Where the executable was loaded, as the dynamic loader reports it.
struct Executable {
    /// Its link-time addresses plus this are its addresses in memory.
    bias: usize,
    /// Its PT_LOAD segments without write permission (code, read-only
    /// data) in memory: (start, length).
    read_only: Vec<(usize, usize)>,
}

fn executable() -> Option<Executable> {
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, _size: usize, out: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `info` is valid for the call, with `dlpi_phnum` program
        // headers at `dlpi_phdr`; `out` is the `Option<Executable>` passed
        // below. The first object reported is the executable.
        unsafe {
            let info = &*info;
            let mut read_only = Vec::new();
            for i in 0..usize::from(info.dlpi_phnum) {
                let ph = &*info.dlpi_phdr.add(i);
                if ph.p_type == PT_LOAD && ph.p_flags & PF_W == 0 {
                    read_only.push(((info.dlpi_addr + ph.p_vaddr) as usize, ph.p_memsz as usize));
                }
            }
            *out.cast::<Option<Executable>>() = Some(Executable { bias: info.dlpi_addr as usize, read_only });
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
    use std::sync::Mutex;

    /// The tests drop pages of the whole test binary: one at a time, or
    /// one's drop takes the pages another counts on.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

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
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
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
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let segments = executable().expect("the test binary's program headers").read_only;
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
        let dropped = drop_read_only();
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

    /// A table in `.rodata` (read-only data), and a pointer to it that the
    /// loader relocated at start (`.data.rel.ro`, in a writable segment).
    /// 256 KiB: its middle 64 KiB window holds nothing else, so no other
    /// read's fault-around maps its pages.
    static TABLE: [u64; 32 * 1024] = table();
    static TABLE_REF: &[u64] = &TABLE;

    const fn table() -> [u64; 32 * 1024] {
        let mut t = [0u64; 32 * 1024];
        let mut i = 0;
        while i < t.len() {
            t[i] = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            i += 1;
        }
        t
    }

    #[test]
    fn batch_drops_are_one_per_period_from_the_first() {
        let t = Throttle::new();
        assert!(t.take(5, 30_000), "the first caller goes through at once");
        assert!(!t.take(5, 30_000), "not twice at the same time");
        assert!(!t.take(30_004, 30_000));
        assert!(t.take(30_005, 30_000));
        assert!(!t.take(59_000, 30_000));
        // A clock read before another caller's turn does not go through.
        assert!(!t.take(10, 30_000));
    }

    #[test]
    fn read_only_data_is_dropped_and_read_back_and_relocated_data_stays() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        // A page in the table's middle 64 KiB window.
        let p = (TABLE.as_ptr() as usize + 128 * 1024).next_multiple_of(64 * 1024);
        // SAFETY (test): a byte of a static, mapped for the process's life.
        let b = unsafe { std::ptr::read_volatile(p as *const u64) };
        assert_eq!(page_flags(p, 1).unwrap()[0], PRESENT, "a page of .rodata just read is present");

        assert!(drop_read_only() > 0);
        assert_eq!(page_flags(p, 1).unwrap()[0], ABSENT, "the .rodata page was dropped");
        // SAFETY (test): as above; the page faults in again from the file.
        assert_eq!(unsafe { std::ptr::read_volatile(p as *const u64) }, b);
        // The relocated pointer still points at the table, and every value
        // read back from the file is the one built.
        assert_eq!(TABLE_REF.as_ptr(), TABLE.as_ptr());
        assert!(TABLE_REF == table().as_slice());
    }
}
