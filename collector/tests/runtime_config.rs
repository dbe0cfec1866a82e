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
