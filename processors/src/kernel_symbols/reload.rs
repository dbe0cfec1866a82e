//! The one background task that changes the store, off the lookup path.
//!
//! Module uevents are debounced (a fixed window from the first one, so a
//! storm cannot postpone work forever); then module metadata is refreshed
//! at once, and kallsyms is re-read at most once per `min_interval`, with
//! exponential backoff up to `max_backoff` after a failure. BPF records are
//! applied as they come (one publish per merged batch), with no kallsyms read.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};

use super::store::{BpfEvent, Store};

/// What the listeners report.
#[derive(Debug, Clone)]
pub enum Trigger {
    /// A module was loaded or removed (uevent arrival time).
    ModuleUevent { at_ns: u64 },
    /// BPF symbol records merged across CPUs, in time order (with the
    /// unix-ns time of each); every record stamped at or before
    /// `complete_to` (unix ns) has now been sent.
    Bpf { events: Vec<(u64, BpfEvent)>, complete_to: u64 },
    /// The kernel dropped records: rescan BPF programs.
    Lost,
}

/// `reload:` section of the processor config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ReloadConfig {
    /// Wait this long after a module event before re-reading, to take bursts at once.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub debounce: Duration,
    /// Least time between two full kallsyms reads (above 0).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub min_interval: Duration,
    /// Longest wait after failed reads (at least min_interval).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub max_backoff: Duration,
}

impl Default for ReloadConfig {
    fn default() -> Self {
        ReloadConfig {
            debounce: Duration::from_millis(100),
            min_interval: Duration::from_secs(10),
            max_backoff: Duration::from_secs(300),
        }
    }
}

/// Runs the reload loop until every sender of `rx` is gone.
pub fn spawn(store: Arc<Store>, cfg: ReloadConfig, rx: UnboundedReceiver<Trigger>) -> JoinHandle<()> {
    tokio::spawn(run(store, cfg, rx))
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

async fn run(store: Arc<Store>, cfg: ReloadConfig, mut rx: UnboundedReceiver<Trigger>) {
    // Pending module change: earliest uevent time and when to act on it.
    let mut pending: Option<(u64, Instant)> = None;
    let mut kallsyms_due = false;
    // The store was just opened with a full read.
    let mut next_read = Instant::now() + cfg.min_interval;
    let mut backoff = Duration::ZERO;
    // A trigger taken from the channel while gathering BPF records.
    let mut held: Option<Trigger> = None;
    loop {
        let meta_at = pending.map(|p| p.1);
        let read_at = kallsyms_due.then_some(next_read);
        let next = async {
            match held.take() {
                Some(t) => Some(t),
                None => rx.recv().await,
            }
        };
        tokio::select! {
            biased;
            msg = next => {
                let Some(msg) = msg else { return };
                match msg {
                    Trigger::ModuleUevent { at_ns } => {
                        let p = pending.get_or_insert((at_ns, Instant::now() + cfg.debounce));
                        p.0 = p.0.min(at_ns);
                    }
                    Trigger::Bpf { mut events, mut complete_to } => {
                        // Whatever queued meanwhile goes into the same
                        // publish (batches come in time order), so a busy
                        // host costs one history rebuild per wake-up, not
                        // one per record.
                        while let Ok(t) = rx.try_recv() {
                            match t {
                                Trigger::Bpf { events: more, complete_to: to } => {
                                    events.extend(more);
                                    complete_to = complete_to.max(to);
                                }
                                other => {
                                    held = Some(other);
                                    break;
                                }
                            }
                        }
                        if !events.is_empty() {
                            let s = store.clone();
                            blocking(move || s.apply_bpf(events)).await;
                        }
                        store.bpf_progress.published_to(complete_to);
                    }
                    Trigger::Lost => {
                        let s = store.clone();
                        if blocking(move || s.rescan_bpf()).await != Some(true) {
                            kallsyms_due = true;
                        }
                    }
                }
            }
            _ = sleep_until(meta_at.unwrap_or_else(Instant::now)), if meta_at.is_some() => {
                let Some((since, _)) = pending.take() else { continue };
                let s = store.clone();
                if let Some(Err(e)) = blocking(move || s.refresh_metadata(since)).await {
                    tracing::warn!(error = %e, "module metadata refresh failed");
                }
                kallsyms_due = true;
            }
            _ = sleep_until(read_at.unwrap_or_else(Instant::now)), if read_at.is_some() => {
                kallsyms_due = false;
                let started = Instant::now();
                let s = store.clone();
                match blocking(move || s.reload_kallsyms()).await {
                    Some(Ok(())) => {
                        backoff = Duration::ZERO;
                        next_read = started + cfg.min_interval;
                    }
                    other => {
                        backoff = (backoff * 2).max(cfg.min_interval).min(cfg.max_backoff);
                        if let Some(Err(e)) = other {
                            tracing::warn!(error = %e, retry_in = ?backoff, "kallsyms reload failed");
                        }
                        next_read = Instant::now() + backoff;
                        kallsyms_due = true;
                    }
                }
            }
        }
    }
}
