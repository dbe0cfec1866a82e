//! Misbehaving plugins through the real host runtime (wasmtime, the pool,
//! the limits): each wrong thing a plugin can do ends its call, is counted
//! and logged, and under `on_error: pass` the batch goes on unchanged.

use profcol_api::component::{ComponentId, CreateSettings, Factory, Kind, ProcessOutcome};
use profcol_api::telemetry::Telemetry;
use profcol_plugins::plugin::{CallError, FailureKind, Plugin, PluginSettings};
use profcol_plugins::processor::ProcessorFactory;
use profcol_plugins::sandbox::Allow;
use profcol_plugins::World;
use profcol_testkit::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_bomb_is_capped_at_memory_limit() {
    let t = Telemetry::new();
    let bomb = processor("path: PLUGIN\nconfig: {mode: bomb}\nmemory_limit: 16MiB\ncall_timeout: 5s", &t);
    let input = batch();
    let start = Instant::now();
    assert_passed(bomb.process(input.clone()).await.unwrap(), &input);
    assert!(start.elapsed() < Duration::from_secs(5), "the limit, not the timeout, ended it");
    assert_eq!(failures(&t, "memory"), 1, "{}", t.render());
    // Below the limit the plugin allocates; above it, it cannot.
    let t = Telemetry::new();
    let small = processor("path: PLUGIN\nconfig: {mode: alloc, mb: 8}\nmemory_limit: 16MiB", &t);
    assert_passed(small.process(input.clone()).await.unwrap(), &input);
    assert_eq!(counter(&t, "allocated_mib"), Some(8));
    let t = Telemetry::new();
    let big = processor("path: PLUGIN\nconfig: {mode: alloc, mb: 32}\nmemory_limit: 16MiB", &t);
    assert_passed(big.process(input.clone()).await.unwrap(), &input);
    assert_eq!(counter(&t, "allocated_mib"), None);
    assert_eq!(failures(&t, "memory"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbounded_recursion_traps_cleanly() {
    let t = Telemetry::new();
    let p = processor("path: PLUGIN\nconfig: {mode: recurse}\ncall_timeout: 5s", &t);
    for _ in 0..2 {
        let input = batch();
        assert_passed(p.process(input.clone()).await.unwrap(), &input);
    }
    assert_eq!(failures(&t, "stack_overflow"), 2, "{}", t.render());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_discards_the_instance_and_a_fresh_one_takes_over() {
    // trap_second: each instance traps on its own second call. A fresh
    // instance after the trap answers the next call, then traps again.
    let t = Telemetry::new();
    let p = processor("path: PLUGIN\nconfig: {mode: trap_second}\npool_size: 1", &t);
    let ok = "profcol_plugin_calls_total{component=\"wasm/test\",outcome=\"ok\"}";
    for (call, (oks, traps)) in [(1, 0), (1, 1), (2, 1), (2, 2), (3, 2)].into_iter().enumerate() {
        let input = batch();
        assert_passed(p.process(input.clone()).await.unwrap(), &input);
        assert_eq!((metric(&t, ok), failures(&t, "trap")), (oks, traps), "after call {}", call + 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_traps_disable_the_plugin_and_it_is_tried_again_after_the_window() {
    let t = Telemetry::new();
    let p = processor("path: PLUGIN\nconfig: {mode: trap}\nmax_failures: 3\nfailure_window: 400ms", &t);
    let disabled = "profcol_plugin_disabled{component=\"wasm/test\"}";
    let skipped = "profcol_plugin_calls_total{component=\"wasm/test\",outcome=\"disabled\"}";
    for _ in 0..3 {
        let input = batch();
        assert_passed(p.process(input.clone()).await.unwrap(), &input);
    }
    assert_eq!((failures(&t, "trap"), metric(&t, disabled)), (3, 1));
    // Disabled: the plugin is not called, the batch still passes.
    let input = batch();
    assert_passed(p.process(input.clone()).await.unwrap(), &input);
    assert_eq!((failures(&t, "trap"), metric(&t, skipped)), (3, 1));
    tokio::time::sleep(Duration::from_millis(450)).await;
    // Tried again: it traps again (counted), and is not yet disabled anew.
    let input = batch();
    assert_passed(p.process(input.clone()).await.unwrap(), &input);
    assert_eq!((failures(&t, "trap"), metric(&t, skipped), metric(&t, disabled)), (4, 1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_invalid_output_are_failures_not_corrupt_batches() {
    let t = Telemetry::new();
    let p = processor("path: PLUGIN\nconfig: {mode: garbage}", &t);
    let input = batch();
    assert_passed(p.process(input.clone()).await.unwrap(), &input);
    assert_eq!(failures(&t, "invalid_output"), 1);
    assert_eq!((calls(&t, "ok"), calls(&t, "error")), (0, 1), "the call counts once, as an error");
    // Decodes, but refers to a stack that does not exist: fails validate.
    let mut bad = batch();
    bad.0.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].stack_index = 99_999;
    assert!(bad.validate().is_err());
    let hex: String = bad.encode_to_vec().iter().map(|b| format!("{b:02x}")).collect();
    let t = Telemetry::new();
    let p = processor(&format!("path: PLUGIN\nconfig: {{mode: fixed, hex: '{hex}'}}\non_error: drop"), &t);
    match p.process(input.clone()).await.unwrap() {
        ProcessOutcome::Dropped { samples, .. } => assert_eq!(samples, input.sample_count() as u64),
        other => panic!("on_error: drop should drop, got {other:?}"),
    }
    assert_eq!(failures(&t, "invalid_output"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_answers_map_onto_processor_outcomes() {
    let input = batch();
    let n = input.sample_count() as u64;
    for mode in ["drop", "drop_error"] {
        let t = Telemetry::new();
        let p = processor(&format!("path: PLUGIN\nconfig: {{mode: {mode}}}"), &t);
        match p.process(input.clone()).await.unwrap() {
            ProcessOutcome::Dropped { samples, .. } => assert_eq!(samples, n, "{mode}"),
            other => panic!("{mode}: {other:?}"),
        }
        assert_eq!(failures(&t, "plugin_error"), 0, "{mode}: a drop is not a failure");
    }
    let t = Telemetry::new();
    let p = processor("path: PLUGIN\nconfig: {mode: permanent}", &t);
    assert_passed(p.process(input.clone()).await.unwrap(), &input);
    assert_eq!(failures(&t, "plugin_error"), 1);
    let p = processor("path: PLUGIN\nconfig: {mode: pass}", &t);
    assert_passed(p.process(input.clone()).await.unwrap(), &input);
    assert_eq!(counter(&t, "v1_calls"), Some(2), "counter-add reaches /metrics, labelled by component");
}

fn calls(t: &Telemetry, outcome: &str) -> u64 {
    metric(t, &format!("profcol_plugin_calls_total{{component=\"wasm/test\",outcome=\"{outcome}\"}}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_is_retried_max_retries_times_then_follows_on_error() {
    let input = batch();
    let t = Telemetry::new();
    let p = processor("path: PLUGIN\nconfig: {mode: retryable}\nmax_retries: 2\non_error: drop", &t);
    let start = Instant::now();
    match p.process(input.clone()).await {
        Ok(ProcessOutcome::Dropped { samples, reason }) => {
            assert_eq!(samples, input.sample_count() as u64);
            assert!(reason.contains("retries_exhausted"), "{reason}");
        }
        other => panic!("on_error: drop after the retries, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(1), "short pauses between retries: {:?}", start.elapsed());
    assert_eq!(counter(&t, "v1_calls"), Some(3), "the call and 2 retries");
    assert_eq!((calls(&t, "retryable"), calls(&t, "error"), calls(&t, "ok")), (3, 1, 0));
    assert_eq!(failures(&t, "retries_exhausted"), 1, "{}", t.render());
    // The default: 3 retries, then on_error: pass.
    let t = Telemetry::new();
    let p = processor("path: PLUGIN\nconfig: {mode: retryable}", &t);
    assert_passed(p.process(input.clone()).await.unwrap(), &input);
    assert_eq!(counter(&t, "v1_calls"), Some(4));
    // max_retries: 0 applies on_error at once.
    let t = Telemetry::new();
    let p = processor("path: PLUGIN\nconfig: {mode: retryable}\nmax_retries: 0", &t);
    assert_passed(p.process(input.clone()).await.unwrap(), &input);
    assert_eq!(counter(&t, "v1_calls"), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_past_128_mib_is_judged_by_memory_limit_and_counted_once() {
    // wasmtime's default hostcall limit (128 MiB) trapped any larger answer;
    // now memory_limit decides: 130 MiB of garbage is invalid output, not a trap.
    let input = batch();
    let t = Telemetry::new();
    let p = processor("path: PLUGIN\nconfig: {mode: garbage, mb: 130}\nmemory_limit: 512MiB\ncall_timeout: 20s", &t);
    assert_passed(p.process(input.clone()).await.unwrap(), &input);
    assert_eq!((failures(&t, "invalid_output"), failures(&t, "trap")), (1, 0), "{}", t.render());
    assert_eq!((calls(&t, "ok"), calls(&t, "error")), (0, 1), "one call, counted once, as an error");
    // Within a smaller memory_limit the plugin cannot even make it: memory.
    let t = Telemetry::new();
    let p = processor("path: PLUGIN\nconfig: {mode: garbage, mb: 130}\nmemory_limit: 64MiB\ncall_timeout: 20s", &t);
    assert_passed(p.process(input.clone()).await.unwrap(), &input);
    assert_eq!((failures(&t, "memory"), failures(&t, "trap")), (1, 0), "{}", t.render());
}

/// The misbehave plugin loaded directly (no component around it).
fn plugin(config: &str, allow: Allow, t: &Telemetry) -> Arc<Plugin> {
    let bytes = std::fs::read(test_plugin("misbehave")).unwrap();
    let settings = PluginSettings {
        component: "wasm/test".into(),
        config_json: config.into(),
        call_timeout: Duration::from_secs(5),
        memory_limit: 64 << 20,
        pool_size: 1,
        keep_idle: 1,
        max_failures: 100,
        failure_window: Duration::from_secs(60),
        allow,
        inherit_stdio: false,
    };
    Plugin::load(&bytes, World::Processor, settings, t.clone()).unwrap().plugin
}

#[test]
fn a_panic_s_message_is_part_of_the_failure() {
    let p = plugin(r#"{"mode": "panic_logged", "arg": "xyzzy"}"#, Allow::default(), &Telemetry::new());
    match p.process_blocking(&batch().encode_to_vec()) {
        Err(CallError::Failed { kind: FailureKind::Trap, message }) => {
            assert!(message.contains("the reason is xyzzy"), "{message}");
            assert!(message.contains("about to fail: xyzzy"), "what it wrote to stderr before: {message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_panic_in_init_counts_as_init() {
    // init panics once the variable is set: the first instance is made, the
    // trap in `process` discards it, and its replacement's init panics.
    let var = "PROFCOL_TEST_INIT_PANIC";
    let allow = Allow { env: vec![var.into()], ..Default::default() };
    let t = Telemetry::new();
    let p = plugin(&format!(r#"{{"mode": "trap", "init_panic_env": "{var}"}}"#), allow, &t);
    // SAFETY: no other test of this binary reads or writes this variable.
    unsafe { std::env::set_var(var, "1") };
    let r = p.process_blocking(&batch().encode_to_vec());
    assert!(matches!(&r, Err(CallError::Failed { kind: FailureKind::Trap, .. })), "{r:?}");
    // No runtime here: the replacement was made (and failed) in the call.
    assert_eq!((failures(&t, "trap"), failures(&t, "init")), (1, 1), "{}", t.render());
    let r = p.process_blocking(&batch().encode_to_vec());
    match r {
        Err(CallError::Failed { kind: FailureKind::Init, message }) => {
            assert!(message.contains("init panics on purpose"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_the_plugin_refuses_fails_the_start() {
    let yaml = format!("path: {}\nconfig: {{mode: refuse_init}}", test_plugin("misbehave").display());
    let raw = profcol_config::parse_section(&yaml).unwrap();
    ProcessorFactory.check(&raw).unwrap();
    let id: ComponentId = "wasm/test".parse().unwrap();
    let settings = CreateSettings {
        telemetry: Telemetry::new().component(Kind::Processor, &id),
        id,
        services: Default::default(),
    };
    let err = ProcessorFactory.create(settings, &raw).err().expect("init refused");
    assert!(err.to_string().contains("init refused the config: this config is refused on purpose"), "{err}");
}
