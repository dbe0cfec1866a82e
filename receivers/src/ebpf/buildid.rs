//! GNU build IDs from ELF notes, cached per file.
//!
//! The note is found through the program headers (`PT_NOTE`), which every
//! loadable ELF file keeps even when its section headers are stripped. Only
//! the ELF header, the program header table and the note segments are read
//! (bounded sizes), never the whole file.
//!
//! The cache key is the file's identity (device, inode) checked against its
//! mtime and size, so a binary replaced in place (new inode, or same inode
//! rewritten) is read again.

use rustc_hash::FxHashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Arc;

const PT_NOTE: u32 = 4;
const NT_GNU_BUILD_ID: u32 = 3;
const MAX_PHNUM: usize = 256;
const MAX_NOTE_SEGMENT: u64 = 64 * 1024;

/// Lower-case hex of a build ID.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Reads the GNU build ID of an ELF file; `Ok(None)` if it is not ELF or
/// has no such note.
pub fn read_build_id(file: &File) -> io::Result<Option<Vec<u8>>> {
    let mut ident = [0u8; 64];
    let n = read_full_at(file, &mut ident, 0)?;
    let ident = &ident[..n];
    if n < 52 || &ident[..4] != b"\x7fELF" {
        return Ok(None);
    }
    let is64 = match ident[4] {
        1 => false,
        2 => true,
        _ => return Ok(None),
    };
    let le = match ident[5] {
        1 => true,
        2 => false,
        _ => return Ok(None),
    };
    let r = Reader { le };
    let (phoff, phentsize, phnum) = if is64 {
        if n < 64 {
            return Ok(None);
        }
        (r.u64(&ident[32..]), r.u16(&ident[54..]) as usize, r.u16(&ident[56..]) as usize)
    } else {
        (r.u32(&ident[28..]) as u64, r.u16(&ident[42..]) as usize, r.u16(&ident[44..]) as usize)
    };
    let min_ent = if is64 { 56 } else { 32 };
    if phoff == 0 || phentsize < min_ent || phnum == 0 || phnum > MAX_PHNUM {
        return Ok(None);
    }
    let mut ph = vec![0u8; phentsize * phnum];
    if read_full_at(file, &mut ph, phoff)? < ph.len() {
        return Ok(None);
    }
    for e in ph.chunks_exact(phentsize) {
        if r.u32(e) != PT_NOTE {
            continue;
        }
        let (off, size) =
            if is64 { (r.u64(&e[8..]), r.u64(&e[32..])) } else { (r.u32(&e[4..]) as u64, r.u32(&e[16..]) as u64) };
        if size == 0 || size > MAX_NOTE_SEGMENT {
            continue;
        }
        let mut notes = vec![0u8; size as usize];
        let got = read_full_at(file, &mut notes, off)?;
        if let Some(id) = find_gnu_build_id(&notes[..got], r) {
            return Ok(Some(id.to_vec()));
        }
    }
    Ok(None)
}

/// Walks a note segment; `None` when no well-formed GNU build-id note.
fn find_gnu_build_id(mut notes: &[u8], r: Reader) -> Option<&[u8]> {
    let align4 = |x: usize| x.checked_add(3).map(|v| v & !3);
    while notes.len() >= 12 {
        let namesz = r.u32(notes) as usize;
        let descsz = r.u32(&notes[4..]) as usize;
        let ty = r.u32(&notes[8..]);
        let name_end = 12usize.checked_add(align4(namesz)?)?;
        let desc_end = name_end.checked_add(align4(descsz)?)?;
        let name = notes.get(12..12 + namesz)?;
        let desc = notes.get(name_end..name_end.checked_add(descsz)?)?;
        if ty == NT_GNU_BUILD_ID && name == b"GNU\0" && !desc.is_empty() && desc.len() <= 64 {
            return Some(desc);
        }
        notes = notes.get(desc_end..)?;
    }
    None
}

#[derive(Clone, Copy)]
struct Reader {
    le: bool,
}

impl Reader {
    fn u16(self, b: &[u8]) -> u16 {
        let a = [b.first().copied().unwrap_or(0), b.get(1).copied().unwrap_or(0)];
        if self.le {
            u16::from_le_bytes(a)
        } else {
            u16::from_be_bytes(a)
        }
    }
    fn u32(self, b: &[u8]) -> u32 {
        let mut a = [0u8; 4];
        for (i, x) in a.iter_mut().enumerate() {
            *x = b.get(i).copied().unwrap_or(0);
        }
        if self.le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    }
    fn u64(self, b: &[u8]) -> u64 {
        let mut a = [0u8; 8];
        for (i, x) in a.iter_mut().enumerate() {
            *x = b.get(i).copied().unwrap_or(0);
        }
        if self.le {
            u64::from_le_bytes(a)
        } else {
            u64::from_be_bytes(a)
        }
    }
}

fn read_full_at(file: &File, buf: &mut [u8], mut off: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], off) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                off += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Identity of a file on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub dev: u64,
    pub inode: u64,
}

#[derive(Clone, Debug)]
struct Entry {
    mtime: (i64, i64),
    size: u64,
    build_id: Option<Arc<str>>,
}

/// Build IDs by (device, inode), validated by mtime and size. Bounded: when
/// full, it is cleared (a cold miss costs one small read per file).
pub struct BuildIdCache {
    entries: FxHashMap<FileKey, Entry>,
    capacity: usize,
    /// Files whose build ID had to be read (cache misses).
    pub reads: u64,
}

impl BuildIdCache {
    pub fn new(capacity: usize) -> Self {
        BuildIdCache { entries: FxHashMap::default(), capacity: capacity.max(1), reads: 0 }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Build ID (hex) of an opened file, from the cache when (dev, inode,
    /// mtime, size) match.
    pub fn get(&mut self, file: &File) -> io::Result<Option<Arc<str>>> {
        let md = file.metadata()?;
        let key = FileKey { dev: md.dev(), inode: md.ino() };
        let mtime = (md.mtime(), md.mtime_nsec());
        if let Some(e) = self.entries.get(&key) {
            if e.mtime == mtime && e.size == md.size() {
                return Ok(e.build_id.clone());
            }
        }
        self.reads += 1;
        let build_id = read_build_id(file)?.map(|b| Arc::<str>::from(hex(&b)));
        if self.entries.len() >= self.capacity {
            self.entries.clear();
        }
        self.entries.insert(key, Entry { mtime, size: md.size(), build_id: build_id.clone() });
        Ok(build_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(name: &[u8], ty: u32, desc: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(name.len() as u32).to_le_bytes());
        v.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        v.extend_from_slice(&ty.to_le_bytes());
        v.extend_from_slice(name);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v.extend_from_slice(desc);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v
    }

    #[test]
    fn finds_gnu_note_after_others() {
        let mut n = note(b"GNU\0", 1, &[0; 16]);
        n.extend(note(b"Go\0\0", 4, b"xyz"));
        n.extend(note(b"GNU\0", 3, &[0xde, 0xad, 0xbe, 0xef]));
        let r = Reader { le: true };
        assert_eq!(find_gnu_build_id(&n, r), Some(&[0xde, 0xad, 0xbe, 0xef][..]));
        assert_eq!(find_gnu_build_id(&n[..n.len() - 6], r), None);
        // Absurd sizes must not panic or overflow.
        let mut bad = vec![0xff; 12];
        bad.extend_from_slice(&[0; 8]);
        assert_eq!(find_gnu_build_id(&bad, r), None);
    }

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
