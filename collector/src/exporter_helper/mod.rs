//! The wrapper every exporter gets (the OTel Collector's exporterhelper):
//! a bounded sending queue drained by `num_consumers` tasks, retry with
//! exponential backoff on retryable errors, and a per-attempt timeout.
//!
//! Each exporter has its own queue, so a slow or stalled backend fills only
//! its own queue and never holds up another exporter of the same pipeline.

mod retry;

use profcol_api::exporterhelper::ExporterHelperConfig;
use profcol_api::telemetry::ComponentTelemetry;
use profcol_api::{ComponentId, Exporter, Profiles};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tracing::{debug, warn, Instrument};

/// A running exporter: its queue, the tasks draining it, and the exporter.
pub struct ExporterHandle {
    id: ComponentId,
    exporter: Arc<dyn Exporter>,
    config: ExporterHelperConfig,
    telemetry: ComponentTelemetry,
    tx: async_channel::Sender<Arc<Profiles>>,
    consumers: tokio::sync::Mutex<JoinSet<()>>,
    /// Set when the host has begun draining: stop waiting between retries
    /// once the shutdown deadline has passed.
    deadline: Arc<std::sync::Mutex<Option<Instant>>>,
}

impl ExporterHandle {
    /// Starts the exporter and the consumers of its queue.
    pub async fn start(
        id: ComponentId,
        exporter: Arc<dyn Exporter>,
        config: ExporterHelperConfig,
        telemetry: ComponentTelemetry,
    ) -> Result<Arc<Self>, profcol_api::ComponentError> {
        exporter.start().await?;
        let q = &config.sending_queue;
        let (tx, rx) = async_channel::bounded(if q.enabled { q.queue_size.max(1) } else { 1 });
        let h = Arc::new(ExporterHandle {
            id,
            exporter,
            telemetry,
            tx,
            consumers: tokio::sync::Mutex::new(JoinSet::new()),
            deadline: Arc::default(),
            config,
        });
        let n = if h.config.sending_queue.enabled { h.config.sending_queue.num_consumers.max(1) } else { 1 };
        let mut set = h.consumers.lock().await;
        for _ in 0..n {
            let (rx, me) = (rx.clone(), Arc::clone(&h));
            let span = tracing::info_span!("exporter", id = %me.id);
            set.spawn(
                async move {
                    while let Ok(batch) = rx.recv().await {
                        me.telemetry.queue_size.set(rx.len() as i64);
                        me.send_with_retry(&batch).await;
                    }
                }
                .instrument(span),
            );
        }
        drop(set);
        Ok(h)
    }

    pub fn id(&self) -> &ComponentId {
        &self.id
    }

    /// Hands a batch to the queue. With `block_on_overflow` (or the queue
    /// disabled) this waits for room; otherwise a full queue drops the batch
    /// and counts it.
    pub async fn enqueue(&self, batch: Arc<Profiles>) {
        let q = &self.config.sending_queue;
        let n = batch.sample_count() as u64;
        if !q.enabled || q.block_on_overflow {
            if self.tx.send(batch).await.is_err() {
                self.telemetry.dropped.add(n);
            }
        } else if let Err(e) = self.tx.try_send(batch) {
            self.telemetry.dropped.add(n);
            if e.is_full() {
                warn!(exporter = %self.id, samples = n, queue_size = q.queue_size,
                    "sending queue is full; batch dropped (raise sending_queue.queue_size or set block_on_overflow: true)");
            }
        }
        self.telemetry.queue_size.set(self.tx.len() as i64);
    }

    async fn send_with_retry(&self, batch: &Profiles) {
        let n = batch.sample_count() as u64;
        let mut backoff = retry::Backoff::new(&self.config.retry_on_failure);
        loop {
            let t0 = Instant::now();
            let result = match tokio::time::timeout(self.config.timeout, self.exporter.export(batch)).await {
                Ok(r) => r,
                Err(_) => Err(profcol_api::ExportError::retryable(format!(
                    "export did not finish within timeout {:?}",
                    self.config.timeout
                ))),
            };
            let err = match result {
                Ok(()) => {
                    self.telemetry.export_latency.record(t0.elapsed());
                    return;
                }
                Err(e) => e,
            };
            let wait = match &err {
                profcol_api::ExportError::Retryable { retry_after, .. } => backoff.next(*retry_after),
                profcol_api::ExportError::Permanent { .. } => None,
            };
            let past_deadline = |w: Duration| {
                self.deadline.lock().unwrap_or_else(|p| p.into_inner()).is_some_and(|d| Instant::now() + w > d)
            };
            match wait {
                Some(w) if !past_deadline(w) => {
                    debug!(exporter = %self.id, error = %err, wait = ?w, "export failed; retrying");
                    tokio::time::sleep(w).await;
                }
                _ => {
                    self.telemetry.send_failed.add(n);
                    warn!(exporter = %self.id, samples = n, error = %err, "export failed; batch dropped");
                    return;
                }
            }
        }
    }

    /// Drains the queue (waiting at most until `deadline`), then shuts the exporter down.
    pub async fn shutdown(&self, deadline: Instant) {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) = Some(deadline);
        self.tx.close();
        let mut set = self.consumers.lock().await;
        let drained =
            tokio::time::timeout_at(deadline.into(), async { while set.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            set.abort_all();
            warn!(exporter = %self.id, left = self.tx.len(), "shutdown_timeout passed before the sending queue drained");
        }
        if let Err(e) = self.exporter.shutdown().await {
            warn!(exporter = %self.id, error = %e, "exporter shutdown failed");
        }
    }
}
