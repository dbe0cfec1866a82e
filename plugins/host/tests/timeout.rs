//! An infinite loop in a plugin ends at `call_timeout` (+ 50 ms at most),
//! and the tokio runtime that called it keeps running meanwhile. Alone in
//! its test binary: it measures time.

mod common;
use common::*;
use profcol_api::telemetry::Telemetry;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn an_infinite_loop_ends_within_the_timeout_and_the_runtime_keeps_running() {
    // One worker thread: a plugin call on it would stall the ticker below.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let t = Telemetry::new();
        let p = processor("path: PLUGIN\nconfig: {mode: loop}\ncall_timeout: 100ms", &t);
        let ticks = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let ticker = {
            let ticks = Arc::clone(&ticks);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        };
        for _ in 0..3 {
            let input = batch();
            let start = Instant::now();
            let outcome = p.process(input.clone()).await.unwrap();
            let took = start.elapsed();
            assert!(took < Duration::from_millis(150), "the loop ran {took:?} (timeout 100ms + 50ms)");
            assert!(took >= Duration::from_millis(100), "ended before the timeout: {took:?}");
            assert_passed(outcome, &input);
        }
        ticker.abort();
        let n = ticks.load(std::sync::atomic::Ordering::Relaxed);
        assert!(n >= 30, "the runtime's own tasks ran on while the plugin looped ({n} ticks of 5ms in 300ms)");
        assert_eq!(failures(&t, "timeout"), 3);
    });
}
