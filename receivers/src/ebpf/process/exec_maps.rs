//! The executable file mappings of a process, without formatting its whole
//! /proc/PID/maps: the `PROCMAP_QUERY` ioctl (Linux 6.11+) on the maps file
//! walks only executable, file-backed VMAs and names one only when asked
//! (a `d_path`), which costs about a quarter of reading and parsing the text.
//! Older kernels answer `ENOTTY`; then the text is read and parsed once.

use super::procfs::{self, MapsEntry, ProcPath};
use profcol_ebpf::sys::{self, ProcmapQuery};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsFd;

const QUERY_FLAGS: u64 =
    sys::PROCMAP_QUERY_VMA_EXECUTABLE | sys::PROCMAP_QUERY_COVERING_OR_NEXT_VMA | sys::PROCMAP_QUERY_FILE_BACKED_VMA;

/// One executable mapping of a regular file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ExecMapping {
    pub start: u64,
    pub end: u64,
    /// (major, minor) of the file's device as /proc/PID/maps shows it
    /// (the superblock's, which is not always `st_dev`).
    pub dev: (u32, u32),
    pub inode: u64,
}

/// Whether the kernel answered the ioctl; learnt at the first query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Support {
    Unknown,
    Ioctl,
    Text,
}

/// Reads executable file mappings; one per receiver (remembers whether
/// the ioctl works, keeps its buffers).
pub(crate) struct ExecMapsReader {
    support: Support,
    bytes: Vec<u8>,
    entries: Vec<MapsEntry>,
    name: Vec<u8>,
}

impl Default for ExecMapsReader {
    fn default() -> Self {
        Self::new()
    }
}

/// The mappings of one process, being walked.
pub(crate) struct ExecMaps<'r> {
    reader: &'r mut ExecMapsReader,
    file: File,
    /// Ioctl: the next address to query. Text: the next entry's index.
    next: u64,
    done: bool,
}

impl ExecMapsReader {
    pub(crate) fn new() -> Self {
        ExecMapsReader { support: Support::Unknown, bytes: Vec::new(), entries: Vec::new(), name: Vec::new() }
    }

    /// Opens the maps of `pid` (fails when the process is gone).
    pub(crate) fn open(&mut self, pid: u32) -> io::Result<ExecMaps<'_>> {
        let file = File::open(ProcPath::new(pid, "maps").as_path())?;
        let mut maps = ExecMaps { reader: self, file, next: 0, done: false };
        if maps.reader.support != Support::Ioctl {
            maps.load_text_if_needed()?;
        }
        Ok(maps)
    }
}

impl ExecMaps<'_> {
    /// On first use, probes the ioctl; without it, reads the text.
    fn load_text_if_needed(&mut self) -> io::Result<()> {
        if self.reader.support == Support::Unknown {
            match self.query(0, false) {
                Err(e) if e.raw_os_error() == Some(libc::ENOTTY) || e.raw_os_error() == Some(libc::EINVAL) => {
                    self.reader.support = Support::Text;
                }
                _ => {
                    self.reader.support = Support::Ioctl;
                    return Ok(());
                }
            }
        }
        let r = &mut *self.reader;
        r.bytes.clear();
        (&self.file).read_to_end(&mut r.bytes)?;
        // Paths may hold any byte: lossy, never an error.
        let text = String::from_utf8_lossy(&r.bytes);
        r.entries = procfs::parse_maps(&text);
        r.entries.retain(MapsEntry::is_file);
        Ok(())
    }

    /// One `PROCMAP_QUERY`: the first executable file VMA at or after
    /// `addr`, named into the reader's buffer when `named`.
    fn query(&mut self, addr: u64, named: bool) -> io::Result<ProcmapQuery> {
        let name = if named {
            self.reader.name.resize(libc::PATH_MAX as usize + 16, 0);
            Some(&mut self.reader.name[..])
        } else {
            None
        };
        sys::procmap_query(self.file.as_fd(), QUERY_FLAGS, addr, name)
    }

    /// The path of the mapping that starts at `start`, as the process sees
    /// it (" (deleted)" removed); `None` when it is gone.
    pub(crate) fn path_of(&mut self, start: u64) -> Option<String> {
        if self.reader.support == Support::Text {
            return self.reader.entries.iter().find(|e| e.start == start).map(|e| e.path.clone());
        }
        let q = self.query(start, true).ok()?;
        if q.vma_start != start || q.vma_name_size == 0 {
            return None;
        }
        let name = &self.reader.name[..q.vma_name_size as usize - 1]; // without the NUL
        let name = String::from_utf8_lossy(name);
        Some(name.strip_suffix(" (deleted)").unwrap_or(&name).to_owned())
    }
}

impl Iterator for ExecMaps<'_> {
    type Item = ExecMapping;

    fn next(&mut self) -> Option<ExecMapping> {
        if self.done {
            return None;
        }
        if self.reader.support == Support::Text {
            let e = self.reader.entries.get(self.next as usize)?;
            self.next += 1;
            return Some(ExecMapping { start: e.start, end: e.end, dev: e.dev, inode: e.inode });
        }
        match self.query(self.next, false) {
            Ok(q) if q.vma_end > q.vma_start && q.vma_end > self.next => {
                self.next = q.vma_end;
                Some(ExecMapping {
                    start: q.vma_start,
                    end: q.vma_end,
                    dev: (q.dev_major, q.dev_minor),
                    inode: q.inode,
                })
            }
            _ => {
                // ENOENT: no more; anything else (gone, refused): stop too.
                self.done = true;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of_self(reader: &mut ExecMapsReader) -> Vec<(ExecMapping, String)> {
        let mut maps = reader.open(std::process::id()).unwrap();
        let all: Vec<ExecMapping> = maps.by_ref().collect();
        all.into_iter().map(|m| (m, maps.path_of(m.start).unwrap_or_default())).collect()
    }

    #[test]
    fn matches_the_maps_text() {
        let mut text: Vec<MapsEntry> = procfs::read_maps(std::process::id()).unwrap();
        text.retain(MapsEntry::is_file);
        let mut reader = ExecMapsReader::new();
        let got = of_self(&mut reader);
        // The text was read a moment before: the test binary's own code and
        // libc are mapped in both, with the same identity.
        let exe = std::env::current_exe().unwrap().to_string_lossy().into_owned();
        for want in text.iter().filter(|e| e.path == exe || e.path.contains("libc.so")) {
            let (m, path) = got.iter().find(|(m, _)| m.start == want.start).expect("same mapping");
            assert_eq!((m.end, m.dev, m.inode), (want.end, want.dev, want.inode));
            assert_eq!(path, &want.path);
        }
        assert!(got.iter().any(|(_, p)| *p == exe), "{got:?}");
        // The text fallback gives the same answer.
        reader.support = Support::Text;
        let again = of_self(&mut reader);
        for (m, p) in &got {
            if p == &exe || p.contains("libc.so") {
                assert!(again.iter().any(|(a, ap)| a == m && ap == p), "{m:?} {p} in {again:?}");
            }
        }
    }

    #[test]
    fn gone_process_is_an_error() {
        assert!(ExecMapsReader::new().open(u32::MAX - 3).is_err());
    }
}
