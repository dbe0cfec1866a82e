//! The exporter wrapper's retry schedule, on tokio's paused clock: the
//! attempts of a failing export happen exactly when the backoff says (and a
//! server's Retry-After wins when it is longer), with no wall-clock waiting.

use async_trait::async_trait;
use profcol::exporter_helper::settings::{ExporterHelperConfig, QueueConfig, RetryConfig};
use profcol::exporter_helper::ExporterHandle;
use profcol_api::component::{ComponentId, Kind};
use profcol_api::telemetry::ComponentTelemetry;
use profcol_api::{ExportError, Exporter, Profiles};
use profcol_testkit::batch::cpu_batch;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Fails with the given errors in turn, then succeeds; records when each
/// attempt came (virtual time since `t0`).
struct Flaky {
    t0: Instant,
    errors: Mutex<Vec<ExportError>>,
    attempts: Mutex<Vec<Duration>>,
}

#[async_trait]
impl Exporter for Flaky {
    async fn export(&self, _batch: &Profiles) -> Result<(), ExportError> {
        self.attempts.lock().unwrap().push(self.t0.elapsed());
        let mut e = self.errors.lock().unwrap();
        if e.is_empty() {
            Ok(())
        } else {
            Err(e.remove(0))
        }
    }
}

#[tokio::test(start_paused = true)]
async fn retries_follow_the_backoff_and_retry_after_on_a_paused_clock() {
    let flaky = Arc::new(Flaky {
        t0: Instant::now(),
        errors: Mutex::new(vec![
            ExportError::retryable("down"),
            ExportError::retryable("down"),
            // The server asks for 10 s, longer than the backoff's 4 s.
            ExportError::Retryable { message: "slow down".into(), retry_after: Some(Duration::from_secs(10)) },
            ExportError::retryable("down"),
        ]),
        attempts: Mutex::default(),
    });
    let config = ExporterHelperConfig {
        timeout: Duration::from_secs(30),
        retry_on_failure: RetryConfig {
            enabled: true,
            initial_interval: Duration::from_secs(1),
            max_interval: Duration::from_secs(6),
            max_elapsed_time: Duration::ZERO,
            multiplier: 2.0,
            randomization_factor: 0.0,
        },
        sending_queue: QueueConfig { num_consumers: 1, ..Default::default() },
    };
    let id: ComponentId = "flaky".parse().unwrap();
    let telemetry = ComponentTelemetry::detached(Kind::Exporter, &id);
    let handle = ExporterHandle::start(id, flaky.clone(), config, telemetry.clone()).await.unwrap();
    handle.enqueue(Arc::new(cpu_batch(1, 1, 4))).await.unwrap();
    // Virtual time runs ahead whenever every task waits on a timer.
    while flaky.attempts.lock().unwrap().len() < 5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let s = Duration::from_secs;
    // Backoff 1, 2, max(4, Retry-After 10) = 10, then 6 (capped): attempts at 0, 1, 3, 13, 19.
    let got: Vec<Duration> = flaky.attempts.lock().unwrap().clone();
    let rounded: Vec<u64> = got.iter().map(|d| (d.as_millis() as u64 + 50) / 1000).collect();
    assert_eq!(rounded, vec![0, 1, 3, 13, 19], "attempt times {got:?}");
    assert!(got.iter().zip([s(0), s(1), s(3), s(13), s(19)]).all(|(g, w)| g.abs_diff(w) < Duration::from_millis(50)));
    assert_eq!(telemetry.send_failed.get(), 0);
    handle.shutdown(std::time::Instant::now() + Duration::from_secs(5)).await;
}

/// A batch the wrapper gives up on is logged as dropped, with why, and never
/// as something that will be retried.
#[tokio::test(start_paused = true)]
async fn a_dropped_batch_is_logged_as_dropped_and_why() {
    let log = profcol_testkit::log::capture();
    let retry = RetryConfig {
        enabled: true,
        initial_interval: Duration::from_secs(1),
        max_interval: Duration::from_secs(1),
        max_elapsed_time: Duration::from_secs(3),
        multiplier: 1.0,
        randomization_factor: 0.0,
    };
    let cases = [
        ("flaky/permanent", vec![ExportError::permanent("400 bad request")], "a retry would fail the same way"),
        ("flaky/exhausted", vec![ExportError::retryable("down"); 10], "retries exhausted"),
    ];
    let batch = Arc::new(cpu_batch(2, 1, 4));
    for (name, errors, why) in cases {
        let flaky = Arc::new(Flaky { t0: Instant::now(), errors: Mutex::new(errors), attempts: Mutex::default() });
        let config = ExporterHelperConfig {
            timeout: Duration::from_secs(30),
            retry_on_failure: retry.clone(),
            sending_queue: QueueConfig { num_consumers: 1, ..Default::default() },
        };
        let id: ComponentId = name.parse().unwrap();
        let telemetry = ComponentTelemetry::detached(Kind::Exporter, &id);
        let handle = ExporterHandle::start(id, flaky.clone(), config, telemetry.clone()).await.unwrap();
        handle.enqueue(batch.clone()).await.unwrap();
        while telemetry.send_failed.get() == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(telemetry.send_failed.get(), batch.sample_count() as u64, "{name}: every observation counted");
        let text = log.text();
        let lines: Vec<&str> = text.lines().filter(|l| l.contains(&format!("exporter={name} "))).collect();
        let dropped: Vec<&&str> = lines.iter().filter(|l| l.contains("batch dropped")).collect();
        assert_eq!(dropped.len(), 1, "{name}: {lines:#?}");
        assert!(dropped[0].contains(&format!("export failed; batch dropped: {why}")), "{name}: {}", dropped[0]);
        assert!(!text.contains("will retry"), "{name}: a log line says it will retry:\n{text}");
        handle.shutdown(std::time::Instant::now() + Duration::from_secs(5)).await;
    }
}
