//! Readers and parsers for the /proc files the receiver needs.
//!
//! Every parser takes untrusted text and returns `None`/skips a line instead
//! of panicking: /proc content is input, not an invariant.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// One line of /proc/PID/maps that can hold code (`x` permission).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapsEntry {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    /// (major, minor) of the device holding the file; (0, 0) when anonymous.
    pub dev: (u32, u32),
    pub inode: u64,
    /// Path as the process sees it (its mount namespace), `[vdso]`-style
    /// pseudo name, or empty for anonymous memory. A trailing " (deleted)"
    /// is kept out of the path and reported in `deleted`.
    pub path: String,
    pub deleted: bool,
}

impl MapsEntry {
    /// A regular file (not anonymous, not a `[pseudo]` mapping).
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/')
    }
}

/// Parses /proc/PID/maps, keeping executable mappings only, sorted by start.
pub(crate) fn parse_maps(text: &str) -> Vec<MapsEntry> {
    let mut out: Vec<MapsEntry> = text.lines().filter_map(parse_maps_line).collect();
    out.sort_by_key(|m| m.start);
    out
}

fn parse_maps_line(line: &str) -> Option<MapsEntry> {
    // start-end perms offset dev inode [path]; fields separated by single
    // spaces, then padding before the path (which may itself hold spaces).
    let mut rest = line;
    let mut field = || -> Option<&str> {
        let r = rest.trim_start_matches(' ');
        let end = r.find(' ').unwrap_or(r.len());
        let (f, tail) = r.split_at(end);
        rest = tail;
        if f.is_empty() {
            None
        } else {
            Some(f)
        }
    };
    let range = field()?;
    let perms = field()?;
    let offset = field()?;
    let dev = field()?;
    let inode = field()?;
    if perms.as_bytes().get(2) != Some(&b'x') {
        return None;
    }
    let (s, e) = range.split_once('-')?;
    let start = u64::from_str_radix(s, 16).ok()?;
    let end = u64::from_str_radix(e, 16).ok()?;
    if end <= start {
        return None;
    }
    let offset = u64::from_str_radix(offset, 16).ok()?;
    let (maj, min) = dev.split_once(':')?;
    let dev = (u32::from_str_radix(maj, 16).ok()?, u32::from_str_radix(min, 16).ok()?);
    let inode = inode.parse().ok()?;
    let mut path = rest.trim_start_matches(' ').to_owned();
    let deleted = path.ends_with(" (deleted)");
    if deleted {
        path.truncate(path.len() - " (deleted)".len());
    }
    Some(MapsEntry { start, end, offset, dev, inode, path, deleted })
}

/// Container id from /proc/PID/cgroup: the last 64-hex-digit component of
/// the cgroup path (docker, containerd, cri-o, podman, kubepods layouts).
pub fn container_id(cgroup: &str) -> Option<String> {
    let mut found = None;
    for line in cgroup.lines() {
        // hierarchy-ID:controller-list:cgroup-path
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        for part in path.split('/') {
            if let Some(id) = hex64_in(part) {
                found = Some(id.to_owned());
            }
        }
    }
    found
}

/// A 64-hex-digit run in a cgroup path component such as
/// `docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>`, `<id>`.
fn hex64_in(part: &str) -> Option<&str> {
    let part = part.strip_suffix(".scope").unwrap_or(part);
    let candidate = match part.rfind(['-', ':']) {
        Some(i) => &part[i + 1..],
        None => part,
    };
    (candidate.len() == 64 && candidate.bytes().all(|b| b.is_ascii_hexdigit())).then_some(candidate)
}

/// Field 22 of /proc/PID/stat (start time in clock ticks since boot); the
/// comm in field 2 may contain spaces and parentheses, so parse after the
/// last ')'.
pub(crate) fn stat_start_time(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    // after = " S ppid ..." : state is field 3, starttime field 22 → index 19.
    after.split_whitespace().nth(19)?.parse().ok()
}

/// The comm field of a /proc/PID/stat line: between the first `(` and the
/// last `)` (a comm may hold parentheses and spaces).
pub(crate) fn stat_comm(stat: &str) -> Option<&str> {
    stat.get(stat.find('(')? + 1..stat.rfind(')')?)
}

/// Base name of a path.
pub(crate) fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// What /proc tells about a process, read once per process (and again on
/// a mapping refresh).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ProcessFacts {
    pub start_time: u64,
    pub comm: String,
    pub exe_path: Option<String>,
    pub container_id: Option<String>,
}

/// The /proc directory of a process.
pub(crate) fn proc_dir(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}"))
}

/// `/proc/PID/LEAF` built on the stack: per-exec lookups allocate nothing.
pub(crate) struct ProcPath {
    buf: [u8; 64],
    len: usize,
}

impl ProcPath {
    /// `leaf` is a short name (`exe`, `maps`); longer ones are cut (never
    /// expected).
    pub(crate) fn new(pid: u32, leaf: &str) -> Self {
        let mut p = ProcPath { buf: [0; 64], len: 0 };
        p.push(b"/proc/");
        p.push_decimal(pid as u64);
        p.push(b"/");
        p.push(leaf.as_bytes());
        p
    }

    /// `/proc/PID/map_files/START-END`: the mapped file as the process sees it.
    pub(crate) fn map_file(pid: u32, start: u64, end: u64) -> Self {
        let mut p = ProcPath::new(pid, "map_files/");
        p.push_hex(start);
        p.push(b"-");
        p.push_hex(end);
        p
    }

    // Hand-written digits: core::fmt costs more than the rest of a lookup.
    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn push_decimal(&mut self, mut v: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }

    fn push_hex(&mut self, mut v: u64) {
        let mut digits = [0u8; 16];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b"0123456789abcdef"[(v & 15) as usize];
            v >>= 4;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }

    pub(crate) fn as_path(&self) -> &Path {
        use std::os::unix::ffi::OsStrExt;
        Path::new(std::ffi::OsStr::from_bytes(&self.buf[..self.len]))
    }
}

/// Reads a /proc file as text; bytes that are not UTF-8 (paths and comms
/// may hold any byte) are replaced, never an error.
/// At most `max` bytes of a file (runtime state files, environments):
/// `None` when it cannot be read.
pub(crate) fn read_bounded(path: &Path, max: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    std::fs::File::open(path).ok()?.take(max).read_to_end(&mut out).ok()?;
    Some(out)
}

fn read_small(path: &Path) -> io::Result<String> {
    // Not read_to_end: File's asks the size first (statx and lseek), and
    // /proc files say 0.
    let mut f = std::fs::File::open(path)?;
    let mut bytes = vec![0u8; 4096];
    let mut len = 0;
    loop {
        if len == bytes.len() {
            bytes.resize(len * 2, 0);
        }
        match f.read(&mut bytes[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    bytes.truncate(len);
    Ok(match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// Reads stat (the comm with it), exe and cgroup. Fails only if the process is gone or
/// its stat is unreadable; missing exe (kernel threads) or cgroup is `None`.
pub(crate) fn read_facts(pid: u32) -> io::Result<ProcessFacts> {
    let dir = proc_dir(pid);
    let stat = read_small(&dir.join("stat"))?;
    let start_time = stat_start_time(&stat)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable /proc/PID/stat"))?;
    // The comm is stat's second field (`pid (comm) state ...`): the task
    // name /proc/PID/comm shows, without a file of its own to open.
    let comm = stat_comm(&stat).unwrap_or_default().to_owned();
    let exe_path =
        std::fs::read_link(dir.join("exe")).ok().map(|p| p.to_string_lossy().trim_end_matches(" (deleted)").to_owned());
    let container_id = read_small(&dir.join("cgroup")).ok().and_then(|c| container_id(&c));
    Ok(ProcessFacts { start_time, comm, exe_path, container_id })
}

/// From /proc/PID/status: the process's pid in its own pid namespace
/// (the last `NSpid:` field) and its real and effective user ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StatusIds {
    pub nspid: u32,
    pub uids: [u32; 2],
}

pub(crate) fn parse_status_ids(status: &str) -> Option<StatusIds> {
    let (mut nspid, mut uids) = (None, None);
    for line in status.lines() {
        if let Some(v) = line.strip_prefix("NSpid:") {
            nspid = v.split_whitespace().last().and_then(|p| p.parse().ok());
        } else if let Some(v) = line.strip_prefix("Uid:") {
            let mut f = v.split_whitespace().map(|u| u.parse::<u32>().ok());
            uids = Some([f.next()??, f.next()??]);
        }
    }
    Some(StatusIds { nspid: nspid?, uids: uids? })
}

pub(crate) fn read_status_ids(pid: u32) -> io::Result<StatusIds> {
    let status = read_small(&proc_dir(pid).join("status"))?;
    parse_status_ids(&status).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable /proc/PID/status"))
}

/// /proc/PID/cgroup; `None` when the process is gone.
pub(crate) fn read_cgroup(pid: u32) -> Option<String> {
    read_small(ProcPath::new(pid, "cgroup").as_path()).ok()
}

pub fn read_maps(pid: u32) -> io::Result<Vec<MapsEntry>> {
    Ok(parse_maps(&read_small(&proc_dir(pid).join("maps"))?))
}

/// Reads the start time only (cheap identity check against pid reuse).
pub(crate) fn read_start_time(pid: u32) -> io::Result<u64> {
    let stat = read_small(&proc_dir(pid).join("stat"))?;
    stat_start_time(&stat).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable /proc/PID/stat"))
}

/// The host name (`host.name`).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn status_gives_the_namespace_pid_and_user_ids() {
        let st = "Name:\tnode\nUid:\t1000\t1001\t1000\t1000\nGid:\t0\t0\t0\t0\nNSpid:\t4242\t7\n";
        assert_eq!(parse_status_ids(st), Some(StatusIds { nspid: 7, uids: [1000, 1001] }));
        assert_eq!(parse_status_ids("Uid:\t1\t1\t1\t1\n"), None, "no NSpid");
        assert_eq!(parse_status_ids("NSpid:\t9\nUid:\tx\ty\n"), None);
    }

    use super::*;

    const MAPS: &str = "\
55d4c5a00000-55d4c5a02000 r--p 00000000 fd:01 1835214                    /usr/bin/cat
55d4c5a02000-55d4c5a07000 r-xp 00002000 fd:01 1835214                    /usr/bin/cat
7f1e2c000000-7f1e2c021000 rw-p 00000000 00:00 0 
7f1e2c228000-7f1e2c3bd000 r-xp 00028000 fd:01 1837462                    /usr/lib/x86_64-linux-gnu/libc.so.6
7f1e2c500000-7f1e2c501000 r-xp 00000000 08:10 42                         /tmp/my lib.so (deleted)
7ffd1b7f0000-7ffd1b7f2000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    #[test]
    fn maps_keeps_executable_sorted() {
        let m = parse_maps(MAPS);
        assert_eq!(m.len(), 5);
        assert_eq!(m[0].path, "/usr/bin/cat");
        assert_eq!(m[0].start, 0x55d4c5a02000);
        assert_eq!(m[0].offset, 0x2000);
        assert_eq!(m[0].dev, (0xfd, 1));
        assert_eq!(m[0].inode, 1835214);
        assert!(m[0].is_file());
        assert_eq!(m[2].path, "/tmp/my lib.so");
        assert!(m[2].deleted);
        assert_eq!(m[3].path, "[vdso]");
        assert!(!m[3].is_file());
        assert_eq!(m[4].path, "[vsyscall]");
    }

    #[test]
    fn maps_garbage_never_panics() {
        for s in [
            "",
            "zz",
            "1-0 r-xp 0 0:0 0",
            "a-b r-xp g 0:0 0",
            "a-b r",
            "a-b r-xp 0 08 1 /x",
            "ffffffffffffffffffff-1 r-xp 0 0:0 0",
            "\u{0}\u{ffff} \n\n  -",
            "1-2 r-xp 0 0:0 99999999999999999999999",
        ] {
            let _ = parse_maps(s);
        }
        assert_eq!(parse_maps("1000-2000 r-xp 0 00:00 0").len(), 1);
    }

    #[test]
    fn container_ids() {
        let id = "3f1c0a6c2d5b4e7f8a9b0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f";
        assert_eq!(container_id(&format!("0::/system.slice/docker-{id}.scope\n")).as_deref(), Some(id));
        assert_eq!(container_id(&format!("12:pids:/kubepods/burstable/pod1234/{id}\n")).as_deref(), Some(id));
        assert_eq!(
            container_id(&format!("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{id}.scope")).as_deref(),
            Some(id)
        );
        assert_eq!(container_id(&format!("0::/machine.slice/libpod-{id}.scope/container")).as_deref(), Some(id));
        assert_eq!(container_id("0::/user.slice/user-0.slice/session-1.scope\n"), None);
        assert_eq!(container_id("garbage"), None);
        assert_eq!(container_id(""), None);
    }

    #[test]
    fn stat_start_time_with_odd_comm() {
        let stat = "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 1 0 987654 1000 100";
        assert_eq!(stat_start_time(stat), Some(987654));
        assert_eq!(stat_comm(stat), Some("a) b (c)"));
        assert_eq!(stat_comm("1 (x) S"), Some("x"));
        assert_eq!(stat_comm("1 )x( S"), None);
        assert_eq!(stat_start_time("1 (x) S"), None);
        assert_eq!(stat_start_time("no paren"), None);
    }

    #[test]
    fn non_utf8_proc_text_is_lossy_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("maps");
        std::fs::write(&p, b"1000-2000 r-xp 0 08:01 5 /tmp/\xff\xfe.so\n").unwrap();
        let text = read_small(&p).unwrap();
        let m = parse_maps(&text);
        assert_eq!(m.len(), 1);
        assert!(m[0].path.starts_with("/tmp/"));
    }

    #[test]
    fn a_file_larger_than_the_first_buffer_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("maps");
        let text: String =
            (0..300).map(|i| format!("{i:x}000-{i:x}fff r-xp 0 08:01 {i} /usr/lib/lib{i}.so\n")).collect();
        assert!(text.len() > 3 * 4096);
        std::fs::write(&p, &text).unwrap();
        assert_eq!(read_small(&p).unwrap(), text);
        // And a real /proc file, whose size says 0.
        assert!(read_small(Path::new("/proc/self/maps")).unwrap().ends_with('\n'));
    }

    #[test]
    fn reads_self() {
        let me = std::process::id();
        let f = read_facts(me).unwrap();
        assert!(f.start_time > 0);
        assert!(!f.comm.is_empty());
        assert_eq!(f.comm, std::fs::read_to_string("/proc/self/comm").unwrap().trim_end_matches('\n'));
        assert!(f.exe_path.is_some());
        let maps = read_maps(me).unwrap();
        let exe = f.exe_path.unwrap();
        assert!(maps.iter().any(|m| m.path == exe), "{maps:?}");
        assert_eq!(base_name("/usr/bin/cat"), "cat");
        assert!(read_facts(u32::MAX - 1).is_err());
        assert_eq!(ProcPath::new(4_294_967_295, "exe").as_path(), Path::new("/proc/4294967295/exe"));
        assert_eq!(ProcPath::new(0, "maps").as_path(), Path::new("/proc/0/maps"));
        assert_eq!(ProcPath::map_file(7, 0, 0x7f00a).as_path(), Path::new("/proc/7/map_files/0-7f00a"));
        let longest = ProcPath::map_file(4_294_967_295, u64::MAX - 1, u64::MAX);
        assert_eq!(longest.as_path(), Path::new("/proc/4294967295/map_files/fffffffffffffffe-ffffffffffffffff"));
    }
}
