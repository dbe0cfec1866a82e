//! The wrapper every exporter gets (the OTel Collector's exporterhelper):
//! a bounded sending queue drained by `num_consumers` tasks, retry with
//! exponential backoff on retryable errors, and a per-attempt timeout.
//!
//! Each exporter has its own queue, so a slow or stalled backend fills only
//! its own queue and never holds up another exporter of the same pipeline.
//!
//! With `sending_queue.storage` the queue is also on disk (see
//! [`persistent`]): a batch is written before `enqueue` returns, its file is
//! removed once the batch was exported or dropped for good, and what is left
//! at start-up (a crash, or a shutdown during an outage) is queued first; a
//! handle that stops hands its backlog to the next user of the same queue.

mod persistent;
mod queue;
mod retry;
pub mod settings;

use persistent::{PersistError, PersistentQueue, Ticket};
use queue::{Rejected, SizedQueue};

use crate::exporter_helper::settings::{ExporterHelperConfig, Sizer};
use crate::service::batch_trace::{samples_attr, BatchTrace};
use opentelemetry::KeyValue;
use profcol_api::telemetry::{ComponentTelemetry, MetricDef};
use profcol_api::{ComponentId, Exporter, Profiles};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

/// One queued batch: in memory, or (persistent queue) its file, with the
/// batch kept in memory too only while the channel is short. Past that the
/// batch is read back when a consumer takes it, so a long outage costs disk,
/// not memory, while a healthy backend pays no read-back.
enum Queued {
    Memory(Arc<Profiles>),
    Disk(Ticket, Option<Arc<Profiles>>),
}

impl Queued {
    fn ticket(self) -> Option<Ticket> {
        match self {
            Queued::Disk(t, _) => Some(t),
            Queued::Memory(_) => None,
        }
    }
}

/// A queue entry: the batch, its samples (counted once, when it was queued;
/// unknown for a batch found on disk at start until it is read back), and
/// (batch tracing on) its trace and when it was queued.
struct Entry {
    item: Queued,
    samples: Option<u64>,
    trace: Option<(BatchTrace, SystemTime)>,
}

/// What became of a batch the consumers took from the queue.
enum Outcome {
    /// Exported, or dropped for good (permanent error, retries exhausted).
    Done,
    /// Shutdown stopped the retries: a persistent queue keeps the batch for
    /// the next user of the queue.
    Interrupted,
}

pub(crate) const QUEUE_STORAGE_BYTES: MetricDef =
    MetricDef::gauge("queue_storage_bytes", "bytes", "Bytes of batches in the persistent sending queue.");
pub(crate) const QUEUE_STORAGE_BATCHES: MetricDef =
    MetricDef::gauge("queue_storage_batches", "1", "Batches in the persistent sending queue (on disk).");
pub(crate) const QUEUE_STORAGE_SAMPLES: MetricDef =
    MetricDef::gauge("queue_storage_samples", "samples", "Samples in the batches of the persistent sending queue.");
pub(crate) const SENT_BATCHES: MetricDef =
    MetricDef::counter("sent_batches_total", "1", "Batches the backend took (in part, for a partial success).");
pub(crate) const DROPPED_BATCHES: MetricDef = MetricDef::counter(
    "dropped_batches_total",
    "1",
    "Batches lost: dropped (queue full, shutdown) or failed for good (their samples are in \
     dropped_samples_total and send_failed_samples_total).",
);

/// The series the helper adds to every exporter (the storage gauges only
/// with `sending_queue.storage`).
pub const METRICS: &[MetricDef] =
    &[SENT_BATCHES, DROPPED_BATCHES, QUEUE_STORAGE_BYTES, QUEUE_STORAGE_BATCHES, QUEUE_STORAGE_SAMPLES];

/// A persistent queue and its gauges.
struct Store {
    queue: Arc<PersistentQueue>,
    bytes: profcol_api::telemetry::Gauge,
    batches: profcol_api::telemetry::Gauge,
    samples: profcol_api::telemetry::Gauge,
}

impl Store {
    /// Sets the gauges to what is on disk now.
    fn measure(&self) {
        let (batches, samples) = self.queue.on_disk();
        self.bytes.set(i64::try_from(self.queue.used_bytes()).unwrap_or(i64::MAX));
        self.batches.set(i64::try_from(batches).unwrap_or(i64::MAX));
        self.samples.set(i64::try_from(samples).unwrap_or(i64::MAX));
    }
}

/// What an exporter did with the batches it was handed, since it started:
/// the shutdown summary, and what its counters on /metrics say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Accounting {
    pub delivered_batches: u64,
    pub delivered_samples: u64,
    /// In the persistent queue, for the next start.
    pub kept_batches: u64,
    pub kept_samples: u64,
    /// Lost: dropped (queue full, shutdown) or failed for good.
    pub dropped_batches: u64,
    pub dropped_samples: u64,
}

impl std::ops::AddAssign for Accounting {
    fn add_assign(&mut self, o: Self) {
        self.delivered_batches += o.delivered_batches;
        self.delivered_samples += o.delivered_samples;
        self.kept_batches += o.kept_batches;
        self.kept_samples += o.kept_samples;
        self.dropped_batches += o.dropped_batches;
        self.dropped_samples += o.dropped_samples;
    }
}

impl std::fmt::Display for Accounting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "delivered {} batches ({} samples), kept on disk {} batches ({} samples), dropped {} batches ({} samples)",
            self.delivered_batches,
            self.delivered_samples,
            self.kept_batches,
            self.kept_samples,
            self.dropped_batches,
            self.dropped_samples
        )
    }
}

/// A running exporter: its queue, the tasks draining it, and the exporter.
pub struct ExporterHandle {
    id: ComponentId,
    exporter: Arc<dyn Exporter>,
    config: ExporterHelperConfig,
    telemetry: ComponentTelemetry,
    /// Bounded in the unit of `sending_queue.sizer`; a batch counts until its export ends.
    queue: SizedQueue<Entry>,
    store: Option<Store>,
    consumers: tokio::sync::Mutex<JoinSet<()>>,
    /// Set when the host has begun draining: stop waiting between retries
    /// once the shutdown deadline has passed.
    deadline: Arc<std::sync::Mutex<Option<Instant>>>,
    /// Cancelled when the host begins draining.
    stopping: CancellationToken,
    /// Batches the backend took (in part, for a partial success).
    sent_batches: profcol_api::telemetry::Counter,
    /// Batches lost: dropped (queue full, shutdown) or failed for good.
    dropped_batches: profcol_api::telemetry::Counter,
    /// In-memory batches being exported now: lost if shutdown aborts them.
    exporting: std::sync::Mutex<(u64, u64)>,
}

impl ExporterHandle {
    /// Starts the exporter and the consumers of its queue.
    pub async fn start(
        id: ComponentId,
        exporter: Arc<dyn Exporter>,
        config: ExporterHelperConfig,
        telemetry: ComponentTelemetry,
    ) -> Result<Arc<Self>, profcol_api::ComponentError> {
        let q = &config.sending_queue;
        let store = match q.storage.clone() {
            Some(dir) => {
                let (name, max) = (id.to_string(), q.max_storage_bytes);
                let opened =
                    tokio::task::spawn_blocking(move || PersistentQueue::open(&dir, &name, max).map_err(|e| (dir, e)))
                        .await
                        .map_err(|e| {
                            profcol_api::ComponentError::Message(format!("opening the persistent queue: {e}"))
                        })?;
                let queue = opened.map_err(|(dir, source)| profcol_api::ComponentError::Io {
                    context: format!("cannot open the persistent queue under sending_queue.storage {}", dir.display()),
                    source,
                })?;
                let store = Store {
                    queue,
                    bytes: telemetry.gauge_of(&QUEUE_STORAGE_BYTES),
                    batches: telemetry.gauge_of(&QUEUE_STORAGE_BATCHES),
                    samples: telemetry.gauge_of(&QUEUE_STORAGE_SAMPLES),
                };
                store.measure();
                Some(store)
            }
            None => None,
        };
        let consumers = if q.enabled { q.num_consumers.max(1) } else { 1 };
        exporter.set_concurrency(consumers);
        exporter.start().await?;
        let capacity = if q.enabled { q.queue_size.max(1) } else { 1 };
        telemetry.queue_capacity.set(i64::try_from(capacity).unwrap_or(i64::MAX));
        telemetry.queue_size.set(0);
        let sent_batches = telemetry.counter_of(&SENT_BATCHES);
        let dropped_batches = telemetry.counter_of(&DROPPED_BATCHES);
        let h = Arc::new(ExporterHandle {
            id,
            exporter,
            telemetry,
            queue: SizedQueue::new(capacity),
            store,
            consumers: tokio::sync::Mutex::new(JoinSet::new()),
            deadline: Arc::default(),
            stopping: CancellationToken::new(),
            sent_batches,
            dropped_batches,
            exporting: std::sync::Mutex::new((0, 0)),
            config,
        });
        let mut set = h.consumers.lock().await;
        for _ in 0..consumers {
            let me = Arc::clone(&h);
            let span = tracing::info_span!("exporter", id = %me.id);
            set.spawn(
                async move {
                    while let Some((entry, weight)) = me.queue.pop().await {
                        if let (Some(store), true) = (&me.store, me.shutting_down()) {
                            // On disk: goes out through whoever uses the queue next.
                            store.queue.hand_back(entry.item.ticket());
                            me.release(weight);
                            break;
                        }
                        me.export_one(entry).await;
                        me.release(weight);
                    }
                }
                .instrument(span),
            );
        }
        if h.store.is_some() {
            let me = Arc::clone(&h);
            set.spawn(
                async move { me.requeue_unclaimed().await }.instrument(tracing::info_span!("exporter", id = %h.id)),
            );
        }
        drop(set);
        Ok(h)
    }

    /// Whether the exporter takes batches with packed samples (see
    /// `Exporter::reads_packed`).
    pub fn reads_packed(&self) -> bool {
        self.exporter.reads_packed()
    }

    pub fn id(&self) -> &ComponentId {
        &self.id
    }

    /// Sends one queued batch (with retries) and settles its file, if any.
    async fn export_one(&self, Entry { item, samples, trace }: Entry) {
        if let Some((t, queued)) = &trace {
            t.child(format!("queue_wait/{}", self.id), *queued, SystemTime::now(), vec![]);
        }
        let (batch, ticket) = match item {
            Queued::Memory(b) => (b, None),
            Queued::Disk(t, Some(b)) => (b, Some(t)),
            Queued::Disk(t, None) => match self.load(&t).await {
                Some(b) => (Arc::new(b), Some(t)),
                None => return, // set aside as corrupt, with a warning
            },
        };
        let in_memory = ticket.is_none();
        let n = samples.unwrap_or_else(|| batch.sample_count() as u64);
        if in_memory {
            let mut e = self.exporting.lock().unwrap_or_else(|p| p.into_inner());
            *e = (e.0 + 1, e.1 + n);
        }
        let outcome = self.send_with_retry(&batch, n, trace.as_ref().map(|(t, _)| t)).await;
        if in_memory {
            let mut e = self.exporting.lock().unwrap_or_else(|p| p.into_inner());
            *e = (e.0.saturating_sub(1), e.1.saturating_sub(n));
        }
        drop(batch);
        match (outcome, ticket, &self.store) {
            (Outcome::Done, Some(ticket), _) => self.forget(ticket).await,
            (Outcome::Interrupted, Some(ticket), Some(store)) => store.queue.hand_back([ticket]),
            _ => {}
        }
    }

    /// The export of a queued batch ended: its weight leaves the queue.
    fn release(&self, weight: u64) {
        self.queue.release(weight);
        self.telemetry.queue_size.set(i64::try_from(self.queue.used()).unwrap_or(i64::MAX));
    }

    /// What a batch of `samples` weighs in the queue, in the unit of `sending_queue.sizer`.
    fn weight(&self, batch: &Profiles, samples: u64) -> u64 {
        let q = &self.config.sending_queue;
        match q.sizer {
            _ if !q.enabled => 1,
            Sizer::Requests => 1,
            Sizer::Items => samples,
            Sizer::Bytes => batch.memory_size() as u64,
        }
    }

    /// Whether batches are on disk once `enqueue` returns.
    pub fn is_persistent(&self) -> bool {
        self.store.is_some()
    }

    /// Hands a batch to the queue. With `block_on_overflow` (or the queue
    /// disabled) this waits for room; otherwise a full in-memory queue drops
    /// the batch and counts it. With a persistent queue the batch is on disk
    /// before this returns `Ok`; when it cannot be kept (disk queue full,
    /// write error) it is refused with the reason, never silently lost.
    pub async fn enqueue(&self, batch: Arc<Profiles>) -> Result<(), String> {
        let n = batch.sample_count() as u64;
        self.enqueue_traced(batch, n, None).await
    }

    /// [`Self::enqueue`] for a batch whose samples (`n`, its
    /// [`Profiles::sample_count`]) the pipeline has counted already: a
    /// count walks every sample, and the queue, the export and its retries
    /// all need it. With a trace, its queue wait and export attempts become
    /// spans of `trace`.
    pub async fn enqueue_traced(&self, batch: Arc<Profiles>, n: u64, trace: Option<BatchTrace>) -> Result<(), String> {
        // Unpacked once here, not at every retry, for an exporter that reads
        // `.0` (a pipeline unpacks a batch its exporters share before this).
        let batch = match batch.is_packed() && !self.exporter.reads_packed() {
            true => Arc::new(Arc::unwrap_or_clone(batch).into_unpacked()),
            false => batch,
        };
        let q = &self.config.sending_queue;
        let blocking = !q.enabled || q.block_on_overflow;
        let item = match &self.store {
            Some(store) => {
                let ticket = self.persist(store, &batch, blocking).await.inspect_err(|_| {
                    self.telemetry.refused.add(n);
                })?;
                // Kept in memory only if a consumer is about to take it; else only the file waits.
                let window = if q.enabled { q.num_consumers.max(1) } else { 1 };
                Queued::Disk(ticket, (self.queue.len() < window).then_some(batch))
            }
            None => Queued::Memory(batch),
        };
        let weight = match &item {
            Queued::Memory(b) => self.weight(b, n),
            // A persistent queue counts requests (the config check allows no other sizer).
            Queued::Disk(..) => 1,
        };
        let entry = Entry { item, samples: Some(n), trace: trace.map(|t| (t, SystemTime::now())) };
        let pushed = if blocking { self.queue.push(entry, weight).await } else { self.queue.try_push(entry, weight) };
        self.telemetry.queue_size.set(i64::try_from(self.queue.used()).unwrap_or(i64::MAX));
        let (item, full) = match pushed {
            Ok(()) => return Ok(()),
            Err(Rejected::TooLarge(Entry { item: Queued::Memory(_), .. })) => {
                self.telemetry.dropped.add(n);
                self.dropped_batches.inc();
                let why = format!(
                    "exporter {}: a batch of {weight} {} is larger than the whole sending queue \
                     (queue_size {}); raise sending_queue.queue_size or make batches smaller",
                    self.id,
                    q.sizer.as_str(),
                    q.queue_size
                );
                warn!(exporter = %self.id, samples = n, "{why}; batch dropped");
                // Waiting would never make room: a blocking pipeline tells its sender.
                return if blocking { Err(why) } else { Ok(()) };
            }
            Err(Rejected::Full(e)) => (e.item, true),
            Err(Rejected::TooLarge(e)) | Err(Rejected::Closed(e)) => (e.item, false),
        };
        match item {
            // Closed for shutdown: the batch is on disk and goes out through
            // whoever uses the queue next (a reload's new handle, or the next start).
            Queued::Disk(ticket, _) if !full => {
                if let Some(store) = &self.store {
                    store.queue.hand_back([ticket]);
                }
                Ok(())
            }
            Queued::Disk(ticket, _) => {
                self.forget(ticket).await;
                self.telemetry.refused.add(n);
                Err(format!(
                    "exporter {}: the sending queue is full ({} {}); retry later, or raise sending_queue.queue_size",
                    self.id,
                    q.queue_size,
                    q.sizer.as_str()
                ))
            }
            Queued::Memory(_) => {
                self.telemetry.dropped.add(n);
                self.dropped_batches.inc();
                if full {
                    warn!(exporter = %self.id, samples = n, queue_size = q.queue_size, sizer = q.sizer.as_str(),
                        "sending queue is full; batch dropped (raise sending_queue.queue_size or set block_on_overflow: true)");
                }
                Ok(())
            }
        }
    }

    /// Writes a batch to the persistent queue; when the queue is full, waits
    /// for room if `blocking`, else refuses.
    async fn persist(&self, store: &Store, batch: &Arc<Profiles>, blocking: bool) -> Result<Ticket, String> {
        loop {
            // Registered before the attempt, so a removal in between is not missed.
            let room = store.queue.room.notified();
            match store.queue.persist(Arc::clone(batch)).await {
                Ok(ticket) => {
                    store.measure();
                    return Ok(ticket);
                }
                Err(PersistError::Full { .. }) if blocking && !self.queue.is_closed() => {
                    // Bounded wait, so a shutdown that closes the queue is noticed.
                    let _ = tokio::time::timeout(Duration::from_millis(500), room).await;
                }
                Err(e) => {
                    warn!(exporter = %self.id, samples = batch.sample_count(), error = %e, "persistent queue refused a batch");
                    // The sender hears the reason, not this host's paths.
                    return Err(format!("exporter {}: {}; the sender should retry later", self.id, e.for_sender()));
                }
            }
        }
    }

    /// Reads a queued batch back from disk; `None` when its file does not
    /// read back (set aside as `*.corrupt`, with a warning).
    async fn load(&self, ticket: &Ticket) -> Option<Profiles> {
        let store = self.store.as_ref()?;
        let (q, name, t) = (Arc::clone(&store.queue), self.id.to_string(), ticket.clone());
        let packed = self.exporter.reads_packed();
        let batch = tokio::task::spawn_blocking(move || q.load(&name, &t, packed)).await.ok().flatten();
        if batch.is_none() {
            store.measure();
        }
        batch
    }

    /// Removes an exported (or abandoned) batch from the persistent queue.
    async fn forget(&self, ticket: Ticket) {
        let Some(store) = &self.store else { return };
        let queue = Arc::clone(&store.queue);
        let _ = tokio::task::spawn_blocking(move || queue.remove(&ticket)).await;
        store.measure();
    }

    /// Queues the persistent queue's unclaimed batches (left from the last
    /// run, or handed back by the handle a reload replaced), oldest first,
    /// waiting for room like new batches; then waits for more until shutdown.
    async fn requeue_unclaimed(&self) {
        let Some(store) = &self.store else { return };
        let queue = &store.queue;
        loop {
            let handed_back = queue.handed_back.notified();
            tokio::pin!(handed_back);
            handed_back.as_mut().enable();
            let tickets = queue.take_unclaimed();
            let n = tickets.len();
            let mut rest = tickets.into_iter();
            while let Some(ticket) = rest.next() {
                let item = Entry { item: Queued::Disk(ticket.clone(), None), samples: None, trace: None };
                // A push dropped unfinished leaves nothing in the queue.
                let sent = tokio::select! {
                    r = self.queue.push(item, 1) => r.is_ok(),
                    _ = self.stopping.cancelled() => false,
                };
                if !sent {
                    queue.hand_back(std::iter::once(ticket).chain(rest));
                    return;
                }
            }
            if n > 0 {
                info!(exporter = %self.id, batches = n, "persistent queue: batches from disk are queued again");
            }
            tokio::select! {
                _ = handed_back => {}
                _ = self.stopping.cancelled() => return,
            }
        }
    }

    async fn send_with_retry(&self, batch: &Profiles, n: u64, trace: Option<&BatchTrace>) -> Outcome {
        let mut backoff = retry::Backoff::new(&self.config.retry_on_failure);
        let mut attempt = 0i64;
        loop {
            let t0 = Instant::now();
            let started = trace.map(|_| SystemTime::now());
            attempt += 1;
            let result = match tokio::time::timeout(self.config.timeout, self.exporter.export(batch)).await {
                Ok(r) => r,
                Err(_) => Err(profcol_api::ExportError::retryable(format!(
                    "export did not finish within timeout {:?}",
                    self.config.timeout
                ))),
            };
            if let (Some(t), Some(started)) = (trace, started) {
                let outcome = match &result {
                    Ok(()) => "ok",
                    Err(profcol_api::ExportError::Retryable { .. }) => "retryable",
                    Err(profcol_api::ExportError::Permanent { .. }) => "permanent",
                    Err(profcol_api::ExportError::Partial { .. }) => "partial",
                };
                let mut attrs = vec![
                    KeyValue::new("profcol.outcome", outcome),
                    KeyValue::new("profcol.attempt", attempt),
                    samples_attr(n),
                ];
                if let Err(e) = &result {
                    attrs.push(KeyValue::new("error.message", e.to_string()));
                }
                t.child(format!("export/{}", self.id), started, SystemTime::now(), attrs);
            }
            let err = match result {
                Ok(()) => {
                    self.telemetry.export_latency.record(t0.elapsed());
                    self.telemetry.sent.add(n);
                    self.sent_batches.inc();
                    return Outcome::Done;
                }
                Err(e) => e,
            };
            let wait = match &err {
                profcol_api::ExportError::Retryable { retry_after, .. } => backoff.next(*retry_after),
                profcol_api::ExportError::Permanent { .. } => None,
                profcol_api::ExportError::Partial { .. } => {
                    // The rest arrived: never sent again (OTLP: partial_success is not retried).
                    let rejected = err.rejected_samples(n);
                    self.telemetry.sent.add(n - rejected);
                    self.telemetry.send_failed.add(rejected);
                    self.sent_batches.inc();
                    warn!(exporter = %self.id, samples = n, rejected, error = %err, "the backend rejected part of a batch");
                    return Outcome::Done;
                }
            };
            let deadline = *self.deadline.lock().unwrap_or_else(|p| p.into_inner());
            // Shutting down, a persistent queue keeps the batch rather than waiting to retry.
            let keep = self.store.is_some() && deadline.is_some();
            let past_deadline = |w: Duration| deadline.is_some_and(|d| Instant::now() + w > d);
            match wait {
                Some(w) if !keep && !past_deadline(w) => {
                    debug!(exporter = %self.id, samples = n, error = %err, wait = ?w, "export failed; retrying after the wait");
                    tokio::select! {
                        _ = tokio::time::sleep(w) => {}
                        _ = self.stopping.cancelled(), if self.store.is_some() => return self.keep_for_next_start(n, &err),
                    }
                }
                Some(_) if self.store.is_some() => return self.keep_for_next_start(n, &err),
                _ => {
                    self.exporter.gave_up(batch);
                    self.telemetry.send_failed.add(err.rejected_samples(n));
                    self.dropped_batches.inc();
                    let why = match (&err, wait) {
                        (profcol_api::ExportError::Permanent { .. }, _) => "a retry would fail the same way",
                        (_, None) if !self.config.retry_on_failure.enabled => "retry_on_failure is off",
                        (_, None) => "retries exhausted (retry_on_failure.max_elapsed_time)",
                        (_, Some(_)) => "shutting down: the next retry would come after shutdown_timeout",
                    };
                    if deadline.is_some() {
                        // Shutting down: the summary counts these, one line for all.
                        debug!(exporter = %self.id, samples = n, error = %err, "export failed; batch dropped: {why}");
                    } else {
                        warn!(exporter = %self.id, samples = n, error = %err, "export failed; batch dropped: {why}");
                    }
                    return Outcome::Done;
                }
            }
        }
    }

    fn shutting_down(&self) -> bool {
        self.stopping.is_cancelled()
    }

    fn keep_for_next_start(&self, samples: u64, err: &profcol_api::ExportError) -> Outcome {
        info!(exporter = %self.id, samples, error = %err,
            "shutting down during a retry; the batch stays in the persistent queue for the next start");
        Outcome::Interrupted
    }

    /// What this exporter did since it started (after [`ExporterHandle::shutdown`]:
    /// all it will do): the same numbers its counters and gauges show.
    pub fn accounting(&self) -> Accounting {
        let (kept_batches, kept_samples) = self.store.as_ref().map_or((0, 0), |s| s.queue.on_disk());
        Accounting {
            delivered_batches: self.sent_batches.get(),
            delivered_samples: self.telemetry.sent.get(),
            kept_batches,
            kept_samples,
            dropped_batches: self.dropped_batches.get(),
            dropped_samples: self.telemetry.dropped.get() + self.telemetry.send_failed.get(),
        }
    }

    /// Drains the queue (waiting at most until `deadline`), then shuts the
    /// exporter down. A persistent queue is not drained: what is queued stays
    /// on disk, and batches waiting for a retry stop waiting.
    pub async fn shutdown(&self, deadline: Instant) {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) = Some(deadline);
        self.stopping.cancel();
        self.queue.close();
        let mut set = self.consumers.lock().await;
        let drained =
            tokio::time::timeout_at(deadline.into(), async { while set.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            set.abort_all();
            while set.join_next().await.is_some() {}
            warn!(exporter = %self.id, left = self.queue.len(), "shutdown_timeout passed before the sending queue drained");
        }
        // What the aborted consumers were sending from memory is lost.
        let (lost_batches, lost_samples) =
            std::mem::take(&mut *self.exporting.lock().unwrap_or_else(|p| p.into_inner()));
        self.dropped_batches.add(lost_batches);
        self.telemetry.dropped.add(lost_samples);
        // Still on disk: for the handle a reload starts, or the next start.
        // Still in memory: lost.
        let mut left = Vec::new();
        while let Some((entry, _)) = self.queue.try_pop() {
            match entry.item {
                Queued::Disk(ticket, _) => left.push(ticket),
                Queued::Memory(b) => {
                    self.dropped_batches.inc();
                    self.telemetry.dropped.add(entry.samples.unwrap_or_else(|| b.sample_count() as u64));
                }
            }
        }
        if let Some(store) = &self.store {
            store.queue.hand_back(left);
            store.measure();
        }
        if let Err(e) = self.exporter.shutdown().await {
            warn!(exporter = %self.id, error = %e, "exporter shutdown failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exporter_helper::settings::Sizer;
    use profcol_api::component::Kind;
    use profcol_api::model::{pb, ProfileMeta, Resource};
    use profcol_api::{ExportError, ProfilesBuilder};

    /// A backend that never answers.
    struct Stalled;

    #[async_trait::async_trait]
    impl Exporter for Stalled {
        async fn export(&self, _: &Profiles) -> Result<(), ExportError> {
            std::future::pending().await
        }
    }

    /// Records whether each batch came packed and the samples its profiles held.
    struct Looks {
        reads_packed: bool,
        seen: std::sync::Mutex<Vec<(bool, usize)>>,
    }

    #[async_trait::async_trait]
    impl Exporter for Looks {
        fn reads_packed(&self) -> bool {
            self.reads_packed
        }

        async fn export(&self, b: &Profiles) -> Result<(), ExportError> {
            let in_profiles = b.profiles().map(|p| p.samples.len()).sum();
            self.seen.lock().unwrap().push((b.is_packed(), in_profiles));
            Ok(())
        }
    }

    #[tokio::test]
    async fn an_exporter_gets_packed_batches_only_if_it_reads_them() {
        let packed = Profiles::decode_packed(&batch(30).encode_to_vec()).unwrap();
        assert!(packed.is_packed());
        for reads_packed in [false, true] {
            let id: ComponentId = "looks".parse().unwrap();
            let t = ComponentTelemetry::detached(Kind::Exporter, &id);
            let looks = Arc::new(Looks { reads_packed, seen: Default::default() });
            let h = ExporterHandle::start(id, looks.clone(), ExporterHelperConfig::default(), t).await.unwrap();
            h.enqueue(Arc::new(packed.clone())).await.unwrap();
            h.shutdown(Instant::now() + Duration::from_secs(10)).await;
            let want = if reads_packed { (true, 0) } else { (false, 30) };
            assert_eq!(*looks.seen.lock().unwrap(), [want], "reads_packed: {reads_packed}");
        }
    }

    fn batch(samples: usize) -> Arc<Profiles> {
        let mut b = ProfilesBuilder::new();
        let r = b.resource(Resource::default());
        let meta = ProfileMeta::cpu(1, 1, 1);
        let p = b.profile(r, &meta);
        for i in 0..samples {
            b.sample(p, pb::Sample { values: vec![1], timestamps_unix_nano: vec![i as u64], ..Default::default() });
        }
        Arc::new(b.build())
    }

    async fn stalled_handle(sizer: Sizer, queue_size: u64) -> (Arc<ExporterHandle>, ComponentTelemetry) {
        let id: ComponentId = "stalled".parse().unwrap();
        let t = ComponentTelemetry::detached(Kind::Exporter, &id);
        let mut cfg = ExporterHelperConfig { timeout: Duration::from_secs(3600), ..Default::default() };
        cfg.sending_queue.sizer = sizer;
        cfg.sending_queue.queue_size = queue_size;
        cfg.sending_queue.num_consumers = 1;
        (ExporterHandle::start(id, Arc::new(Stalled), cfg, t.clone()).await.unwrap(), t)
    }

    #[tokio::test]
    async fn the_queue_holds_at_most_queue_size_in_the_sizers_unit_in_flight_included() {
        let (h, t) = stalled_handle(Sizer::Items, 250).await;
        assert_eq!(t.queue_capacity.get(), 250);
        for _ in 0..3 {
            h.enqueue(batch(100)).await.unwrap();
        }
        // One batch in the stalled consumer, one waiting: 200 items; the third did not fit.
        assert_eq!((t.queue_size.get(), t.dropped.get()), (200, 100));
        // Larger than the whole queue: dropped, and with blocking, refused.
        h.enqueue(batch(300)).await.unwrap();
        assert_eq!(t.dropped.get(), 400);
        h.shutdown(Instant::now()).await;

        let (h, t) = stalled_handle(Sizer::Bytes, 0).await;
        assert_eq!(t.queue_capacity.get(), 1, "at least 1");
        h.enqueue(batch(1)).await.unwrap();
        assert_eq!((t.queue_size.get(), t.dropped.get()), (0, 1), "no batch fits in one byte");
        h.shutdown(Instant::now()).await;

        // Copies (vectors at their length) weigh less than the builder's output.
        let one = batch(100);
        let size = Profiles::clone(&one).memory_size() as u64;
        assert!(size < one.memory_size() as u64);
        let (h, t) = stalled_handle(Sizer::Bytes, 2 * size + size / 2).await;
        for _ in 0..4 {
            h.enqueue(Arc::new(Profiles::clone(&one))).await.unwrap();
        }
        assert_eq!((t.queue_size.get() as u64, t.dropped.get()), (2 * size, 200));
        h.shutdown(Instant::now()).await;
    }
}
