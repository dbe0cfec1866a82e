//! `file` exporter: OTLP JSON lines or a length-prefixed protobuf stream,
//! with size-based rotation.

use async_trait::async_trait;
use profcol_api::component::{factory, Component, Factory, FactoryMeta, Kind, Stability};
use profcol_api::{ComponentError, ExportError, Exporter, Profiles};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct FileExporterConfig {
    /// The file written to (rotated files get a timestamp before the extension).
    pub path: PathBuf,
    /// `json`: one OTLP/JSON document per line. `proto`: each ProfilesData
    /// message prefixed by its length (4-byte big-endian).
    pub format: FileFormat,
    pub rotation: Rotation,
}

impl profcol_api::config::Validate for FileExporterConfig {}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FileFormat {
    #[default]
    Json,
    Proto,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Rotation {
    /// Rotate when the file would pass this size; 0 never rotates.
    pub max_megabytes: u64,
    /// Rotated files kept; 0 keeps all.
    pub max_backups: usize,
}

impl Default for Rotation {
    fn default() -> Self {
        Rotation { max_megabytes: 100, max_backups: 10 }
    }
}

impl Default for FileExporterConfig {
    fn default() -> Self {
        FileExporterConfig { path: PathBuf::new(), format: FileFormat::Json, rotation: Rotation::default() }
    }
}

pub fn factory_file() -> Arc<dyn Factory> {
    factory::<FileExporterConfig, _>(
        FactoryMeta {
            type_name: "file",
            kind: Kind::Exporter,
            stability: Stability::Alpha,
            description: "writes OTLP profiles as JSON lines or a length-prefixed protobuf stream, rotating by size",
        },
        |_set, cfg: FileExporterConfig| {
            if cfg.path.as_os_str().is_empty() {
                return Err(profcol_api::config::ConfigError::new("path", "is required: the file to write").into());
            }
            Ok(Component::Exporter(Arc::new(FileExporter { cfg, out: Arc::new(Mutex::new(None)) })))
        },
    )
}

struct Writer {
    file: File,
    size: u64,
}

struct FileExporter {
    cfg: FileExporterConfig,
    out: Arc<Mutex<Option<Writer>>>,
}

fn open(path: &Path) -> std::io::Result<Writer> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    let size = file.metadata()?.len();
    Ok(Writer { file, size })
}

/// `dir/name.ext` → `dir/name-<unix ms>.ext`.
fn rotated_name(path: &Path) -> PathBuf {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("profiles");
    let name = match path.extension().and_then(|e| e.to_str()) {
        Some(ext) => format!("{stem}-{ms}.{ext}"),
        None => format!("{stem}-{ms}"),
    };
    path.with_file_name(name)
}

/// Deletes the oldest rotated files beyond `keep`.
fn prune(path: &Path, keep: usize) -> std::io::Result<()> {
    if keep == 0 {
        return Ok(());
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("profiles");
    let prefix = format!("{stem}-");
    let mut rotated: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p != path && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix)))
        .collect();
    rotated.sort();
    let excess = rotated.len().saturating_sub(keep);
    for p in &rotated[..excess] {
        std::fs::remove_file(p)?;
    }
    Ok(())
}

fn write(cfg: &FileExporterConfig, slot: &mut Option<Writer>, bytes: &[u8]) -> std::io::Result<()> {
    let limit = cfg.rotation.max_megabytes << 20;
    if let Some(w) = slot.as_ref() {
        if limit > 0 && w.size > 0 && w.size + bytes.len() as u64 > limit {
            *slot = None;
            std::fs::rename(&cfg.path, rotated_name(&cfg.path))?;
            prune(&cfg.path, cfg.rotation.max_backups)?;
        }
    }
    if slot.is_none() {
        *slot = Some(open(&cfg.path)?);
    }
    let Some(w) = slot.as_mut() else { return Ok(()) };
    w.file.write_all(bytes)?;
    w.size += bytes.len() as u64;
    Ok(())
}

#[async_trait]
impl Exporter for FileExporter {
    async fn export(&self, batch: &Profiles) -> Result<(), ExportError> {
        let bytes = match self.cfg.format {
            FileFormat::Json => {
                let mut s = batch.to_json().into_bytes();
                s.push(b'\n');
                s
            }
            FileFormat::Proto => {
                let body = batch.encode_to_vec();
                let len = u32::try_from(body.len()).map_err(|_| ExportError::permanent("batch larger than 4 GiB"))?;
                let mut v = Vec::with_capacity(body.len() + 4);
                v.extend_from_slice(&len.to_be_bytes());
                v.extend_from_slice(&body);
                v
            }
        };
        let (cfg, out) = (self.cfg.clone(), Arc::clone(&self.out));
        tokio::task::spawn_blocking(move || {
            let mut slot = out.lock().unwrap_or_else(|p| p.into_inner());
            write(&cfg, &mut slot, &bytes).map_err(|e| {
                // The file may be writable again later (disk full, directory recreated).
                *slot = None;
                ExportError::retryable(format!("cannot write {}: {e}", cfg.path.display()))
            })
        })
        .await
        .map_err(|e| ExportError::permanent(format!("writer task failed: {e}")))?
    }

    async fn shutdown(&self) -> Result<(), ComponentError> {
        let mut slot = self.out.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = slot.as_mut() {
            w.file.sync_all().map_err(|e| ComponentError::io(format!("cannot sync {}", self.cfg.path.display()), e))?;
        }
        *slot = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rotates_by_size_and_keeps_backups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let cfg = FileExporterConfig {
            path: path.clone(),
            format: FileFormat::Json,
            rotation: Rotation { max_megabytes: 1, max_backups: 2 },
        };
        let mut slot = None;
        let line = vec![b'x'; 400 << 10];
        for _ in 0..10 {
            write(&cfg, &mut slot, &line).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(files.len(), 3, "current file + 2 backups");
        assert!(std::fs::metadata(&path).unwrap().len() <= 1 << 20);
    }
}
