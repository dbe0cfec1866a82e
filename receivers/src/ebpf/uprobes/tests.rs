//! The uprobe logic against real processes and files, with an attacher
//! that records instead of calling the kernel.

use super::*;
use profcol_api::component::{ComponentId, Kind};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A link that counts its drops (detaches).
struct FakeLink(Arc<AtomicUsize>);

impl Drop for FakeLink {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[derive(Default)]
struct FakeAttacher {
    attached: Vec<(u64, u32)>,
    detached: Arc<AtomicUsize>,
}

impl Attacher for FakeAttacher {
    type Link = FakeLink;
    fn attach(&mut self, _file: &File, offset: u64, cookie: u32) -> Result<FakeLink, AttachError> {
        self.attached.push((offset, cookie));
        Ok(FakeLink(self.detached.clone()))
    }
}

fn uprobes(specs: &[(&str, Option<&str>)]) -> Uprobes<FakeLink> {
    let specs: Vec<UprobeSpec> =
        specs.iter().map(|(s, b)| UprobeSpec { symbol: s.to_string(), binary: b.map(Into::into) }).collect();
    let t = ComponentTelemetry::detached(Kind::Receiver, &"ebpf".parse::<ComponentId>().unwrap());
    Uprobes::new(&specs, NegativeCacheConfig::default(), UprobeCounters::new(&t))
}

fn sleeper() -> Child {
    Command::new("sleep").arg("30").spawn().expect("spawn sleep")
}

fn kill(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

#[test]
fn library_attached_once_and_refcounted_by_processes() {
    let mut u = uprobes(&[("clock_nanosleep", Some("libc.so.6")), ("no_such_function_here", None)]);
    let mut att = FakeAttacher::default();
    let t0 = Instant::now();
    let (a, b) = (sleeper(), sleeper());
    // Libraries are looked at when the maps are read again after exec.
    std::thread::sleep(Duration::from_millis(100));
    u.on_exec(a.id(), t0, &mut att);
    u.on_exec(b.id(), t0, &mut att);
    assert_eq!(u.attached_files(), 0, "nothing before the maps rescan");
    u.poll(t0 + Duration::from_secs(1), &mut att);
    assert_eq!(att.attached.len(), 1, "libc attached once: {:?}", att.attached);
    assert_eq!(att.attached[0].1, 0, "cookie = index of the probe");
    assert_eq!(u.attached_files(), 1);
    assert_eq!(u.counters().holders.get(), 2);
    assert_eq!(u.counters().positive_hits.get(), 1);
    // sleep itself, ld.so: nothing to attach (negative), parsed once each.
    let parsed = u.counters().binaries_parsed.get();
    assert!(parsed >= 2, "libc + at least sleep: {parsed}");
    // The second rescan looks at nothing new: no lookups, no parse.
    let hits = u.counters().negative_hits.get();
    u.poll(t0 + Duration::from_secs(5), &mut att);
    assert_eq!((u.counters().binaries_parsed.get(), u.counters().negative_hits.get()), (parsed, hits));
    let t1 = t0 + Duration::from_secs(6);
    u.on_exit(a.id(), t1);
    u.poll(t1 + DETACH_GRACE, &mut att);
    assert_eq!(att.detached.load(Ordering::SeqCst), 0, "one holder left");
    u.on_exit(b.id(), t1);
    u.poll(t1 + DETACH_GRACE / 2, &mut att);
    assert_eq!(att.detached.load(Ordering::SeqCst), 0, "kept for the grace period");
    assert_eq!(u.counters().holders.get(), 0);
    u.poll(t1 + DETACH_GRACE, &mut att);
    assert_eq!(att.detached.load(Ordering::SeqCst), 1, "detached after the last exit and the grace period");
    assert_eq!((u.attached_files(), u.counters().holders.get(), u.counters().attachments.get()), (0, 0, 0));
    kill(a);
    kill(b);
}

#[test]
fn executable_without_the_symbol_is_parsed_once() {
    let mut u = uprobes(&[("no_such_function_here", Some("sleep"))]);
    let mut att = FakeAttacher::default();
    let t0 = Instant::now();
    for i in 0..5 {
        let c = sleeper();
        u.on_exec(c.id(), t0 + Duration::from_secs(i), &mut att);
        u.poll(t0 + Duration::from_secs(i) + Duration::from_secs(1), &mut att);
        u.on_exit(c.id(), t0 + Duration::from_secs(i));
        kill(c);
    }
    assert_eq!(u.counters().binaries_parsed.get(), 1);
    assert_eq!(u.counters().negative_hits.get(), 4);
    assert_eq!(u.counters().negative_entries.get(), 1);
    assert!(att.attached.is_empty());
}

#[test]
fn lost_exit_events_are_caught_by_the_liveness_check() {
    let mut u = uprobes(&[("clock_nanosleep", Some("libc.so.6"))]);
    let mut att = FakeAttacher::default();
    let t0 = Instant::now();
    let c = sleeper();
    std::thread::sleep(Duration::from_millis(100));
    u.on_exec(c.id(), t0, &mut att);
    u.poll(t0 + Duration::from_secs(1), &mut att);
    assert_eq!(u.attached_files(), 1);
    kill(c); // no on_exit: as if the event was lost
    let t1 = t0 + Duration::from_secs(1) + LIVENESS_CHECK_PERIOD;
    u.poll(t1, &mut att);
    u.poll(t1 + DETACH_GRACE, &mut att);
    assert_eq!(u.attached_files(), 0);
    assert_eq!(att.detached.load(Ordering::SeqCst), 1);
}

#[test]
fn exec_again_releases_then_looks_again() {
    let mut u = uprobes(&[("clock_nanosleep", Some("sleep"))]);
    let mut att = FakeAttacher::default();
    let t0 = Instant::now();
    let c = sleeper();
    // `sleep` has no clock_nanosleep of its own (libc has): negative.
    u.on_exec(c.id(), t0, &mut att);
    u.on_exec(c.id(), t0, &mut att);
    assert_eq!((u.counters().binaries_parsed.get(), u.counters().negative_hits.get()), (1, 1));
    assert_eq!(u.counters().processes.get(), 0, "nothing held, no maps to read: not followed");
    kill(c);
}

/// probe_target (examples/workloads) built in `dir`, unstripped.
fn probe_target(dir: &std::path::Path) -> std::path::PathBuf {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/workloads/probe_target.c");
    let out = dir.join("probe_target");
    let ok = Command::new("cc").arg("-O1").arg("-o").arg(&out).arg(&src).status().expect("run cc (install gcc)");
    assert!(ok.success());
    out
}

#[test]
fn exec_events_of_an_attached_process_keep_one_reference() {
    let dir = tempfile::tempdir().unwrap();
    let bin = probe_target(dir.path());
    let mut u = uprobes(&[("profcol_probe_target", Some("probe_target"))]);
    let mut att = FakeAttacher::default();
    let t0 = Instant::now();
    let mut c =
        Command::new(&bin).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    u.on_exec(c.id(), t0, &mut att);
    assert_eq!((att.attached.len(), u.attached_files(), u.counters().holders.get()), (1, 1, 1));
    // A second exec event of the same pid (a shell that exec'd it, seen
    // late): the new reference is taken before the old one goes, so the
    // uprobe stays attached, never detached and attached again.
    u.on_exec(c.id(), t0, &mut att);
    assert_eq!(att.detached.load(Ordering::SeqCst), 0);
    assert_eq!((att.attached.len(), u.attached_files(), u.counters().holders.get()), (1, 1, 1));
    assert_eq!((u.counters().binaries_parsed.get(), u.counters().positive_hits.get()), (1, 1));
    u.on_exit(c.id(), t0);
    u.poll(t0 + DETACH_GRACE, &mut att);
    assert_eq!((att.detached.load(Ordering::SeqCst), u.attached_files()), (1, 0));
    let _ = c.kill();
    let _ = c.wait();
}

#[test]
fn an_exec_read_late_is_scanned_at_once_and_dropped_when_holding_nothing() {
    let mut u = uprobes(&[("clock_nanosleep", Some("libc.so.6"))]);
    let mut att = FakeAttacher::default();
    let (a, b) = (sleeper(), sleeper());
    std::thread::sleep(Duration::from_millis(100));
    let exec_at = Instant::now();
    // Read 600 ms after the exec: both maps reads are due, done as one, in
    // the same call (no rescan left to wait for).
    let now = exec_at + MAPS_RESCAN_DELAYS[1] + Duration::from_millis(100);
    u.on_exec_at(a.id(), exec_at, now, &mut att);
    assert_eq!((att.attached.len(), u.counters().holders.get()), (1, 1), "libc attached without a poll");
    assert_eq!(u.next_due(), None);
    // The second process maps the same libc: a lookup of its (device,
    // inode), a positive hit, no parse.
    let parsed = u.counters().binaries_parsed.get();
    u.on_exec_at(b.id(), exec_at, now, &mut att);
    assert_eq!((att.attached.len(), u.counters().holders.get()), (1, 2));
    assert_eq!(u.counters().binaries_parsed.get(), parsed);
    assert_eq!(u.counters().processes.get(), 2);
    // A process whose maps hold nothing to attach is not followed after
    // its last read.
    let mut v = uprobes(&[("no_such_function_here", Some("libc.so.6"))]);
    v.on_exec_at(a.id(), exec_at, now, &mut att);
    assert_eq!((v.counters().processes.get(), v.attached_files()), (0, 0));
    kill(a);
    kill(b);
}

#[test]
fn a_library_named_without_so_is_recognised_when_mapped_at_start() {
    // A copy of libc under a name with no `.so`, loaded by a running
    // process (through the dynamic loader's --preload).
    let dir = tempfile::tempdir().unwrap();
    let libc = procfs::read_maps(std::process::id())
        .unwrap()
        .into_iter()
        .find(|m| m.path.contains("/libc.so"))
        .expect("the test binary maps libc")
        .path;
    let odd = dir.path().join("libodd");
    std::fs::copy(&libc, &odd).unwrap();
    let ld = procfs::read_maps(std::process::id())
        .unwrap()
        .into_iter()
        .find(|m| m.path.contains("ld-linux"))
        .expect("the test binary maps the dynamic loader")
        .path;
    let sleep_bin = which_sleep();
    let mut c = Command::new(&ld).arg("--preload").arg(&odd).arg(&sleep_bin).arg("30").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut u = uprobes(&[("clock_nanosleep", Some("libodd"))]);
    assert!(!u.maps_needed, "by its name, `libodd` looks like an executable");
    let mut att = FakeAttacher::default();
    u.scan_running(Instant::now(), &mut att);
    assert!(u.maps_needed, "learnt from the running process that maps it");
    assert_eq!(att.attached.len(), 1, "attached to libodd: {:?}", att.attached);
    assert_eq!(u.counters().holders.get(), 1);
    let _ = c.kill();
    let _ = c.wait();
}

fn which_sleep() -> std::path::PathBuf {
    ["/usr/bin/sleep", "/bin/sleep"].iter().map(std::path::PathBuf::from).find(|p| p.exists()).expect("sleep")
}

/// The executable mapping of `pid` whose path contains `part`, as a kernel
/// mapping record would report it (the test reads /proc/PID/maps to make one).
fn mapping_record(batch: &mut MappingBatch, pid: u32, part: &str) -> FileMap {
    let m = procfs::read_maps(pid).unwrap().into_iter().find(|m| m.path.contains(part));
    let m = m.unwrap_or_else(|| panic!("pid {pid} maps {part} executable"));
    let md = std::fs::metadata(&m.path).unwrap();
    let (major, minor) = (libc::major(md.dev()), libc::minor(md.dev()));
    record(batch, pid, m.start..m.end, (major, minor), md.ino(), m.path.as_bytes())
}

fn record(
    batch: &mut MappingBatch,
    pid: u32,
    range: std::ops::Range<u64>,
    dev: (u32, u32),
    ino: u64,
    path: &[u8],
) -> FileMap {
    batch.push_map(0, pid, range, 0, (dev, ino), path);
    match batch.events.last().unwrap().kind {
        crate::ebpf::process::mmap_events::MappingEventKind::Map(m) => m,
        _ => unreachable!(),
    }
}

use std::os::unix::fs::MetadataExt;

#[test]
fn kernel_mappings_decide_from_the_path_and_answer_repeats_with_a_verdict() {
    let mut u = uprobes(&[("no_such_function_here", Some("sleep"))]);
    let mut att = FakeAttacher::default();
    let t0 = Instant::now();
    let (a, b) = (sleeper(), sleeper());
    std::thread::sleep(Duration::from_millis(100));
    let mut batch = MappingBatch::default();
    // A library no probe selects: decided from its path, nothing counted.
    let libc = mapping_record(&mut batch, a.id(), "/libc.so");
    u.on_kernel_mapping(a.id(), &libc, &batch, t0, &mut att);
    let c = u.counters();
    assert_eq!((c.binaries_parsed.get(), c.negative_hits.get(), c.negative_entries.get()), (0, 0, 0));
    // The executable: parsed once, then a verdict for the next process.
    for p in [&a, &b] {
        u.on_image(p.id(), t0);
        let exe = mapping_record(&mut batch, p.id(), "sleep");
        u.on_kernel_mapping(p.id(), &exe, &batch, t0, &mut att);
    }
    let c = u.counters();
    assert_eq!((c.binaries_parsed.get(), c.negative_hits.get(), c.negative_entries.get()), (1, 1, 1));
    assert_eq!(u.counters().processes.get(), 0, "nothing held: not followed");
    kill(a);
    kill(b);
}

#[test]
fn kernel_mapping_held_until_exit_or_a_new_image() {
    let mut u = uprobes(&[("clock_nanosleep", Some("libc.so.6"))]);
    let mut att = FakeAttacher::default();
    let t0 = Instant::now();
    let (a, b) = (sleeper(), sleeper());
    std::thread::sleep(Duration::from_millis(100));
    let mut batch = MappingBatch::default();
    for p in [&a, &b] {
        let libc = mapping_record(&mut batch, p.id(), "/libc.so");
        u.on_kernel_mapping(p.id(), &libc, &batch, t0, &mut att);
        // Mapped again (another record of the same file): no second reference.
        u.on_kernel_mapping(p.id(), &libc, &batch, t0, &mut att);
    }
    assert_eq!((att.attached.len(), u.counters().holders.get(), u.counters().processes.get()), (1, 2, 2));
    assert_eq!((u.counters().binaries_parsed.get(), u.counters().positive_hits.get()), (1, 1));
    u.on_image(a.id(), t0); // exec'd something else: the old image's references go
    u.on_exit(b.id(), t0);
    u.poll(t0 + DETACH_GRACE, &mut att);
    assert_eq!((u.counters().holders.get(), u.attached_files()), (0, 0));
    assert_eq!(att.detached.load(Ordering::SeqCst), 1);
    kill(a);
    kill(b);
}

#[test]
fn a_path_that_is_not_the_reported_file_is_opened_through_the_process() {
    // As for a process in another mount namespace: the path the kernel
    // reports does not lead to the mapped file from here.
    let mut u = uprobes(&[("clock_nanosleep", Some("libc.so.6"))]);
    let mut att = FakeAttacher::default();
    let a = sleeper();
    std::thread::sleep(Duration::from_millis(100));
    let mut batch = MappingBatch::default();
    let real = mapping_record(&mut batch, a.id(), "/libc.so");
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = dir.path().join("libc.so.6");
    std::fs::write(&elsewhere, b"not the mapped file").unwrap();
    for path in [elsewhere.as_os_str().as_encoded_bytes(), b"/no/such/dir/libc.so.6"] {
        let m = record(&mut batch, a.id(), real.start..real.end, (real.major, real.minor), real.ino, path);
        u.on_image(a.id(), Instant::now());
        u.on_kernel_mapping(a.id(), &m, &batch, Instant::now(), &mut att);
        assert_eq!(u.counters().holders.get(), 1, "libc found through /proc/PID/map_files");
    }
    assert_eq!((att.attached.len(), u.counters().binaries_parsed.get()), (1, 1));
    kill(a);
}

#[test]
fn an_executable_rewritten_in_place_is_looked_at_again_at_its_next_exec() {
    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().join("prog");
    std::fs::copy(which_sleep(), &prog).unwrap();
    let mut u = uprobes(&[("clock_nanosleep", Some("prog"))]);
    let mut att = FakeAttacher::default();
    let a = sleeper(); // a live pid for the record; the path leads to the file
    let mut batch = MappingBatch::default();
    let exec = |u: &mut Uprobes<FakeLink>, batch: &mut MappingBatch, att: &mut FakeAttacher| {
        let md = std::fs::metadata(&prog).unwrap();
        let dev = (libc::major(md.dev()), libc::minor(md.dev()));
        let m = record(batch, a.id(), 0x1000..0x2000, dev, md.ino(), prog.as_os_str().as_encoded_bytes());
        u.on_image(a.id(), Instant::now());
        u.on_kernel_mapping(a.id(), &m, batch, Instant::now(), att);
    };
    exec(&mut u, &mut batch, &mut att);
    exec(&mut u, &mut batch, &mut att);
    assert_eq!((u.counters().binaries_parsed.get(), u.counters().negative_hits.get()), (1, 1));
    // Same inode, new size and mtime: libc's bytes, which have the symbol.
    let libc =
        procfs::read_maps(std::process::id()).unwrap().into_iter().find(|m| m.path.contains("/libc.so")).unwrap();
    let ino = std::fs::metadata(&prog).unwrap().ino();
    std::fs::write(&prog, std::fs::read(&libc.path).unwrap()).unwrap();
    assert_eq!(std::fs::metadata(&prog).unwrap().ino(), ino);
    exec(&mut u, &mut batch, &mut att);
    assert_eq!((u.counters().binaries_parsed.get(), att.attached.len(), u.counters().holders.get()), (2, 1, 1));
    kill(a);
}
