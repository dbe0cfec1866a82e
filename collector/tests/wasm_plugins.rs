//! WebAssembly plugins through the real binary: misbehaving plugins in a
//! pipeline lose no batch under `on_error: pass`; a changed plugin file is
//! picked up by SIGHUP without dropping a batch, an unchanged one is not
//! recompiled; `profcol validate` points at a bad plugin's `path`.

mod common;
use common::*;
use profcol_api::model::canonical;
use profcol_testkit::plugins::test_plugin;
use std::path::Path;
use std::time::Duration;

fn all_samples(batches: &[profcol_api::Profiles]) -> Vec<canonical::CanonicalSample> {
    let mut v: Vec<_> = batches.iter().flat_map(canonical::samples).collect();
    v.sort();
    v
}

/// A file → processors → file pipeline; `processors` is the YAML of the
/// processors section, `names` their ids in order.
fn config(dir: &Path, receiver: &str, processors: &str, names: &str) -> String {
    format!(
        "receivers:\n  file:\n{receiver}\nprocessors:\n{processors}\nexporters:\n  file:\n    path: DIR/out.jsonl\nservice:\n  shutdown_timeout: 60s\n  plugins:\n    cache_dir: DIR/cache\n  telemetry:\n    metrics:\n      address: 127.0.0.1:0\n  pipelines:\n    profiles:\n      receivers: [file]\n      processors: [{names}]\n      exporters: [file]\n"
    )
    .replace("DIR", &dir.display().to_string())
}

fn metric(addr: &str, series: &str) -> u64 {
    let (_, text) = http_get(addr, "/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .map_or(0, |v| v.parse().unwrap())
}

#[test]
fn misbehaving_plugins_lose_no_batch_under_on_error_pass() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = write_corpus(&dir.path().join("in"), 12, 60);
    let plugin = test_plugin("misbehave");
    let p = plugin.display();
    let processors = format!(
        "  wasm/loop: {{path: {p}, config: {{mode: loop}}, call_timeout: 100ms}}\n  wasm/bomb: {{path: {p}, config: {{mode: bomb}}, memory_limit: 16MiB}}\n  wasm/recurse: {{path: {p}, config: {{mode: recurse}}}}\n  wasm/trap: {{path: {p}, config: {{mode: trap}}}}\n  wasm/garbage: {{path: {p}, config: {{mode: garbage}}}}"
    );
    let cfg = config(
        dir.path(),
        "    path: DIR/in",
        &processors,
        "wasm/loop, wasm/bomb, wasm/recurse, wasm/trap, wasm/garbage",
    );
    let cfgp = write(&dir.path().join("c.yaml"), &cfg);
    let mut pc = Profcol::start(&["--config", cfgp.to_str().unwrap()]);
    let want = all_samples(&corpus);
    let out = dir.path().join("out.jsonl");
    assert!(wait_until(Duration::from_secs(60), || all_samples(&read_jsonl(&out)).len() >= want.len()));
    assert!(pc.child.try_wait().unwrap().is_none(), "profcol keeps running");
    let addr = pc.wait_addr("serving metrics", "address", Duration::from_secs(5)).to_string();
    for (component, kind) in [
        ("loop", "timeout"),
        ("bomb", "memory"),
        ("recurse", "stack_overflow"),
        ("trap", "trap"),
        ("garbage", "invalid_output"),
    ] {
        let series = format!("profcol_plugin_failures_total{{component=\"wasm/{component}\",kind=\"{kind}\"}}");
        assert!(metric(&addr, &series) >= 1, "{series} counted");
        // Logged with the component id, the file hash and the trap message.
        assert!(pc.log_count(&format!("component=wasm/{component} plugin_sha256=")) >= 1, "wasm/{component} logged");
    }
    pc.signal(libc::SIGTERM);
    assert!(pc.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
    assert_eq!(all_samples(&read_jsonl(&out)), want, "every sample came through unchanged");
}

#[test]
fn sighup_with_a_changed_plugin_switches_code_without_dropping_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = write_corpus(&dir.path().join("in"), 40, 30);
    let plugin = dir.path().join("p.wasm");
    std::fs::copy(test_plugin("misbehave"), &plugin).unwrap();
    let processors = "  wasm/x:\n    path: DIR/p.wasm\n    config: {mode: pass}\n    call_timeout: 100ms";
    let cfg = config(dir.path(), "    path: DIR/in\n    replay_rate: 5", processors, "wasm/x");
    let cfgp = write(&dir.path().join("c.yaml"), &cfg);
    let mut pc = Profcol::start(&["--config", cfgp.to_str().unwrap()]);
    let addr = pc.wait_addr("serving metrics", "address", Duration::from_secs(20)).to_string();
    let calls =
        |v: &str| metric(&addr, &format!("profcol_plugin_counter_total{{component=\"wasm/x\",name=\"{v}_calls\"}}"));
    let compiles =
        |s: &str| metric(&addr, &format!("profcol_plugin_compiles_total{{component=\"wasm/x\",source=\"{s}\"}}"));
    assert!(wait_until(Duration::from_secs(20), || calls("v1") >= 2), "v1 runs");
    assert_eq!((compiles("compile"), compiles("cache")), (1, 0));
    // The new version lands atomically (rename), then SIGHUP.
    let tmp = dir.path().join("p.wasm.new");
    std::fs::copy(test_plugin("misbehave_v2"), &tmp).unwrap();
    std::fs::rename(&tmp, &plugin).unwrap();
    pc.signal(libc::SIGHUP);
    assert!(pc.wait_log("configuration reloaded", Duration::from_secs(20)));
    let v1_then = calls("v1");
    assert!(wait_until(Duration::from_secs(20), || calls("v2") >= 2), "v2 runs after the reload");
    assert_eq!(calls("v1"), v1_then, "v1 no longer runs");
    assert_eq!(compiles("compile"), 2);
    // Another setting changes, the file does not: rebuilt without a compile.
    write(&cfgp, &cfg.replace("call_timeout: 100ms", "call_timeout: 200ms"));
    pc.signal(libc::SIGHUP);
    assert!(wait_until(Duration::from_secs(20), || pc.log_count("configuration reloaded") == 2));
    assert_eq!((compiles("compile"), compiles("cache")), (2, 1), "the unchanged file was not compiled again");
    // A reload with nothing changed keeps the instance: no load at all.
    pc.signal(libc::SIGHUP);
    assert!(wait_until(Duration::from_secs(20), || pc.log_count("configuration reloaded") == 3));
    assert_eq!((compiles("compile"), compiles("cache")), (2, 1));
    let want = all_samples(&corpus);
    let out = dir.path().join("out.jsonl");
    assert!(wait_until(Duration::from_secs(60), || all_samples(&read_jsonl(&out)).len() >= want.len()));
    pc.signal(libc::SIGTERM);
    assert!(pc.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
    assert_eq!(all_samples(&read_jsonl(&out)), want, "no batch was lost across the reloads");
}

/// `profcol validate` on a config whose wasm processor's `path` is `plugin`.
fn validate(plugin: &Path) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = format!(
        "receivers:\n  file:\n    path: /tmp\nprocessors:\n  wasm/x:\n    path: {}\nexporters:\n  debug:\nservice:\n  pipelines:\n    profiles:\n      receivers: [file]\n      processors: [wasm/x]\n      exporters: [debug]\n",
        plugin.display()
    );
    let p = write(&dir.path().join("c.yaml"), &cfg);
    let out = std::process::Command::new(bin()).arg("validate").arg("--config").arg(&p).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned(), p.display().to_string())
}

#[test]
fn validate_points_at_the_path_of_a_bad_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let core = write(&dir.path().join("core.wasm"), "\0asm\u{1}\0\0\0");
    let cases = [
        (dir.path().join("missing.wasm"), "cannot read plugin"),
        (core, "not a WebAssembly component"),
        (test_plugin("misbehave_export"), "implements world `exporter` but is used as a processor"),
        (
            test_plugin("future_version"),
            "built for WIT profcol:plugin@0.2.0, but this profcol implements profcol:plugin@0.1.0",
        ),
        (
            test_plugin("wrong_signature"),
            "its export `process` of `profcol:plugin/process-batch@0.1.0` has type `func(string) -> u32`, but \
             profcol:plugin@0.1.0 declares `func(list<u8>) -> result<option<list<u8>>",
        ),
    ];
    for (plugin, message) in cases {
        let (code, err, cfg) = validate(&plugin);
        assert_eq!(code, 1, "{err}");
        // Line 6, column 5: the `path` key.
        assert!(err.contains(&format!("{cfg}:6:5: processors::wasm/x::path: ")), "{err}");
        assert!(err.contains(message), "{message:?} in {err}");
    }
    let (code, err, _) = validate(&test_plugin("misbehave"));
    assert_eq!(code, 0, "{err}");
}

#[test]
fn plugin_inspect_and_run() {
    let out =
        std::process::Command::new(bin()).args(["plugin", "inspect"]).arg(test_plugin("misbehave")).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("world:    processor (profcol:plugin@0.1.0; compatible"), "{text}");
    assert!(
        text.contains("  profcol:plugin/host@0.1.0") && text.contains("  profcol:plugin/process-batch@0.1.0"),
        "{text}"
    );
    assert!(text.contains("  wasi:cli/environment@0.2"), "{text}");
    let out = std::process::Command::new(bin())
        .args(["plugin", "inspect"])
        .arg(test_plugin("wrong_signature"))
        .output()
        .unwrap();
    let wrong = String::from_utf8_lossy(&out.stdout);
    assert!(
        wrong.contains("world:    processor (profcol:plugin@0.1.0; NOT compatible: its export `process`")
            && wrong.contains("has type `func(string) -> u32`"),
        "{wrong}"
    );
    let dir = tempfile::tempdir().unwrap();
    let batch = write_corpus(dir.path(), 1, 50).remove(0);
    let input = dir.path().join("batch-0000.pb");
    let run = |plugin: &str, config: &str| {
        let out = std::process::Command::new(bin())
            .args(["plugin", "run"])
            .arg(test_plugin(plugin))
            .arg("--input")
            .arg(&input)
            .args(["--config", config])
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
    };
    let n = batch.sample_count();
    let (code, text) = run("misbehave", "{\"mode\": \"pass\"}");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(&format!("output:   {n} samples")) && text.contains("valid"), "{text}");
    let (code, text) = run("misbehave", "{\"mode\": \"loop\"}");
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("plugin timeout"), "{text}");
    let (code, text) = run("misbehave_export", "{\"sinks\": [\"out\"]}");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("--- sink \"out\", text/plain") && text.contains(" bytes\n"), "{text}");
}

#[test]
fn a_wasm_exporter_delivers_every_batch_with_one_instance_per_queue_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = write_corpus(&dir.path().join("in"), 9, 20);
    let cfg = format!(
        "receivers:\n  file:\n    path: DIR/in\nexporters:\n  wasm/lines:\n    path: {}\n    config: {{sinks: [out]}}\n    sinks: {{out: {{file: DIR/lines.txt}}}}\n    sending_queue: {{num_consumers: 3}}\nservice:\n  plugins:\n    cache_dir: DIR/cache\n  telemetry:\n    metrics:\n      address: 127.0.0.1:0\n  pipelines:\n    profiles:\n      receivers: [file]\n      exporters: [wasm/lines]\n",
        test_plugin("misbehave_export").display()
    )
    .replace("DIR", &dir.path().display().to_string());
    let cfgp = write(&dir.path().join("c.yaml"), &cfg);
    let mut pc = Profcol::start(&["--config", cfgp.to_str().unwrap()]);
    let addr = pc.wait_addr("serving metrics", "address", Duration::from_secs(20)).to_string();
    let out = dir.path().join("lines.txt");
    let lines = || std::fs::read_to_string(&out).map_or(0, |t| t.lines().count());
    assert!(wait_until(Duration::from_secs(30), || lines() >= corpus.len()), "{} of {} batches", lines(), corpus.len());
    // The plugin counts its inits: one instance per consumer, made at start.
    let inits = metric(&addr, "profcol_plugin_counter_total{component=\"wasm/lines\",name=\"inits\"}");
    assert_eq!(inits, 3, "sending_queue.num_consumers instances");
    pc.signal(libc::SIGTERM);
    assert!(pc.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
    let mut want: Vec<String> = corpus.iter().map(|b| format!("{} bytes", b.encode_to_vec().len())).collect();
    let mut got: Vec<String> = std::fs::read_to_string(&out).unwrap().lines().map(str::to_owned).collect();
    want.sort();
    got.sort();
    assert_eq!(got, want, "each batch delivered once");
}

fn run_plugin(plugin: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(bin()).args(["plugin", "run"]).arg(plugin).args(args).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn plugin_run_grants_and_limits_and_gen_batch_makes_large_batches() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("big.pb");
    let out = std::process::Command::new(bin())
        .args(["plugin", "gen-batch", "--samples", "50000", "-o"])
        .arg(&input)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("50000 samples in 16 profiles"), "{text}");
    let input = input.to_str().unwrap();
    let plugin = test_plugin("misbehave");
    // The batch is realistic enough for the host's checks, and takes time.
    let (code, text) = run_plugin(&plugin, &["--input", input, "--call-timeout", "10s"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("output:   50000 samples in 16 profiles") && text.contains(", valid)"), "{text}");
    // The grants and limits, on a small batch with time to spare.
    let small = dir.path().join("small.pb");
    let out = std::process::Command::new(bin())
        .args(["plugin", "gen-batch", "--samples", "1000", "-o"])
        .arg(&small)
        .output()
        .unwrap();
    assert!(out.status.success());
    let input = small.to_str().unwrap();
    // --allow-env grants a variable, as allow.env does.
    let env = ["--plugin-config", r#"{"mode": "env", "arg": "PROFCOL_RUN_TEST"}"#];
    let with_env = |grant: bool| {
        let mut cmd = std::process::Command::new(bin());
        cmd.args(["plugin", "run"])
            .arg(&plugin)
            .args(["--input", input, "--call-timeout", "10s"])
            .args(env)
            .env("PROFCOL_RUN_TEST", "x");
        if grant {
            cmd.args(["--allow-env", "PROFCOL_RUN_TEST"]);
        }
        let out = cmd.output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
    };
    let (code, text) = with_env(false);
    assert!(code == Some(1) && text.contains("env PROFCOL_RUN_TEST"), "{text}");
    let (code, text) = with_env(true);
    assert_eq!(code, Some(0), "{text}");
    // --allow-dir grants a directory, read-only, where the plugin sees it.
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("rules.txt"), "abc").unwrap();
    let read = ["--plugin-config", r#"{"mode": "read_file", "arg": "/rules/rules.txt"}"#];
    let (code, text) = run_plugin(&plugin, &[&["--input", input, "--call-timeout", "10s"][..], &read].concat());
    assert_eq!(code, Some(1), "not granted: {text}");
    let grant = format!("{}:/rules", data.display());
    let (code, text) =
        run_plugin(&plugin, &[&["--input", input, "--call-timeout", "10s", "--allow-dir", &grant][..], &read].concat());
    assert_eq!(code, Some(0), "{text}");
    // --memory-limit: 32 MiB is refused under 16MiB, allowed under 64MiB.
    let alloc = ["--plugin-config", r#"{"mode": "alloc", "mb": 32}"#];
    let (code, text) = run_plugin(
        &plugin,
        &[&["--input", input, "--call-timeout", "10s", "--memory-limit", "16MiB"][..], &alloc].concat(),
    );
    assert!(code == Some(1) && text.contains("plugin memory"), "{text}");
    let (code, text) = run_plugin(
        &plugin,
        &[&["--input", input, "--call-timeout", "10s", "--memory-limit", "64MiB"][..], &alloc].concat(),
    );
    assert_eq!(code, Some(0), "{text}");
    // A call near call_timeout is worth a warning: a larger batch would time out.
    let spin = ["--plugin-config", r#"{"mode": "pass"}"#, "--call-timeout", "1ms"];
    let big = dir.path().join("big.pb");
    let (_, text) = run_plugin(&plugin, &[&["--input", big.to_str().unwrap()][..], &spin].concat());
    assert!(text.contains("plugin timeout") || text.contains("warning: the call took"), "{text}");
    // The help names the plugin's config apart from the collector's --config FILE.
    let help = std::process::Command::new(bin()).args(["plugin", "run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--plugin-config <JSON>") && help.contains("--allow-dir <HOST:GUEST>"), "{help}");
}

#[test]
fn a_wasm_exporter_frees_the_outputs_of_batches_it_dropped() {
    let dir = tempfile::tempdir().unwrap();
    write_corpus(&dir.path().join("in"), 6, 10);
    let port = profcol_testkit::net::closed_port();
    let cfg = format!(
        "receivers:\n  file:\n    path: DIR/in\nexporters:\n  wasm/web:\n    path: {}\n    config: {{mode: big, mb: 8, sinks: [web]}}\n    sinks: {{web: {{http: {{endpoint: 'http://127.0.0.1:{port}/in'}}}}}}\n    retry_on_failure: {{initial_interval: 50ms, max_interval: 100ms, max_elapsed_time: 300ms}}\n    sending_queue: {{num_consumers: 2}}\nservice:\n  plugins:\n    cache_dir: DIR/cache\n  telemetry:\n    metrics:\n      address: 127.0.0.1:0\n  pipelines:\n    profiles:\n      receivers: [file]\n      exporters: [wasm/web]\n",
        test_plugin("misbehave_export").display()
    )
    .replace("DIR", &dir.path().display().to_string());
    let cfgp = write(&dir.path().join("c.yaml"), &cfg);
    let mut pc = Profcol::start(&["--config", cfgp.to_str().unwrap()]);
    let addr = pc.wait_addr("serving metrics", "address", Duration::from_secs(20)).to_string();
    let dropped = || metric(&addr, "profcol_exporter_dropped_batches_total{exporter=\"wasm/web\"}");
    assert!(wait_until(Duration::from_secs(30), || dropped() == 6), "{} of 6 batches dropped", dropped());
    let pending = metric(&addr, "profcol_plugin_pending_output_bytes{component=\"wasm/web\"}");
    assert_eq!(pending, 0, "the outputs of dropped batches are freed");
    pc.signal(libc::SIGTERM);
    assert!(pc.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
}

#[test]
fn a_log_flood_s_last_dropped_lines_are_reported_and_a_cache_open_to_others_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = write_corpus(&dir.path().join("in"), 1, 10);
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    std::fs::set_permissions(&cache, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let processors = format!(
        "  wasm/flood: {{path: {}, config: {{mode: log_flood}}, call_timeout: 5s}}",
        test_plugin("misbehave").display()
    );
    let cfg = config(dir.path(), "    path: DIR/in", &processors, "wasm/flood");
    let cfgp = write(&dir.path().join("c.yaml"), &cfg);
    let mut pc = Profcol::start(&["--config", cfgp.to_str().unwrap()]);
    let out = dir.path().join("out.jsonl");
    assert!(wait_until(Duration::from_secs(30), || all_samples(&read_jsonl(&out)).len() >= all_samples(&corpus).len()));
    // One call wrote 10,000 lines: the burst went out, the rest is said.
    assert!(pc.wait_log("lines dropped", Duration::from_secs(5)), "the flood's end is reported");
    assert_eq!(pc.log_count("plugin log rate limit: "), 1);
    assert!(
        pc.log_count("plugin compile cache unusable") == 1 && pc.log_count("mode 0777 lets other users write") == 1
    );
    pc.signal(libc::SIGTERM);
    assert!(pc.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&cache).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o777, "refused, not changed");
}
