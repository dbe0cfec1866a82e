//! One process's perf map (`/tmp/perf-PID.map`: `START SIZE NAME` per
//! line, hex), opened safely and read as it grows.
//!
//! The file sits in a directory anyone can write, so it is opened inside
//! the process's own root with no symlink followed anywhere in the path,
//! and kept only if it is a regular file with one link owned by the
//! process's user. The open descriptor is kept: appended lines are read
//! from where the last read stopped, and a map rewritten from the start
//! (truncated, or replaced) is read again from the start.

use std::fs::File;
use std::io;

pub(crate) use super::files::Refused;
use super::files::{open_checked, Checked, Growing, RangeTable, CHUNK};
use super::names::{self, JitName, Runtime};

/// A line longer than this is malformed (V8's longest names are far
/// shorter).
const MAX_LINE: usize = 4096;

/// The outcome of opening a process's map.
pub(crate) enum Open {
    Map(Box<PerfMap>),
    /// No map file (yet).
    Missing,
    Refused(Refused),
}

/// Lines read, by outcome (the `outcome` label).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LineCounts {
    pub read: u64,
    pub malformed: u64,
    /// Well-formed lines left out: the table had no room.
    pub dropped: u64,
}

/// The code ranges of one process's map and their names.
pub(crate) struct PerfMap {
    /// Read up to and including the last full line's newline.
    file: Growing,
    /// Skipping the rest of an overlong line.
    skipping: bool,
    runtime: Runtime,
    table: RangeTable,
}

/// `/tmp/perf-NSPID.map` of process `pid` (`nspid`: its pid in its own
/// namespace), resolved inside the process's root; `uids`: the process's
/// real and effective user ids.
pub(crate) fn open(pid: u32, nspid: u32, uids: [u32; 2], runtime: Runtime) -> io::Result<Open> {
    Ok(match open_checked(pid, &format!("tmp/perf-{nspid}.map"), uids)? {
        Checked::File(file) => Open::Map(Box::new(PerfMap::new(file, runtime))),
        Checked::Missing => Open::Missing,
        Checked::Refused(r) => Open::Refused(r),
    })
}

impl PerfMap {
    fn new(file: File, runtime: Runtime) -> Self {
        PerfMap { file: Growing::new(file), skipping: false, runtime, table: RangeTable::default() }
    }

    #[cfg(test)]
    pub(crate) fn from_file(file: File, runtime: Runtime) -> Self {
        PerfMap::new(file, runtime)
    }

    /// Bytes the table holds (an estimate of what the allocator charges).
    pub(crate) fn bytes(&self) -> usize {
        self.table.bytes()
    }

    /// The map was read to its bound: the rest is left unread.
    pub(crate) fn capped(&self) -> bool {
        self.file.capped()
    }

    /// The name of the code at `addr`.
    pub(crate) fn lookup(&self, addr: u64) -> Option<(u32, &JitName)> {
        self.table.lookup(addr)
    }

    /// Reads what was appended since the last read, at most [`CHUNK`]
    /// bytes; the table grows by at most `room` bytes. `buf` is scratch.
    pub(crate) fn refresh(&mut self, room: usize, buf: &mut Vec<u8>, counts: &mut LineCounts) -> io::Result<()> {
        let (len, rewritten) = self.file.begin()?;
        if rewritten {
            // What it said before no longer holds.
            self.skipping = false;
            self.table = RangeTable::default();
        }
        let data = self.file.read(len, CHUNK, buf)?;
        // Only whole lines: a line still being written is read next time.
        let Some(last_nl) = data.iter().rposition(|&b| b == b'\n') else {
            if data.len() >= MAX_LINE {
                // No newline in a whole line's worth: skip it.
                self.skipping = true;
                counts.malformed += 1;
                return self.file.advance(data.len() as u64);
            }
            return Ok(());
        };
        let limit = self.bytes().saturating_add(room);
        for line in data[..last_nl].split(|&b| b == b'\n') {
            if std::mem::take(&mut self.skipping) {
                continue;
            }
            if line.is_empty() {
                continue;
            }
            let Some((start, size, name)) = parse_line(line) else {
                counts.malformed += 1;
                continue;
            };
            if self.bytes() >= limit {
                counts.dropped += 1;
                continue;
            }
            counts.read += 1;
            let runtime = self.runtime;
            let sym = self.table.intern(name, || names::parse(runtime, name));
            self.table.insert(start, start + size, sym);
        }
        self.file.advance(last_nl as u64 + 1)
    }
}

/// `START SIZE NAME` (hex, `0x` optional): the range and its name.
fn parse_line(line: &[u8]) -> Option<(u64, u64, &str)> {
    if line.len() > MAX_LINE {
        return None;
    }
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let (start, rest) = line.split_once(' ')?;
    let (size, name) = rest.trim_start_matches(' ').split_once(' ')?;
    let hex = |s: &str| {
        let s = s.strip_prefix("0x").unwrap_or(s);
        if s.is_empty() || s.len() > 16 {
            return None;
        }
        u64::from_str_radix(s, 16).ok()
    };
    let (start, size) = (hex(start)?, hex(size)?);
    let name = name.trim();
    if size == 0 || name.is_empty() || start.checked_add(size).is_none() {
        return None;
    }
    Some((start, size, name))
}

#[cfg(test)]
mod tests {
    use super::super::files::MAX_READ;
    use super::*;
    use std::io::Write;

    fn map_of(text: &str) -> (tempfile::NamedTempFile, PerfMap) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        let m = PerfMap::from_file(f.reopen().unwrap(), Runtime::V8);
        (f, m)
    }

    fn refresh(m: &mut PerfMap) -> LineCounts {
        let mut c = LineCounts::default();
        m.refresh(usize::MAX / 2, &mut Vec::new(), &mut c).unwrap();
        c
    }

    fn name_at(m: &PerfMap, a: u64) -> Option<String> {
        m.lookup(a).map(|(_, n)| n.function.to_string())
    }

    #[test]
    fn lines_parse_with_or_without_0x() {
        assert_eq!(parse_line(b"12805b80 180 JS:*fib /a.js:1:13"), Some((0x12805b80, 0x180, "JS:*fib /a.js:1:13")));
        assert_eq!(
            parse_line(b"0x00007f6740ec7620 0x00000000000000d8 double com.example.Hot.work(int)"),
            Some((0x7f6740ec7620, 0xd8, "double com.example.Hot.work(int)"))
        );
        for bad in [&b"zz 10 x"[..], b"10 0 x", b"10 10", b"10 10 ", b"ffffffffffffffff 2 x", b"\xff\xfe 1 x", b""] {
            assert_eq!(parse_line(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn later_lines_override_what_they_cover() {
        let (_f, mut m) = map_of("1000 100 JS:*a /x.js:1:1\n1040 20 JS:*b /x.js:2:1\n");
        assert_eq!(refresh(&mut m).read, 2);
        assert_eq!(name_at(&m, 0x1000).as_deref(), Some("a"));
        assert_eq!(name_at(&m, 0x1045).as_deref(), Some("b"));
        assert_eq!(name_at(&m, 0x1060).as_deref(), Some("a"), "a's tail stays a");
        assert_eq!(name_at(&m, 0x1100), None);
        assert_eq!(name_at(&m, 0xfff), None);
    }

    #[test]
    fn appended_lines_are_read_and_a_partial_line_waits() {
        let (mut f, mut m) = map_of("1000 10 JS:*a /x.js:1:1\n2000 10 JS:*b");
        assert_eq!(refresh(&mut m).read, 1);
        assert_eq!(name_at(&m, 0x2000), None, "b's line is not finished");
        f.write_all(b" /x.js:2:1\n3000 10 JS:*c /x.js:3:1\n").unwrap();
        f.flush().unwrap();
        assert_eq!(refresh(&mut m).read, 2);
        assert_eq!(name_at(&m, 0x2004).as_deref(), Some("b"));
        assert_eq!(name_at(&m, 0x3004).as_deref(), Some("c"));
    }

    #[test]
    fn a_rewritten_map_is_read_again_from_the_start() {
        let (f, mut m) = map_of("1000 10 JS:*a /x.js:1:1\n");
        refresh(&mut m);
        std::fs::write(f.path(), "5000 10 JS:*z /x.js:9:1\n").unwrap();
        refresh(&mut m);
        assert_eq!(name_at(&m, 0x1000), None, "the old map is gone");
        assert_eq!(name_at(&m, 0x5000).as_deref(), Some("z"));
        // Rewritten longer than before: the byte before the old end is no
        // longer a newline.
        std::fs::write(f.path(), "6000 10 JS:*y /x.js:9:1\n7000 10 JS:*x /x.js:9:1\n").unwrap();
        refresh(&mut m);
        assert_eq!(name_at(&m, 0x5000), None);
        assert_eq!(name_at(&m, 0x7000).as_deref(), Some("x"));
    }

    #[test]
    fn garbage_is_counted_and_bounded() {
        let mut junk = Vec::new();
        for i in 0..2000u32 {
            junk.extend_from_slice(format!("{i:x} not-hex {}\n", "x".repeat(10)).as_bytes());
            junk.extend_from_slice(&[0xff, 0x00, b'\n']);
        }
        junk.extend_from_slice(&vec![b'a'; MAX_LINE * 3]);
        junk.extend_from_slice(b"\n4000 10 JS:*ok /x.js:1:1\n");
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&junk).unwrap();
        let mut m = PerfMap::from_file(f.reopen().unwrap(), Runtime::V8);
        let c = refresh(&mut m);
        assert_eq!(c.read, 1);
        assert!(c.malformed >= 4000, "{c:?}");
        assert_eq!(name_at(&m, 0x4000).as_deref(), Some("ok"));
    }

    #[test]
    fn the_table_stops_growing_at_its_room() {
        let text: String =
            (0..10_000u64).map(|i| format!("{:x} 10 JS:*f{i} /x.js:1:1\n", 0x10000 + i * 0x10)).collect();
        let (_f, mut m) = map_of(&text);
        let mut c = LineCounts::default();
        m.refresh(64 << 10, &mut Vec::new(), &mut c).unwrap();
        assert!(c.dropped > 0 && c.read > 0, "{c:?}");
        assert!(m.bytes() < (64 << 10) + 1024, "{} bytes", m.bytes());
    }

    /// This test process's own map, as the receiver opens a sampled
    /// process's: through /proc/PID/root, checked against its user.
    struct OwnMap(std::path::PathBuf);

    impl OwnMap {
        fn path() -> OwnMap {
            let p = OwnMap(format!("/tmp/perf-{}.map", std::process::id()).into());
            let _ = std::fs::remove_file(&p.0);
            p
        }

        fn open(&self) -> Open {
            let pid = std::process::id();
            let ids = crate::ebpf::process::procfs::read_status_ids(pid).unwrap();
            open(pid, ids.nspid, ids.uids, Runtime::V8).unwrap()
        }
    }

    impl Drop for OwnMap {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn refused(o: Open) -> Option<Refused> {
        match o {
            Open::Refused(r) => Some(r),
            _ => None,
        }
    }

    // The hostile cases run one after another: they share this process's
    // one map path.
    #[test]
    fn hostile_map_files_are_refused_or_bounded() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED hostile_map_files_are_refused_or_bounded: needs root (chown)");
            assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true needs root");
            return;
        }
        let map = OwnMap::path();
        assert!(matches!(map.open(), Open::Missing));

        // A symlink to a secret: never followed.
        std::os::unix::fs::symlink("/etc/shadow", &map.0).unwrap();
        assert_eq!(refused(map.open()), Some(Refused::NotRegular), "symlink");
        std::fs::remove_file(&map.0).unwrap();

        // Owned by another user than the process's.
        std::fs::write(&map.0, "1000 10 JS:*a /x.js:1:1\n").unwrap();
        std::os::unix::fs::chown(&map.0, Some(65534), Some(65534)).unwrap();
        assert_eq!(refused(map.open()), Some(Refused::Owner), "other owner");
        std::fs::remove_file(&map.0).unwrap();

        // A hard link to a file elsewhere.
        let elsewhere = tempfile::NamedTempFile::new_in("/tmp").unwrap();
        std::fs::hard_link(elsewhere.path(), &map.0).unwrap();
        assert_eq!(refused(map.open()), Some(Refused::Links), "hard link");
        std::fs::remove_file(&map.0).unwrap();

        // A FIFO: refused, and opening it does not block.
        let c = std::ffi::CString::new(map.0.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(refused(map.open()), Some(Refused::NotRegular), "fifo");
        std::fs::remove_file(&map.0).unwrap();

        // 1 GiB of nothing: read in chunks up to the bound, no table.
        let f = std::fs::File::create(&map.0).unwrap();
        f.set_len(1 << 30).unwrap();
        let Open::Map(mut m) = map.open() else { panic!("a regular file of ours is opened") };
        let (mut buf, mut c) = (Vec::new(), LineCounts::default());
        for _ in 0..(MAX_READ as usize / CHUNK + 2) {
            m.refresh(1 << 20, &mut buf, &mut c).unwrap();
        }
        assert!(m.capped(), "read up to its bound");
        assert_eq!((c.read, m.bytes()), (0, 0));
        assert!(buf.capacity() <= CHUNK, "one chunk of buffer");
        std::fs::remove_file(&map.0).unwrap();

        // Rewritten while read: lines come and go, nothing breaks, and
        // what is named was in some version of the file.
        std::fs::write(&map.0, "").unwrap();
        let Open::Map(mut m) = map.open() else { panic!("opened") };
        let path = map.0.clone();
        let writer = std::thread::spawn(move || {
            for round in 0..300u64 {
                let text: String =
                    (0..50u64).map(|i| format!("{:x} 10 JS:*f{} /x.js:1:1\n", 0x1000 + i * 0x10, round % 7)).collect();
                if round % 2 == 0 {
                    std::fs::write(&path, &text).unwrap();
                } else {
                    let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
                    f.write_all(text.as_bytes()).unwrap();
                }
            }
        });
        let mut c = LineCounts::default();
        while !writer.is_finished() {
            m.refresh(1 << 20, &mut buf, &mut c).unwrap();
            if let Some((_, n)) = m.lookup(0x1000) {
                assert!(n.function.starts_with('f'), "{:?}", n.function);
            }
        }
        writer.join().unwrap();
        assert!(m.bytes() < 1 << 20);
    }
}
