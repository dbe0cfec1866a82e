//! The misbehaving test plugins of `plugins/testdata` (built for
//! wasm32-wasip2 by its build.sh, once per test process; incremental).

use std::path::PathBuf;
use std::sync::OnceLock;

/// `plugins/testdata/out/NAME.wasm`, built if needed. Panics with the build's
/// output when it cannot be built (the wasm32-wasip2 target missing, say:
/// `.ci/plugins-host.sh` installs it).
pub fn test_plugin(name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plugins/testdata");
    let built = BUILT.get_or_init(|| {
        let out = std::process::Command::new(root.join("build.sh"))
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .output()
            .map_err(|e| format!("cannot run plugins/testdata/build.sh: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "plugins/testdata/build.sh failed (is the wasm32-wasip2 target installed? .ci/plugins-host.sh adds it):\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    });
    if let Err(e) = built {
        panic!("{e}");
    }
    let p = root.join("out").join(format!("{name}.wasm"));
    assert!(p.exists(), "{} is missing after the build", p.display());
    p
}
