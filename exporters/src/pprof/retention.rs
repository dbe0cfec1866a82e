//! Bounds the pprof files in `directory`: at most `max_files`, none older
//! than `max_age` (by modification time), the oldest removed first, the way
//! the file exporter rotates its backups.
//!
//! Only this exporter's files are ever removed: those it writes, and at start
//! the files already in the directory whose names it would write
//! (`{file_prefix}-{YYYYmmddTHHMMSSZ}-{group}[-n].pb.gz`, left by its last
//! run). Anything else in the directory is never touched; give exporters that
//! share a directory different `file_prefix`es.

use profcol_api::telemetry::{Counter, Gauge};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

pub(super) struct Retention {
    prefix: String,
    /// 0: no bound on the number of files.
    max_files: usize,
    /// Zero: no bound on age.
    max_age: Duration,
    /// Kept files, oldest first.
    files: Mutex<VecDeque<(SystemTime, PathBuf)>>,
    removed: Counter,
    kept: Gauge,
}

impl Retention {
    pub(super) fn new(prefix: &str, max_files: usize, max_age: Duration, removed: Counter, kept: Gauge) -> Self {
        Retention { prefix: prefix.to_owned(), max_files, max_age, files: Mutex::default(), removed, kept }
    }

    /// Whether `name` is a file name this exporter writes.
    pub(super) fn is_ours(&self, name: &str) -> bool {
        let Some(rest) = name.strip_prefix(&self.prefix).and_then(|r| r.strip_prefix('-')) else { return false };
        let Some(rest) = rest.strip_suffix(".pb.gz") else { return false };
        // YYYYmmddTHHMMSSZ, then -group.
        let b = rest.as_bytes();
        b.len() > 17
            && b[..8].iter().all(u8::is_ascii_digit)
            && b[8] == b'T'
            && b[9..15].iter().all(u8::is_ascii_digit)
            && b[15] == b'Z'
            && b[16] == b'-'
    }

    /// Takes over the files of an earlier run in `dir`, then applies the bounds.
    pub(super) fn adopt(&self, dir: &Path) -> std::io::Result<()> {
        let mut found: Vec<(SystemTime, PathBuf)> = std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_str().is_some_and(|n| self.is_ours(n)))
            .filter_map(|e| {
                let m = e.metadata().ok().filter(|m| m.is_file())?;
                Some((m.modified().unwrap_or(SystemTime::UNIX_EPOCH), e.path()))
            })
            .collect();
        found.sort();
        self.lock().extend(found);
        self.prune(SystemTime::now());
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(SystemTime, PathBuf)>> {
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A file was written at `now`: keep it, and drop what is now beyond the bounds.
    pub(super) fn record(&self, path: PathBuf, now: SystemTime) {
        self.lock().push_back((now, path));
        self.prune(now);
    }

    /// Removes the oldest files while there are more than `max_files` or
    /// they are older than `max_age`; returns how many went.
    pub(super) fn prune(&self, now: SystemTime) -> usize {
        let mut files = self.lock();
        let mut n = 0;
        while let Some((written, path)) = files.front() {
            let too_many = self.max_files > 0 && files.len() > self.max_files;
            let too_old = !self.max_age.is_zero() && now.duration_since(*written).is_ok_and(|age| age > self.max_age);
            if !too_many && !too_old {
                break;
            }
            match std::fs::remove_file(path) {
                Ok(()) => n += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                // Forgotten either way: one warning, not one per write.
                Err(e) => tracing::warn!(path = %path.display(), "cannot remove an old pprof file: {e}"),
            }
            files.pop_front();
        }
        self.removed.add(n as u64);
        self.kept.set(files.len() as i64);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retention(max_files: usize, max_age: Duration) -> Retention {
        Retention::new("profile", max_files, max_age, Counter::default(), Gauge::default())
    }

    #[test]
    fn names_it_writes_and_no_others() {
        let r = retention(1, Duration::ZERO);
        assert!(r.is_ours("profile-20231114T221320Z-all.pb.gz"));
        assert!(r.is_ours("profile-20231114T221320Z-svc_a-3.pb.gz"));
        for other in [
            "profile-20231114T221320Z-all.pb",
            "profiles-20231114T221320Z-all.pb.gz",
            "profile-2023111T221320Z-all.pb.gz",
            "profile-20231114T221320Z.pb.gz",
            "notes.txt",
            "profile-x.pb.gz",
        ] {
            assert!(!r.is_ours(other), "{other}");
        }
    }

    #[test]
    fn oldest_go_first_by_count_and_by_age_and_strangers_stay() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        std::fs::write(dir.path().join("mine.txt"), "not ours").unwrap();
        let r = retention(3, Duration::from_secs(60));
        let path = |k: u64| dir.path().join(format!("profile-20231114T2213{k:02}Z-all.pb.gz"));
        for k in 0..5 {
            std::fs::write(path(k), "x").unwrap();
            r.record(path(k), t0 + Duration::from_secs(k));
        }
        assert_eq!(r.removed.get(), 2);
        assert!(!path(0).exists() && !path(1).exists() && path(2).exists() && path(4).exists());
        // Two minutes later the next write leaves only itself.
        std::fs::write(path(9), "x").unwrap();
        r.record(path(9), t0 + Duration::from_secs(125));
        assert_eq!((r.removed.get(), r.kept.get()), (5, 1));
        assert!(path(9).exists() && dir.path().join("mine.txt").exists());
    }

    #[test]
    fn a_restart_adopts_the_files_of_the_last_run() {
        let dir = tempfile::tempdir().unwrap();
        for k in 0..4 {
            let p = dir.path().join(format!("profile-2023111{k}T000000Z-all.pb.gz"));
            std::fs::write(&p, "x").unwrap();
            let f = std::fs::File::options().write(true).open(&p).unwrap();
            f.set_modified(SystemTime::now() - Duration::from_secs(100 - k * 10)).unwrap();
        }
        std::fs::write(dir.path().join("other-20231110T000000Z-all.pb.gz"), "x").unwrap();
        let r = retention(2, Duration::ZERO);
        r.adopt(dir.path()).unwrap();
        let mut left: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(
            left,
            [
                "other-20231110T000000Z-all.pb.gz",
                "profile-20231112T000000Z-all.pb.gz",
                "profile-20231113T000000Z-all.pb.gz"
            ]
        );
    }
}
