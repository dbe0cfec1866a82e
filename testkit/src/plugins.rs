//! WebAssembly plugins the tests load, built for wasm32-wasip2 once per test
//! process by their own build script (incremental): the misbehaving test
//! plugins of `plugins/testdata` and the examples of `examples/plugins`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `plugins/testdata/out/NAME.wasm`, built if needed. Panics with the build's
/// output when it cannot be built (the wasm32-wasip2 target missing, say:
/// `.ci/plugins-host.sh` installs it).
pub fn test_plugin(name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    built(&BUILT, "plugins/testdata", ".ci/plugins-host.sh installs the wasm32-wasip2 target", name)
}

/// `examples/plugins/out/NAME.wasm`, built if needed (`.ci/plugins.sh`
/// installs what the build needs: the wasm32-wasip2 target, componentize-py).
pub fn example_plugin(name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    built(&BUILT, "examples/plugins", ".ci/plugins.sh installs the wasm32-wasip2 target and componentize-py", name)
}

/// Runs `DIR/build.sh` once (per `once`) and returns `DIR/out/NAME.wasm`.
fn built(once: &OnceLock<Result<(), String>>, dir: &str, what_installs: &str, name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
    let result = once.get_or_init(|| {
        let out = std::process::Command::new(root.join("build.sh"))
            // The build scripts pick their own target directories and flags.
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .output()
            .map_err(|e| format!("cannot run {dir}/build.sh: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{dir}/build.sh failed ({what_installs}):\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let p = root.join("out").join(format!("{name}.wasm"));
    assert!(p.exists(), "{} is missing after the build", p.display());
    p
}
