//! GNU build IDs of mapped files, cached per file.
//!
//! The ID is read by the one ELF reader (`profcol_elf`), from `PT_NOTE`
//! segments, which every loadable ELF file keeps even when its section
//! headers are stripped; only the pages of the headers and notes are read.
//!
//! The cache key is the file's identity (device, inode) checked against its
//! mtime and size, so a binary replaced in place (new inode, or same inode
//! rewritten) is read again.

use profcol_elf::notes::hex;
use profcol_elf::ElfFile;
use rustc_hash::FxHashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

/// Reads the GNU build ID of an ELF file; `Ok(None)` if it is not ELF or
/// has no such note.
pub(crate) fn read_build_id(file: &File) -> io::Result<Option<Vec<u8>>> {
    match ElfFile::open(file) {
        Ok(elf) => Ok(elf.gnu_build_id().map(<[u8]>::to_vec)),
        Err(profcol_elf::Error::Map(e)) => Err(e),
        Err(_) => Ok(None),
    }
}

/// Identity of a file on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct FileKey {
    pub dev: u64,
    pub inode: u64,
}

#[derive(Clone, Debug)]
struct Entry {
    mtime: (i64, i64),
    size: u64,
    ids: FileIds,
}

/// How a file is known to symbolizers: its GNU build ID, else a file id
/// (`profcol_elf::file_id`, for ELF files without one, such as Go's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FileIds {
    pub build_id: Option<Arc<str>>,
    pub file_id: Option<Arc<str>>,
}

impl FileIds {
    /// The key a symbolizer finds the file by.
    pub(crate) fn key(&self) -> Option<&Arc<str>> {
        self.build_id.as_ref().or(self.file_id.as_ref())
    }
}

/// Build IDs by (device, inode), validated by mtime and size. Bounded: when
/// full, it is cleared (a cold miss costs one small read per file).
pub(crate) struct BuildIdCache {
    entries: FxHashMap<FileKey, Entry>,
    capacity: usize,
    /// Files whose build ID had to be read (cache misses).
    pub reads: u64,
}

impl BuildIdCache {
    pub(crate) fn new(capacity: usize) -> Self {
        BuildIdCache { entries: FxHashMap::default(), capacity: capacity.max(1), reads: 0 }
    }

    /// The ids of the file `md` describes if it was read before and has
    /// not changed since (same size and mtime): a caller that can stat a
    /// file by path needs no open for a file seen before.
    pub(crate) fn cached(&self, md: &std::fs::Metadata) -> Option<FileIds> {
        let e = self.entries.get(&FileKey { dev: md.dev(), inode: md.ino() })?;
        (e.mtime == (md.mtime(), md.mtime_nsec()) && e.size == md.size()).then(|| e.ids.clone())
    }

    /// Build ID (hex) of an opened file, from the cache when (dev, inode,
    /// mtime, size) match.
    #[cfg(test)]
    pub(crate) fn get(&mut self, file: &File) -> io::Result<Option<Arc<str>>> {
        Ok(self.ids(file)?.build_id)
    }

    /// Build ID, or for an ELF file without one its file id, from the cache
    /// when (dev, inode, mtime, size) match.
    pub(crate) fn ids(&mut self, file: &File) -> io::Result<FileIds> {
        let md = file.metadata()?;
        if let Some(ids) = self.cached(&md) {
            return Ok(ids);
        }
        let key = FileKey { dev: md.dev(), inode: md.ino() };
        let mtime = (md.mtime(), md.mtime_nsec());
        self.reads += 1;
        let ids = match ElfFile::open(file) {
            Ok(elf) => match elf.gnu_build_id() {
                Some(b) => FileIds { build_id: Some(Arc::from(hex(b))), file_id: None },
                None => FileIds { build_id: None, file_id: profcol_elf::file_id(file).ok().map(Arc::from) },
            },
            Err(profcol_elf::Error::Map(e)) => return Err(e),
            Err(_) => FileIds::default(),
        };
        if self.entries.len() >= self.capacity {
            self.entries.clear();
        }
        self.entries.insert(key, Entry { mtime, size: md.size(), ids: ids.clone() });
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_real_binaries_and_caches() {
        let exe = std::env::current_exe().unwrap();
        let f = File::open(&exe).unwrap();
        let mut cache = BuildIdCache::new(8);
        let a = cache.get(&f).unwrap();
        let b = cache.get(&f).unwrap();
        assert_eq!(a, b);
        assert_eq!(cache.reads, 1);
        // rustc links test binaries with a GNU build ID on Linux (gcc/ld default).
        let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
            .iter()
            .find_map(|p| File::open(p).ok());
        if let Some(libc) = libc {
            let id = read_build_id(&libc).unwrap().expect("libc has a build id");
            assert_eq!(id.len(), 20);
        }
    }

    #[test]
    fn a_file_seen_before_is_answered_from_its_stat_until_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("exe");
        std::fs::copy(std::env::current_exe().unwrap(), &p).unwrap();
        let mut cache = BuildIdCache::new(8);
        assert_eq!(cache.cached(&std::fs::metadata(&p).unwrap()), None, "never read");
        let ids = cache.ids(&File::open(&p).unwrap()).unwrap();
        assert!(ids.key().is_some());
        assert_eq!(cache.cached(&std::fs::metadata(&p).unwrap()), Some(ids));
        // Rewritten in place (same inode): a new size, so read again.
        std::fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(b"x").unwrap();
        assert_eq!(cache.cached(&std::fs::metadata(&p).unwrap()), None);
        assert_eq!(cache.reads, 1);
    }

    #[test]
    fn non_elf_and_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        std::fs::write(&p, b"#!/bin/sh\necho hi\n").unwrap();
        assert_eq!(read_build_id(&File::open(&p).unwrap()).unwrap(), None);
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        for cut in [0, 4, 20, 63, 64, 100, 1000] {
            std::fs::write(&p, &exe[..cut.min(exe.len())]).unwrap();
            let _ = read_build_id(&File::open(&p).unwrap()).unwrap();
        }
    }
}
