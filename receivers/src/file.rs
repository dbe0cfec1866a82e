//! `file` receiver: reads OTLP profiles files (protobuf or JSON), one file or
//! every file of a directory, optionally replaying them at a rate.
//!
//! Formats: `.pb`/`.binpb` hold one `ProfilesData` message; `.json` one
//! OTLP/JSON document; `.jsonl` one JSON document per line; `.pbstream`
//! length-prefixed messages as the `file` exporter writes them. Each message is
//! validated before it enters the pipeline; a bad one is logged with its
//! file (and line) and skipped.

use async_trait::async_trait;
use profcol_api::component::{
    factory, Component, ComponentError, ConsumeError, CreateSettings, Factory, FactoryMeta, Kind, Next, Receiver,
    Stability,
};
use profcol_api::telemetry::ComponentTelemetry;
use profcol_api::Profiles;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct FileReceiverConfig {
    /// A file, or a directory whose files are read in name order.
    pub path: PathBuf,
    /// `auto` (by extension: .json, .jsonl, .pbstream, else proto), `proto`,
    /// `json`, `jsonl` or `protostream`.
    pub format: Format,
    /// Batches per second when replaying; 0 sends as fast as the pipeline takes them.
    pub replay_rate: f64,
    /// Read the files again and again until shutdown.
    #[serde(rename = "loop")]
    pub repeat: bool,
}

impl profcol_api::config::Validate for FileReceiverConfig {
    fn validate(&self, p: &mut profcol_api::config::Problems) {
        if self.path.as_os_str().is_empty() {
            p.add("path", "is required: a file or directory of OTLP profiles");
        } else if let Err(e) = std::fs::metadata(&self.path) {
            p.add("path", format!("cannot read {}: {e}; give an existing file or directory", self.path.display()));
        }
        if !(self.replay_rate >= 0.0 && self.replay_rate.is_finite()) {
            p.add("replay_rate", "must be a finite number >= 0 (0 reads as fast as the pipeline takes)");
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    #[default]
    Auto,
    Proto,
    Json,
    Jsonl,
    /// A stream of messages, each prefixed by its length as a 4-byte
    /// big-endian integer (what the `file` exporter writes with `format: proto`).
    ProtoStream,
}

impl Default for FileReceiverConfig {
    fn default() -> Self {
        FileReceiverConfig { path: PathBuf::new(), format: Format::Auto, replay_rate: 0.0, repeat: false }
    }
}

pub fn factory_file() -> Arc<dyn Factory> {
    factory::<FileReceiverConfig, _>(
        FactoryMeta {
            type_name: "file",
            kind: Kind::Receiver,
            stability: Stability::Alpha,
            description:
                "reads OTLP profiles files (protobuf or JSON), a file or a directory, optionally replayed at a rate",
        },
        |set: CreateSettings, cfg: FileReceiverConfig| {
            Ok(Component::Receiver(Arc::new(FileReceiver {
                cfg,
                telemetry: set.telemetry,
                stop: CancellationToken::new(),
                task: Mutex::new(None),
            })))
        },
    )
}

struct FileReceiver {
    cfg: FileReceiverConfig,
    telemetry: ComponentTelemetry,
    stop: CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// The files to read, in name order.
fn list(path: &Path) -> Result<Vec<PathBuf>, ComponentError> {
    let meta = std::fs::metadata(path)
        .map_err(|e| ComponentError::io(format!("file receiver: cannot read {}", path.display()), e))?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| ComponentError::io(format!("file receiver: cannot list {}", path.display()), e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

fn format_of(cfg: Format, path: &Path) -> Format {
    if cfg != Format::Auto {
        return cfg;
    }
    match path.extension().and_then(|e| e.to_str()) {
        Some("json") => Format::Json,
        Some("jsonl") | Some("ndjson") => Format::Jsonl,
        Some("pbstream") => Format::ProtoStream,
        _ => Format::Proto,
    }
}

/// Decodes one file into batches; problems are (where, what) pairs.
fn read_batches(path: &Path, format: Format) -> (Vec<Profiles>, Vec<String>) {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => return (vec![], vec![format!("{}: cannot read: {e}", path.display())]),
    };
    let mut out = Vec::new();
    let mut errs = Vec::new();
    let mut push = |r: Result<Profiles, String>, at: String| match r
        .and_then(|p| p.validate().map(|()| p).map_err(|e| e.to_string()))
    {
        Ok(p) => out.push(p),
        Err(e) => errs.push(format!("{at}: {e}")),
    };
    match format_of(format, path) {
        Format::Jsonl => {
            for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                push(Profiles::from_json(line).map_err(|e| e.to_string()), format!("{}:{}", path.display(), i + 1));
            }
        }
        Format::ProtoStream => {
            let mut rest = &bytes[..];
            let mut k = 0;
            while !rest.is_empty() {
                k += 1;
                let at = format!("{} (message {k})", path.display());
                let Some((len, body)) = rest.split_first_chunk::<4>() else {
                    push(Err("truncated length prefix".into()), at);
                    break;
                };
                let len = u32::from_be_bytes(*len) as usize;
                if body.len() < len {
                    push(Err(format!("truncated message: {len} bytes announced, {} left", body.len())), at);
                    break;
                }
                push(Profiles::decode(&body[..len]).map_err(|e| e.to_string()), at);
                rest = &body[len..];
            }
        }
        Format::Json => push(Profiles::from_json(&bytes).map_err(|e| e.to_string()), path.display().to_string()),
        Format::Proto | Format::Auto => {
            push(Profiles::decode(&bytes).map_err(|e| e.to_string()), path.display().to_string())
        }
    }
    (out, errs)
}

#[async_trait]
impl Receiver for FileReceiver {
    async fn start(&self, next: Next) -> Result<(), ComponentError> {
        let files = list(&self.cfg.path)?;
        if files.is_empty() {
            warn!(path = %self.cfg.path.display(), "file receiver: no files to read");
        }
        let (cfg, stop, telemetry) = (self.cfg.clone(), self.stop.clone(), self.telemetry.clone());
        let task = tokio::spawn(async move {
            let gap = (cfg.replay_rate > 0.0).then(|| Duration::from_secs_f64(1.0 / cfg.replay_rate));
            let mut sent = 0usize;
            'outer: loop {
                for f in &files {
                    let (batches, errs) = read_batches(f, cfg.format);
                    for e in errs {
                        telemetry.refused.inc();
                        warn!("file receiver: skipped invalid input: {e}");
                    }
                    for b in batches {
                        if stop.is_cancelled() {
                            break 'outer;
                        }
                        // A refusal (a full persistent queue downstream) is retried
                        // with backoff: the file is the only copy. The clone that
                        // allows it costs less than the decode that made the batch.
                        let mut backoff = Duration::from_millis(100);
                        loop {
                            match next.send(b.clone()).await {
                                Ok(()) => break,
                                Err(ConsumeError::Closed) => break 'outer,
                                Err(ConsumeError::Rejected(why)) => {
                                    // Refused for good (a processor rejected it): a retry
                                    // would fail the same way; counted as refused.
                                    warn!(file = %f.display(), "file receiver: batch rejected, skipped ({why})");
                                    break;
                                }
                                Err(ConsumeError::Refused(why)) => {
                                    warn!(file = %f.display(), retry_in = ?backoff, "file receiver: batch refused ({why})");
                                    tokio::select! { _ = tokio::time::sleep(backoff) => {}, _ = stop.cancelled() => break 'outer }
                                    backoff = (backoff * 2).min(Duration::from_secs(5));
                                }
                            }
                        }
                        sent += 1;
                        if let Some(g) = gap {
                            tokio::select! { _ = tokio::time::sleep(g) => {}, _ = stop.cancelled() => break 'outer }
                        }
                    }
                }
                if !cfg.repeat {
                    break;
                }
            }
            info!(batches = sent, "file receiver: done reading");
        });
        *self.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        Ok(())
    }

    async fn shutdown(&self) -> Result<(), ComponentError> {
        self.stop.cancel();
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = task {
            let _ = t.await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_files_are_reported_with_where() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.jsonl");
        std::fs::write(&p, format!("{}\nnot json\n\n", Profiles::empty().to_json())).unwrap();
        let (ok, errs) = read_batches(&p, Format::Auto);
        assert_eq!(ok.len(), 1);
        assert_eq!(errs.len(), 1);
        assert!(errs[0].contains("x.jsonl:2"), "{errs:?}");
        let p = dir.path().join("x.pb");
        std::fs::write(&p, b"\xff\xff\xff").unwrap();
        let (ok, errs) = read_batches(&p, Format::Auto);
        assert!(ok.is_empty() && errs[0].contains("not a valid OTLP profiles protobuf"), "{errs:?}");
    }
}
