//! External tools some tests run (go, python3, gcc, ...). Under CI=true a
//! missing tool fails the test: CI must run everything.

/// Whether `cmd args` runs and succeeds. Outside CI a missing tool skips the
/// test with a message; under CI=true it panics naming the installer part.
pub fn tool_available(cmd: &str, args: &[&str]) -> bool {
    let ok = std::process::Command::new(cmd)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        if in_ci() {
            panic!("`{cmd}` is required under CI=true; run .ci/test (its .ci/*.sh parts install it)");
        }
        eprintln!("SKIPPED: `{cmd}` is not installed (run .ci/test); CI=true turns this into a failure");
    }
    ok
}

/// Whether this run is CI (CI=true), where nothing may be skipped.
pub fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}
