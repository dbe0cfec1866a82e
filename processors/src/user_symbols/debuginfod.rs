//! A debuginfod client for the loader thread: `GET URL/buildid/ID/debuginfo`
//! on each server in turn, with a timeout per request, a size cap, and a
//! negative cache so a build id no server has is asked for once per
//! `negative_ttl`, not once per frame or batch.
//!
//! The loader is a plain thread: requests run on a current-thread tokio
//! runtime of its own (reqwest is async), so a slow server holds only the
//! loader, for at most `timeout` per server, never a pipeline.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use super::config::DebuginfodConfig;

/// Requests by outcome, read into /metrics.
#[derive(Default)]
pub struct DebuginfodCounters {
    pub ok: AtomicU64,
    pub not_found: AtomicU64,
    /// Timeouts, refused connections, server errors, over-size answers.
    pub error: AtomicU64,
    /// Lookups answered by the negative cache (no request made).
    pub negative_hits: AtomicU64,
}

pub(crate) struct Debuginfod {
    urls: Vec<String>,
    timeout: Duration,
    max_bytes: u64,
    negative_ttl: Duration,
    negative: FxHashMap<String, Instant>,
    runtime: Option<tokio::runtime::Runtime>,
    client: Option<reqwest::Client>,
}

/// Most build ids remembered as missing; expired ones are swept first.
const MAX_NEGATIVE: usize = 65536;

impl Debuginfod {
    /// The client for `cfg`: its `urls`, else `DEBUGINFOD_URLS` (space
    /// separated, as elfutils reads it); `None` when neither names a server.
    pub(crate) fn new(cfg: &DebuginfodConfig) -> Option<Self> {
        let urls: Vec<String> = if cfg.urls.is_empty() {
            std::env::var("DEBUGINFOD_URLS").unwrap_or_default().split_whitespace().map(str::to_owned).collect()
        } else {
            cfg.urls.clone()
        };
        let urls: Vec<String> = urls.into_iter().map(|u| u.trim_end_matches('/').to_owned()).collect();
        if urls.is_empty() {
            return None;
        }
        Some(Debuginfod {
            urls,
            timeout: cfg.timeout,
            max_bytes: cfg.max_download_bytes,
            negative_ttl: cfg.negative_ttl,
            negative: FxHashMap::default(),
            runtime: None,
            client: None,
        })
    }

    /// The debug file of `build_id` from the first server that has it.
    pub(crate) fn debuginfo(&mut self, build_id: &str, counters: &DebuginfodCounters) -> Option<Vec<u8>> {
        if let Some(since) = self.negative.get(build_id) {
            if since.elapsed() < self.negative_ttl {
                counters.negative_hits.fetch_add(1, Relaxed);
                return None;
            }
        }
        if self.runtime.is_none() {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
            let client = reqwest::Client::builder().timeout(self.timeout).build();
            match (rt, client) {
                (Ok(rt), Ok(c)) => {
                    self.runtime = Some(rt);
                    self.client = Some(c);
                }
                (Err(e), _) => {
                    tracing::warn!(error = %e, "user_symbols: no runtime for debuginfod requests");
                    return None;
                }
                (_, Err(e)) => {
                    tracing::warn!(error = %e, "user_symbols: no HTTP client for debuginfod");
                    return None;
                }
            }
        }
        let (rt, client) = (self.runtime.as_ref()?, self.client.as_ref()?);
        for url in &self.urls {
            let full = format!("{url}/buildid/{build_id}/debuginfo");
            match rt.block_on(fetch(client, &full, self.max_bytes)) {
                Ok(Some(bytes)) => {
                    counters.ok.fetch_add(1, Relaxed);
                    return Some(bytes);
                }
                Ok(None) => {
                    counters.not_found.fetch_add(1, Relaxed);
                }
                Err(e) => {
                    counters.error.fetch_add(1, Relaxed);
                    tracing::debug!(url = %url, build_id, error = %e, "user_symbols: debuginfod request failed");
                }
            }
        }
        if self.negative.len() >= MAX_NEGATIVE {
            let ttl = self.negative_ttl;
            self.negative.retain(|_, t| t.elapsed() < ttl);
            if self.negative.len() >= MAX_NEGATIVE {
                self.negative.clear();
            }
        }
        self.negative.insert(build_id.to_owned(), Instant::now());
        None
    }
}

/// `Ok(None)` for 404; an error for anything else that is not a 200 with
/// at most `max` bytes.
async fn fetch(client: &reqwest::Client, url: &str, max: u64) -> Result<Option<Vec<u8>>, String> {
    let mut resp = client.get(url).send().await.map_err(|e| e.without_url().to_string())?;
    let status = resp.status();
    if status == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !status.is_success() {
        return Err(format!("HTTP {status}"));
    }
    if resp.content_length().is_some_and(|n| n > max) {
        return Err(format!("answer larger than max_download_bytes ({max})"));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.without_url().to_string())? {
        if body.len() as u64 + chunk.len() as u64 > max {
            return Err(format!("answer larger than max_download_bytes ({max})"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}
