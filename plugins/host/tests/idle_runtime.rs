//! A process that sets the plugin cache directory and perf map (as `profcol`
//! always does at start) but loads no plugin runs no wasmtime engine and no epoch
//! ticker thread: that thread wakes every `EPOCH_TICK` (2 ms), and a node
//! agent without plugins must not pay for it. Its own test binary, so no
//! other test has started the runtime in this process.

fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter(|t| {
            let comm = std::fs::read_to_string(t.as_ref().unwrap().path().join("comm")).unwrap_or_default();
            comm.trim_end() == name
        })
        .count()
}

#[test]
fn setting_the_cache_dir_starts_no_epoch_ticker() {
    let dir = std::env::temp_dir().join(format!("profcol-idle-runtime-{}", std::process::id()));
    profcol_plugins::set_cache_dir(Some(dir.clone()));
    profcol_plugins::set_cache_dir(None);
    profcol_plugins::set_perf_map(true);
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(threads_named("plugin-epoch"), 0, "the epoch ticker runs with no plugin loaded");
    assert!(!dir.exists(), "the cache directory was created with no plugin to compile");
    let map = format!("/tmp/perf-{}.map", std::process::id());
    assert!(!std::path::Path::new(&map).exists(), "{map} was created with no plugin loaded");
}
