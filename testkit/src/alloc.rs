//! A global allocator that counts live heap bytes, for benches that size
//! what a structure holds. Install it in the bench binary:
//!
//! ```ignore
//! #[global_allocator]
//! static A: profcol_testkit::alloc::Counting = profcol_testkit::alloc::Counting;
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

fn grow(by: isize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

/// Forwards to the system allocator and keeps a count of live bytes.
pub struct Counting;

// SAFETY: every call is forwarded to `System` with the caller's arguments;
// the counter has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        grow(l.size() as isize);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // A moving realloc holds both blocks for a moment: count the new one first.
        grow(new as isize);
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(p, l, new) }
    }
}

/// Live heap bytes (0 unless [`Counting`] is the global allocator).
pub fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// The most live heap bytes since the last [`reset_peak`] (process-wide:
/// measure one thing at a time).
pub fn peak() -> isize {
    PEAK.load(Ordering::Relaxed)
}

/// Starts a new peak measurement from the bytes live now.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}
