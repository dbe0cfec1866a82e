//! The on-disk cache of compiled plugins. A compiled artifact is native code
//! that wasmtime loads without checking it, so the directory must be one only
//! profcol writes: it is created with mode 0700 and refused when another user
//! owns it or others may write to it. Where no cache directory is usable, the
//! cache warns once and plugins are compiled in memory at every start.

use sha2::{Digest, Sha256};
use std::fs;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use tracing::warn;
use wasmtime::Engine;

/// Where compiled plugins go when `service.plugins.cache_dir` is not set:
/// `$XDG_CACHE_HOME/profcol/plugins`, else `~/.cache/profcol/plugins`.
pub fn default_dir() -> Option<PathBuf> {
    let xdg = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()).map(PathBuf::from);
    let base =
        xdg.or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("profcol").join("plugins"))
}

/// A `std::hash::Hasher` feeding SHA-256, to fold wasmtime's engine-settings
/// hash into the cache key stably (DefaultHasher may change between Rust releases).
struct ShaHasher(Sha256);

impl Hasher for ShaHasher {
    fn finish(&self) -> u64 {
        0
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// The cache key of one plugin file on one engine: SHA-256 over the file's
/// SHA-256 and wasmtime's compatibility hash (its version and every engine
/// setting that changes the generated code).
pub fn key(file_sha256: &str, engine: &Engine) -> String {
    let mut h = ShaHasher(Sha256::new());
    h.write(file_sha256.as_bytes());
    engine.precompile_compatibility_hash().hash(&mut h);
    hex(&h.0.finalize())
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The cache directory (or none: compile in memory).
pub struct DiskCache {
    dir: Option<PathBuf>,
    warned: AtomicBool,
}

impl DiskCache {
    /// Opens (creating with mode 0700) `dir`, or the default directory.
    pub fn open(dir: Option<PathBuf>) -> Self {
        let cache = DiskCache { dir: None, warned: AtomicBool::new(false) };
        let Some(dir) = dir.or_else(default_dir) else {
            cache.warn_once("no cache directory (neither XDG_CACHE_HOME nor HOME is set)");
            return cache;
        };
        match prepare(&dir) {
            Ok(()) => DiskCache { dir: Some(dir), ..cache },
            Err(why) => {
                cache.warn_once(&format!("{}: {why}", dir.display()));
                cache
            }
        }
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    fn warn_once(&self, why: &str) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            warn!("plugin compile cache unusable ({why}); plugins are compiled in memory at every start (set service.plugins.cache_dir to a writable directory)");
        }
    }

    fn file(&self, key: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{key}.cwasm")))
    }

    /// The cached artifact for `key`, if one is there and was written by this user.
    pub fn load(&self, key: &str) -> Option<Vec<u8>> {
        let path = self.file(key)?;
        let meta = fs::metadata(&path).ok()?;
        // SAFETY: geteuid has no preconditions.
        if meta.uid() != unsafe { libc::geteuid() } || meta.mode() & 0o022 != 0 {
            self.warn_once(&format!("{} is not owned by this user or is writable by others", path.display()));
            return None;
        }
        fs::read(&path).ok()
    }

    /// Stores an artifact (write to a temporary file, then rename: a reader
    /// never sees half a file). Failures warn once and are otherwise ignored.
    pub fn store(&self, key: &str, artifact: &[u8]) {
        let (Some(dir), Some(path)) = (self.dir.as_ref(), self.file(key)) else { return };
        let result = (|| -> std::io::Result<()> {
            let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
            tmp.write_all(artifact)?;
            tmp.as_file().set_permissions(fs::Permissions::from_mode(0o600))?;
            tmp.persist(&path).map_err(|e| e.error)?;
            Ok(())
        })();
        if let Err(e) = result {
            self.warn_once(&format!("cannot write {}: {e}", path.display()));
        }
    }
}

/// Creates `dir` with mode 0700, or checks that an existing one is ours and
/// that no one else may write to it (its mode is left as it is).
fn prepare(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    if !dir.exists() {
        fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| format!("cannot create it: {e}"))?;
    }
    let meta = fs::metadata(dir).map_err(|e| e.to_string())?;
    if !meta.is_dir() {
        return Err("not a directory".into());
    }
    // SAFETY: geteuid has no preconditions.
    if meta.uid() != unsafe { libc::geteuid() } {
        return Err(format!("owned by uid {}, not by this user", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "mode {:04o} lets other users write compiled code profcol would run (chmod 0700 it, or choose another directory)",
            meta.mode() & 0o7777
        ));
    }
    // Writable? (a read-only root, a read-only mount)
    tempfile::NamedTempFile::new_in(dir).map_err(|e| format!("not writable: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_is_created_0700_and_refused_when_others_may_write() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("a/b");
        let c = DiskCache::open(Some(d.clone()));
        assert_eq!(c.dir(), Some(d.as_path()));
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        // Writable by others: refused, and left as it is.
        fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
        let e = prepare(&d).unwrap_err();
        assert!(e.contains("mode 0777 lets other users write"), "{e}");
        assert!(DiskCache::open(Some(d.clone())).dir().is_none());
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o777, 0o777);
        // Readable by others is not a risk: used as it is.
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        let c = DiskCache::open(Some(d.clone()));
        assert!(c.dir().is_some());
        c.store("k", b"abc");
        assert_eq!(c.load("k").as_deref(), Some(&b"abc"[..]));
        assert_eq!(c.load("missing"), None);
    }

    #[test]
    fn a_file_in_the_way_means_no_cache() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        let c = DiskCache::open(Some(tmp.path().to_owned()));
        assert!(c.dir().is_none());
        c.store("k", b"abc");
        assert_eq!(c.load("k"), None);
    }
}
