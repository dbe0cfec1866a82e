//! Workloads the eBPF tests profile: child processes that wait on stdin for
//! their cue, so the receiver is running before they do their work.

use std::io::Write;
use std::process::Child;
use std::time::Duration;

/// Cues a workload waiting for a line on stdin, waits until it exited
/// successfully, then leaves the receiver 300 ms to read its last samples.
pub async fn release_and_finish(mut child: Child) {
    let mut stdin = child.stdin.take().expect("the workload was spawned with a piped stdin");
    writeln!(stdin, "go").expect("the workload reads its cue");
    drop(stdin);
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("the waiting thread ran")
        .expect("the workload's status");
    assert!(status.success(), "the workload failed: {status}");
    tokio::time::sleep(Duration::from_millis(300)).await;
}
