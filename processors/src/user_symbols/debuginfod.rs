//! A debuginfod client for the loader thread: `GET URL/buildid/ID/debuginfo`
//! (the debug file) or `GET URL/buildid/ID/executable` (the binary, for a
//! gateway naming frames of binaries that are not on its host) on each
//! server in turn, with a timeout per request, a size cap, and a negative
//! cache so a file no server has is asked for once per `negative_ttl`, not
//! once per frame or batch.
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
    /// (build id, what) → when no server had it.
    negative: FxHashMap<(String, Artifact), Instant>,
    runtime: Option<tokio::runtime::Runtime>,
    client: Option<reqwest::Client>,
}

/// Most build ids remembered as missing; expired ones are swept first.
const MAX_NEGATIVE: usize = 65536;

/// Longest build id asked for, in hex digits (GNU ones are 40).
const MAX_BUILD_ID_HEX: usize = 128;

/// What is fetched by build id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Artifact {
    /// The separate debug file (DWARF, `.symtab`).
    Debuginfo,
    /// The binary itself: its load segments map file offsets to addresses.
    Executable,
}

impl Artifact {
    fn path(self) -> &'static str {
        match self {
            Artifact::Debuginfo => "debuginfo",
            Artifact::Executable => "executable",
        }
    }
}

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

    /// `what` of `build_id` from the first server that has it. A build id
    /// that is not lowercase hex (it may come from any OTLP sender) is
    /// never put into a URL.
    pub(crate) fn fetch(&mut self, build_id: &str, what: Artifact, counters: &DebuginfodCounters) -> Option<Vec<u8>> {
        let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        if build_id.is_empty() || build_id.len() > MAX_BUILD_ID_HEX || !build_id.bytes().all(hex) {
            return None;
        }
        let key = (build_id.to_owned(), what);
        if let Some(since) = self.negative.get(&key) {
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
            let full = format!("{url}/buildid/{build_id}/{}", what.path());
            match rt.block_on(get(client, &full, self.max_bytes)) {
                Ok(Some(bytes)) => {
                    counters.ok.fetch_add(1, Relaxed);
                    return Some(bytes);
                }
                Ok(None) => {
                    counters.not_found.fetch_add(1, Relaxed);
                }
                Err(e) => {
                    counters.error.fetch_add(1, Relaxed);
                    tracing::debug!(url = %url, build_id, what = what.path(), error = %e, "user_symbols: debuginfod request failed");
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
        self.negative.insert(key, Instant::now());
        None
    }
}

/// `Ok(None)` for 404; an error for anything else that is not a 200 with
/// at most `max` bytes.
async fn get(client: &reqwest::Client, url: &str, max: u64) -> Result<Option<Vec<u8>>, String> {
    let mut resp = client.get(url).send().await.map_err(|e| e.without_url().to_string())?;
    let status = resp.status();
    if status == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !status.is_success() {
        return Err(format!("HTTP {status}"));
    }
    let announced = resp.content_length();
    if announced.is_some_and(|n| n > max) {
        return Err(format!("answer larger than max_download_bytes ({max})"));
    }
    // Sized once when the server says how much (no doubling past `max`).
    let mut body = Vec::with_capacity(announced.and_then(|n| usize::try_from(n).ok()).unwrap_or(0));
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.without_url().to_string())? {
        if body.len() as u64 + chunk.len() as u64 > max {
            return Err(format!("answer larger than max_download_bytes ({max})"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}
