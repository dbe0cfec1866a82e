//! Services the host shares between components (like the OTel Collector's
//! extensions): one instance per host, handed to every component through
//! [`crate::CreateSettings::services`], kept across reloads.
//!
//! [`FilePins`]: the ebpf receiver pins the files its processes map (an
//! open descriptor through `/proc/PID/map_files`, so the file stays
//! readable after the process exits, is deleted, or lives in another mount
//! namespace); `user_symbols` reads them by build id (or file id) when a
//! batch names that binary, which may be long after the process is gone.

use std::fs::File;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

/// What one host shares between its components.
#[derive(Clone, Default)]
pub struct HostServices {
    pub file_pins: Arc<FilePins>,
}

/// A mapped file kept readable for symbolization.
#[derive(Clone, Debug)]
pub struct PinnedFile {
    /// The open file (through map_files: same inode the process mapped).
    pub file: Arc<File>,
    /// The path as the process saw it (its mount namespace).
    pub path: Arc<str>,
    /// `/proc/PID/root` of a process that mapped it, for finding files next
    /// to it (`.gnu_debuglink`) while that process lives.
    pub root: Option<Arc<str>>,
}

/// Default bound on pinned files (each holds one descriptor); lowered to
/// a quarter of the soft `RLIMIT_NOFILE` when that is smaller, so pins
/// never starve perf events, sockets and files of descriptors.
pub(crate) const DEFAULT_MAX_PINS: usize = 1024;
/// Default time a pin outlives the last time a process was seen mapping it.
pub(crate) const DEFAULT_PIN_AGE: Duration = Duration::from_secs(600);

struct Pin {
    file: PinnedFile,
    touched: Instant,
}

/// Files pinned by build id or file id, bounded by count and age: the
/// least recently touched pin goes first when full, and pins untouched
/// for `max_age` are dropped on the next insertion.
pub struct FilePins {
    pins: Mutex<FxHashMap<Arc<str>, Pin>>,
    max_entries: usize,
    max_age: Duration,
}

impl Default for FilePins {
    fn default() -> Self {
        FilePins::new(DEFAULT_MAX_PINS.min(nofile_soft_limit() / 4), DEFAULT_PIN_AGE)
    }
}

/// The soft limit on open descriptors (1024 when it cannot be read).
fn nofile_soft_limit() -> usize {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX)
}

impl FilePins {
    pub fn new(max_entries: usize, max_age: Duration) -> Self {
        FilePins { pins: Mutex::new(FxHashMap::default()), max_entries: max_entries.max(1), max_age }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FxHashMap<Arc<str>, Pin>> {
        self.pins.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `key` is pinned; refreshes its age when it is (a process
    /// still maps it).
    pub fn touch(&self, key: &str) -> bool {
        match self.lock().get_mut(key) {
            Some(p) => {
                p.touched = Instant::now();
                true
            }
            None => false,
        }
    }

    /// Pins `file` under `key` (a build id or file id), replacing an older
    /// pin of the same key.
    pub fn pin(&self, key: Arc<str>, file: PinnedFile) {
        let now = Instant::now();
        let mut pins = self.lock();
        pins.retain(|_, p| now.duration_since(p.touched) < self.max_age);
        if !pins.contains_key(&key) && pins.len() >= self.max_entries {
            if let Some(oldest) = pins.iter().min_by_key(|(_, p)| p.touched).map(|(k, _)| k.clone()) {
                pins.remove(&oldest);
            }
        }
        pins.insert(key, Pin { file, touched: now });
    }

    /// The file pinned under `key`.
    pub fn get(&self, key: &str) -> Option<PinnedFile> {
        self.lock().get(key).map(|p| p.file.clone())
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pinned() -> PinnedFile {
        PinnedFile { file: Arc::new(File::open("/proc/self/exe").unwrap()), path: Arc::from("/x"), root: None }
    }

    #[test]
    fn bounded_by_count_and_age() {
        let pins = FilePins::new(2, Duration::from_secs(60));
        pins.pin(Arc::from("a"), pinned());
        std::thread::sleep(Duration::from_millis(2));
        pins.pin(Arc::from("b"), pinned());
        std::thread::sleep(Duration::from_millis(2));
        assert!(pins.touch("a"));
        pins.pin(Arc::from("c"), pinned());
        assert_eq!(pins.len(), 2);
        assert!(pins.get("b").is_none(), "least recently touched goes first");
        assert!(pins.get("a").is_some() && pins.get("c").is_some());
        let aged = FilePins::new(8, Duration::ZERO);
        aged.pin(Arc::from("a"), pinned());
        aged.pin(Arc::from("b"), pinned());
        assert!(aged.get("a").is_none(), "older than max_age");
    }
}
