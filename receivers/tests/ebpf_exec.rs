//! exec noticed: a bash that burns CPU and then execs python3, which
//! burns CPU too. Samples taken after the exec must carry the new
//! executable (the receiver's exec tracepoint makes it read /proc again),
//! samples before it the old one. Needs root.
//!
//!     sudo -E cargo test -p profcol-receivers --test ebpf_exec

mod ebpf_common;

use std::process::{Command, Stdio};
use std::time::Duration;

use ebpf_common::*;
use profcol_api::model::{any_value::Value, keys};
use profcol_receivers::ebpf::config::SampleAttribute;
use profcol_receivers::ebpf::EbpfConfig;

/// The real python3 binary (not a shim script that execs it again).
fn python3() -> String {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap_or_else(|e| panic!("python3: {e}; install it (.ci/kernel_symbols.sh)"));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn string_attr(attrs: &[(String, Value)], key: &str) -> String {
    match attrs.iter().find(|(k, _)| k == key) {
        Some((_, Value::StringValue(s))) => s.clone(),
        _ => String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_after_exec_carry_the_new_executable() {
    if !require_bpf("samples_after_exec_carry_the_new_executable") {
        return;
    }
    let py = python3();
    let script = format!(
        "read go; end=$((SECONDS + 2)); while [ $SECONDS -lt $end ]; do :; done; \
         exec '{py}' -c 'import time\nend = time.time() + 2\nwhile time.time() < end: pass'"
    );
    let child = Command::new("bash").args(["-c", &script]).stdin(Stdio::piped()).spawn().expect("bash");
    let pid = child.id();
    let running = start(EbpfConfig {
        sample_frequency: 99,
        report_interval: Duration::from_millis(500),
        pids: vec![pid],
        sample_attributes: vec![SampleAttribute::ThreadName],
        ..Default::default()
    })
    .await;
    profcol_testkit::workload::release_and_finish(child).await;
    let (batches, metrics) = running.stop().await;

    // The kernel's comm at each sample says which image ran: "bash", then
    // the name python3 was exec'd by.
    let (mut before, mut before_bash, mut after, mut after_python) = (0, 0, 0, 0);
    for s in samples_of(&batches, pid) {
        let comm = string_attr(&s.attrs, keys::THREAD_NAME);
        let exe = string_attr(&s.resource, keys::PROCESS_EXECUTABLE_NAME);
        if comm == "bash" {
            before += s.count;
            before_bash += if exe == "bash" { s.count } else { 0 };
        } else if comm.starts_with("python3") {
            after += s.count;
            after_python += if exe.starts_with("python3") { s.count } else { 0 };
        }
    }
    eprintln!("exec: before {before_bash}/{before} say bash, after {after_python}/{after} say python3");
    assert!(before >= 30 && after >= 30, "too few samples: {before} before, {after} after\n{metrics}");
    assert!(after_python as f64 >= 0.95 * after as f64, "after the exec only {after_python} of {after} say python3");
    assert!(before_bash as f64 >= 0.95 * before as f64, "before the exec only {before_bash} of {before} say bash");
    assert!(metrics.contains("profcol_receiver_ebpf_process_exec_reloads_total{receiver=\"ebpf\"} 1"), "{metrics}");
}

/// Short-lived processes (a shell copy under a name of its own, started 30
/// times, each burning ~30 ms) exit long before the receiver reads their
/// samples (every 500 ms here, frame-pointer mode: nothing wakes it
/// earlier). /proc has nothing left of them then; the kernel's exec and
/// mapping records name them: executable, mapping and build ID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_gone_before_their_samples_are_read_are_named() {
    if !require_bpf("processes_gone_before_their_samples_are_read_are_named") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sh = std::fs::canonicalize("/bin/sh").expect("/bin/sh");
    let burner = dir.path().join("shortlived-burn");
    std::fs::copy(&sh, &burner).expect("copy the shell");
    let running = start(EbpfConfig {
        sample_frequency: 999,
        report_interval: Duration::from_millis(500),
        unwind: profcol_receivers::ebpf::config::UnwindConfig {
            mode: profcol_receivers::ebpf::config::UnwindMode::FramePointers,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let mut pids = Vec::new();
    for _ in 0..30 {
        let mut child = Command::new(&burner)
            .args(["-c", "i=0; while [ $i -lt 40000 ]; do i=$((i+1)); done"])
            .spawn()
            .expect("spawn the burner");
        pids.push(child.id());
        child.wait().unwrap();
    }
    let (batches, metrics) = running.stop().await;

    let (mut samples, mut named, mut mapped) = (0, 0, 0);
    for &pid in &pids {
        for s in samples_of(&batches, pid) {
            samples += s.count;
            if string_attr(&s.resource, keys::PROCESS_EXECUTABLE_NAME) == "shortlived-burn" {
                named += s.count;
            }
            // The user leaf (in the shell or the C library): in a mapping
            // of a file, with its build id.
            let leaf = s.frames.iter().find(|f| f.frame_type != "kernel");
            if leaf
                .is_some_and(|f| !f.mapping_filename.is_empty() && f.build_id.as_deref().is_some_and(|b| !b.is_empty()))
            {
                mapped += s.count;
            }
        }
    }
    eprintln!("short-lived: {named}/{samples} named, {mapped}/{samples} leaves mapped with a build id");
    assert!(samples >= 100, "too few samples of the burners: {samples}\n{metrics}");
    assert!(named as f64 >= 0.95 * samples as f64, "only {named} of {samples} samples named\n{metrics}");
    assert!(mapped as f64 >= 0.9 * samples as f64, "only {mapped} of {samples} leaves mapped\n{metrics}");
    assert!(metric(&metrics, "profcol_receiver_ebpf_processes_from_records_total") >= 25.0, "{metrics}");
}
