//! exec noticed (#17): a bash that burns CPU and then execs python3, which
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
