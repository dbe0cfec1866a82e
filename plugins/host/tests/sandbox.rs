//! The sandbox: a plugin reads no file, environment variable or socket
//! unless the config grants it; each refusal is shown beside the granted
//! case working, so the tests would fail with the sandbox off.

mod common;
use common::*;
use profcol_api::component::ProcessOutcome;
use profcol_api::telemetry::Telemetry;
use profcol_testkit::prelude::*;

/// Runs one batch; returns the plugin's counter `name` (None: the plugin
/// failed before counting) and the failure log count.
async fn run(yaml: &str, name: &str) -> (Option<u64>, u64) {
    let t = Telemetry::new();
    let p = processor(yaml, &t);
    let input = cpu_batch(1, 1, 5);
    assert!(matches!(p.process(input).await.unwrap(), ProcessOutcome::Forward(_)));
    let text = t.render();
    let series = format!("profcol_plugin_counter_total{{component=\"wasm/test\",name=\"{name}\"}} ");
    let value = text.lines().find_map(|l| l.strip_prefix(&series)).map(|v| v.parse().unwrap());
    let failures = "profcol_plugin_failures_total{component=\"wasm/test\",kind=\"plugin_error\"} ";
    let failed = text.lines().find_map(|l| l.strip_prefix(failures)).map_or(0, |v| v.parse().unwrap());
    (value, failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_only_in_granted_directories() {
    let (read, failed) = run("path: PLUGIN\nconfig: {mode: read_file, arg: /etc/passwd}", "read_bytes").await;
    assert_eq!((read, failed), (None, 1), "/etc/passwd is out of reach");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret.txt"), "eleven char").unwrap();
    let grant = format!("allow: {{dirs: {{{}: /data}}}}", dir.path().display());
    let (read, failed) =
        run(&format!("path: PLUGIN\nconfig: {{mode: read_file, arg: /data/secret.txt}}\n{grant}"), "read_bytes").await;
    assert_eq!((read, failed), (Some(11), 0), "the granted directory is readable");
    let (read, _) =
        run(&format!("path: PLUGIN\nconfig: {{mode: read_file, arg: /etc/passwd}}\n{grant}"), "read_bytes").await;
    assert_eq!(read, None, "a grant opens that directory only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_directories_are_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let grant = format!("allow: {{dirs: {{{}: /data}}}}", dir.path().display());
    // The plugin cannot create files there (read_file of a missing file
    // fails; the host dir stays empty whatever the plugin tried).
    let (read, failed) =
        run(&format!("path: PLUGIN\nconfig: {{mode: read_file, arg: /data/none}}\n{grant}"), "read_bytes").await;
    assert_eq!((read, failed), (None, 1));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_variables_only_when_granted() {
    // SAFETY: set before any plugin runs; no other thread reads this name.
    std::env::set_var("PROFCOL_WASM_TEST_SECRET", "hunter2");
    let (n, failed) = run("path: PLUGIN\nconfig: {mode: env, arg: PROFCOL_WASM_TEST_SECRET}", "env_bytes").await;
    assert_eq!((n, failed), (None, 1), "not granted: not visible");
    let (n, failed) = run(
        "path: PLUGIN\nconfig: {mode: env, arg: PROFCOL_WASM_TEST_SECRET}\nallow: {env: [PROFCOL_WASM_TEST_SECRET]}",
        "env_bytes",
    )
    .await;
    assert_eq!((n, failed), (Some(7), 0), "granted: the plugin reads it");
    let (n, _) =
        run("path: PLUGIN\nconfig: {mode: env, arg: HOME}\nallow: {env: [PROFCOL_WASM_TEST_SECRET]}", "env_bytes")
            .await;
    assert_eq!(n, None, "a grant names variables one by one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_are_refused() {
    let (listener, addr) = listener();
    listener.set_nonblocking(true).unwrap();
    let (n, failed) = run(&format!("path: PLUGIN\nconfig: {{mode: socket, arg: '{addr}'}}"), "connected").await;
    assert_eq!((n, failed), (None, 1));
    assert!(
        listener.accept().is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
        "no connection reached the listener"
    );
    // The same connect from the host itself works: the refusal is the sandbox's.
    assert!(std::net::TcpStream::connect(addr).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wall_clock_says_1970() {
    let (secs, failed) = run("path: PLUGIN\nconfig: {mode: wall_clock}", "wall_clock_secs").await;
    assert_eq!((secs, failed), (Some(0), 0));
}
