//! `service.runtime`: the worker count a config asks for is the number of
//! async workers the running process has.

mod common;

use common::{start_config, wait_until, write_corpus};
use std::time::Duration;

/// The `workers=N` of the start line (the runtime's own count).
fn workers(p: &common::Profcol) -> usize {
    let log = p.log.lock().unwrap();
    let line = log.iter().find(|l| l.contains("profcol started")).expect("a start line");
    let n = line.split_whitespace().find_map(|w| w.strip_prefix("workers=")).expect("workers= in the start line");
    n.parse().expect("a number")
}

fn run_with(dir: &std::path::Path, runtime: &str) -> usize {
    let yaml = format!(
        "receivers:\n  file:\n    path: {dir}/in\n\
         exporters:\n  file:\n    path: {dir}/out.jsonl\n\
         service:\n  telemetry:\n    metrics:\n      address: \"\"\n\
         {runtime}\
         \x20 pipelines:\n    profiles:\n      receivers: [file]\n      exporters: [file]\n",
        dir = dir.display()
    );
    let mut p = start_config(dir, "c.yaml", &yaml);
    assert!(p.wait_log("profcol started", Duration::from_secs(20)));
    // The batches went through: the workers have all run.
    let out = dir.join("out.jsonl");
    assert!(wait_until(Duration::from_secs(20), || std::fs::read_to_string(&out).is_ok_and(|t| t.lines().count() == 3)));
    let n = workers(&p);
    p.signal(libc::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
    n
}

#[test]
fn worker_threads_is_the_number_of_async_workers() {
    let one = tempfile::tempdir().unwrap();
    write_corpus(&one.path().join("in"), 3, 10);
    assert_eq!(run_with(one.path(), "  runtime:\n    worker_threads: 1\n    malloc_arenas: 1\n"), 1);
    let three = tempfile::tempdir().unwrap();
    write_corpus(&three.path().join("in"), 3, 10);
    assert_eq!(run_with(three.path(), "  runtime:\n    worker_threads: 3\n"), 3);
}

/// The executable is linked at a fixed address (collector/build.rs): its
/// relocated read-only data (vtables, panic locations, the GOT) stays clean
/// pages of the file. As a PIE, the dynamic loader wrote ~0.9 MiB of it at
/// every start: private dirty pages, anonymous memory the memory cgroup
/// charges for the process's life.
#[test]
fn the_executable_has_no_relocated_pages() {
    let dir = tempfile::tempdir().unwrap();
    write_corpus(&dir.path().join("in"), 1, 10);
    let yaml = format!(
        "receivers:\n  file:\n    path: {dir}/in\n\
         exporters:\n  file:\n    path: {dir}/out.jsonl\n\
         service:\n  telemetry:\n    metrics:\n      address: \"\"\n\
         \x20 pipelines:\n    profiles:\n      receivers: [file]\n      exporters: [file]\n",
        dir = dir.path().display()
    );
    let mut p = start_config(dir.path(), "c.yaml", &yaml);
    assert!(p.wait_log("profcol started", Duration::from_secs(20)));
    let exe = std::fs::read_link(format!("/proc/{}/exe", p.child.id())).unwrap();
    let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", p.child.id())).unwrap();
    p.signal(libc::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
    // Anonymous pages within the mappings of the executable's own file.
    let (mut in_exe, mut mappings, mut anon_kib) = (false, 0, 0u64);
    for line in smaps.lines() {
        let mut w = line.split_whitespace();
        match w.next() {
            Some(range) if range.contains('-') && !range.ends_with(':') => {
                // The path is what follows five fields (it may hold spaces).
                let path = w.skip(4).collect::<Vec<_>>().join(" ");
                in_exe = std::path::Path::new(&path) == exe;
                mappings += usize::from(in_exe);
            }
            Some("Anonymous:") if in_exe => anon_kib += w.next().and_then(|k| k.parse::<u64>().ok()).unwrap(),
            _ => {}
        }
    }
    assert!(mappings >= 2, "the executable's mappings in smaps ({mappings}) of {}", exe.display());
    // What stays is .data and .bss pages written at run time (tens of KiB).
    assert!(anon_kib < 256, "{anon_kib} KiB of anonymous pages in the executable's mappings: linked as a PIE?");
}
