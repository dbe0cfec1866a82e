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

/// Whether this run is CI (CI=true), where nothing may be skipped. The one
/// place tests read `CI`.
pub fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Whether `test` can run: `Ok` runs it; an error (what is missing, and the
/// remedy) skips it with a message outside CI and fails it under CI=true.
/// Tests state every need this way: privileges, hardware, kernel features.
pub fn require(test: &str, need: Result<(), impl std::fmt::Display>) -> bool {
    match need {
        Ok(()) => true,
        Err(e) if in_ci() => panic!("{test}: CI=true but this test cannot run: {e}"),
        Err(e) => {
            eprintln!("SKIPPED {test}: {e} (CI=true turns this into a failure)");
            false
        }
    }
}

/// The one privileges check of tests that need root itself (kallsyms
/// addresses, bpf(2) program listing), not only capabilities: `require`
/// with "is the effective uid 0". `why` says what root is needed for.
pub fn require_root(test: &str, why: &str) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let need = if euid == 0 { Ok(()) } else { Err(format!("needs root ({why}); run the tests as root")) };
    require(test, need)
}

/// A child process killed (and reaped) if the test ends first, a failed
/// assertion included.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
