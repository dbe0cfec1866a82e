//! `file` exporter: OTLP JSON lines or a length-prefixed protobuf stream,
//! with size-based rotation.

use async_trait::async_trait;
use profcol_api::component::{factory, Component, Factory, FactoryMeta, Kind, Stability};
use profcol_api::{ComponentError, ExportError, Exporter, Profiles};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct FileExporterConfig {
    /// The file written to (rotated files get a timestamp before the extension).
    #[schemars(extend("x-profcol-creates" = "file"))]
    pub path: PathBuf,
    /// `json`: one OTLP/JSON document per line. `proto`: each ProfilesData
    /// message prefixed by its length (4-byte big-endian).
    pub format: FileFormat,
    pub rotation: Rotation,
    /// Permissions of the files it creates (octal string).
    pub file_mode: profcol_api::config::Mode,
    /// Permissions of the directories it creates (octal string).
    pub dir_mode: profcol_api::config::Mode,
}

impl profcol_api::config::Validate for FileExporterConfig {
    fn validate(&self, p: &mut profcol_api::config::Problems) {
        if self.path.as_os_str().is_empty() {
            p.add("path", "is required: the file to write");
        } else {
            p.check("path", profcol_api::config::checks::writable_file(&self.path));
        }
        if self.rotation.max_megabytes > 1 << 20 {
            p.add("rotation.max_megabytes", "is above 1048576 (1 TiB); use 0 for no rotation or a smaller size");
        }
    }
}

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
        FileExporterConfig {
            path: PathBuf::new(),
            format: FileFormat::Json,
            rotation: Rotation::default(),
            file_mode: crate::output::DEFAULT_FILE_MODE,
            dir_mode: crate::output::DEFAULT_DIR_MODE,
        }
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

fn open(cfg: &FileExporterConfig) -> std::io::Result<Writer> {
    let path = &cfg.path;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::output::create_dirs(dir, cfg.dir_mode)?;
    }
    let file = crate::output::open_append(path, cfg.file_mode)?;
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

/// Whether `name` is one of the names [`rotated_name`] gives `path`:
/// `{stem}-{digits}[.{ext}]`. Other files in the directory are never touched.
fn is_rotated_name(path: &Path, name: &str) -> bool {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("profiles");
    let rest = match path.extension().and_then(|e| e.to_str()) {
        Some(ext) => name.strip_suffix(ext).and_then(|r| r.strip_suffix('.')),
        None => Some(name),
    };
    rest.and_then(|r| r.strip_prefix(stem))
        .and_then(|r| r.strip_prefix('-'))
        .is_some_and(|ms| !ms.is_empty() && ms.bytes().all(|b| b.is_ascii_digit()))
}

/// Deletes the oldest rotated files beyond `keep`: only files this exporter's
/// rotation names, never anything else in the directory.
fn prune(path: &Path, keep: usize) -> std::io::Result<()> {
    if keep == 0 {
        return Ok(());
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut rotated: Vec<(u128, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p != path && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| is_rotated_name(path, n)))
        .filter_map(|p| {
            let ms = p.file_stem()?.to_str()?.rsplit('-').next()?.parse().ok()?;
            Some((ms, p))
        })
        .collect();
    rotated.sort();
    let excess = rotated.len().saturating_sub(keep);
    for (_, p) in &rotated[..excess] {
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
        *slot = Some(open(cfg)?);
    }
    let Some(w) = slot.as_mut() else { return Ok(()) };
    w.file.write_all(bytes)?;
    w.size += bytes.len() as u64;
    Ok(())
}

#[async_trait]
impl Exporter for FileExporter {
    /// Opens (creates) the file now, so a start that succeeds can write.
    /// A FIFO or device (`/dev/stdout`) is opened at the first export
    /// instead: opening a FIFO blocks until a reader comes.
    async fn start(&self) -> Result<(), ComponentError> {
        if std::fs::metadata(&self.cfg.path).is_ok_and(|m| !m.is_file()) {
            return Ok(());
        }
        let w = open(&self.cfg)
            .map_err(|e| ComponentError::io(format!("path: cannot open {} for writing", self.cfg.path.display()), e))?;
        *self.out.lock().unwrap_or_else(|p| p.into_inner()) = Some(w);
        Ok(())
    }

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
            ..Default::default()
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

    #[tokio::test]
    async fn rotation_removes_only_files_it_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let others = ["out-important.jsonl", "out-123.txt", "out-.jsonl", "out-12a.jsonl", "other-1.jsonl"];
        for o in others {
            std::fs::write(dir.path().join(o), "keep").unwrap();
        }
        let cfg = FileExporterConfig {
            path: path.clone(),
            format: FileFormat::Json,
            rotation: Rotation { max_megabytes: 1, max_backups: 1 },
            ..Default::default()
        };
        let mut slot = None;
        let line = vec![b'x'; 600 << 10];
        for _ in 0..6 {
            write(&cfg, &mut slot, &line).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        for o in others {
            assert_eq!(std::fs::read_to_string(dir.path().join(o)).unwrap(), "keep", "{o}");
        }
        let ours = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| is_rotated_name(&path, e.as_ref().unwrap().file_name().to_str().unwrap()))
            .count();
        assert_eq!(ours, 1, "one backup kept");
    }

    #[tokio::test]
    async fn start_fails_on_a_path_it_cannot_open() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file"), "").unwrap();
        let cfg = FileExporterConfig { path: dir.path().join("file/sub/out.jsonl"), ..Default::default() };
        let x = FileExporter { cfg, out: Arc::new(Mutex::new(None)) };
        let e = x.start().await.unwrap_err().to_string();
        assert!(e.contains("cannot open") && e.contains("file/sub/out.jsonl"), "{e}");
    }
}
