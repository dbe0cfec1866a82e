//! The `flamegraph` exporter: an interactive SVG per batch (report interval)
//! and group, drawn with inferno; optionally the folded-stacks text that
//! `flamegraph.pl` and inferno read.
//!
//! Folded lines are `comm;root;...;leaf count`, root first. Kernel frames get
//! the `_[k]` suffix that `perf script | stackcollapse-perf` uses, so
//! flamegraph colour palettes tell them apart; unsymbolized frames show as
//! `mapping+0xaddr`.

use crate::group::{attr, bounded_group, group_of, sanitize, unique_path, write_atomic, GroupBy};
use profcol_api::component::{factory, Component, ComponentError, CreateSettings, Factory, FactoryMeta, Kind};
use profcol_api::model::keys;
use profcol_api::{ExportError, Exporter, Profiles, Stability};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// `exporters: flamegraph: ...`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlamegraphConfig {
    /// Where `{file_prefix}-{time}-{group}.svg` (and `.folded`) go.
    pub directory: PathBuf,
    pub file_prefix: String,
    pub group_by: GroupBy,
    /// Also write the folded stacks next to each SVG.
    pub folded: bool,
    /// SVG title; the group and time are added below it.
    pub title: String,
    /// Put the process/thread name at the root of every stack.
    pub root_comm: bool,
}

impl Default for FlamegraphConfig {
    fn default() -> Self {
        FlamegraphConfig {
            directory: PathBuf::from("flamegraphs"),
            file_prefix: "flamegraph".into(),
            group_by: GroupBy::None,
            folded: false,
            title: "CPU flame graph".into(),
            root_comm: true,
        }
    }
}

pub fn factory_flamegraph() -> Arc<dyn Factory> {
    factory::<FlamegraphConfig, _>(
        FactoryMeta {
            type_name: "flamegraph",
            kind: Kind::Exporter,
            stability: Stability::Alpha,
            description: "interactive SVG flame graph (inferno) per report and group; optional folded stacks",
        },
        |settings, cfg| Ok(Component::Exporter(Arc::new(FlamegraphExporter::new(settings, cfg)?))),
    )
}

pub struct FlamegraphExporter {
    cfg: FlamegraphConfig,
}

impl FlamegraphExporter {
    pub fn new(settings: CreateSettings, cfg: FlamegraphConfig) -> Result<Self, ComponentError> {
        std::fs::create_dir_all(&cfg.directory).map_err(|e| {
            ComponentError::msg(format!(
                "exporter {}: directory {}: cannot create it: {e}",
                settings.id,
                cfg.directory.display()
            ))
        })?;
        Ok(FlamegraphExporter { cfg })
    }
}

/// A name as one folded-stacks frame: `;` separates frames and whitespace
/// the count (a line break would split the line), so they are replaced.
fn frame_name(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ';' => ':',
            c if c.is_whitespace() || c.is_control() => '_',
            c => c,
        })
        .collect()
}

/// Folded stacks of a batch per group: `frames (root first) → count`.
pub fn folded(batch: &Profiles, by: GroupBy, root_comm: bool) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for s in batch.samples() {
        let mut frames: Vec<String> = s
            .frames()
            .map(|f| {
                let kernel =
                    f.attribute_str(keys::FRAME_TYPE) == Some("kernel") || f.mapping_filename() == keys::KERNEL_MAPPING;
                let name = match f.function_name() {
                    Some(n) => n.to_owned(),
                    None => {
                        let m = f.mapping_filename().rsplit('/').next().unwrap_or("");
                        let m = if m.is_empty() { "unknown" } else { m };
                        format!("{m}+0x{:x}", f.location.address)
                    }
                };
                let name = frame_name(&name);
                if kernel {
                    format!("{name}_[k]")
                } else {
                    name
                }
            })
            .collect();
        frames.reverse();
        if root_comm {
            if let Some(c) = attr(&s, keys::THREAD_NAME).or_else(|| attr(&s, keys::PROCESS_EXECUTABLE_NAME)) {
                frames.insert(0, frame_name(&c));
            }
        }
        if frames.is_empty() {
            frames.push("[no stack]".into());
        }
        let count: u64 = if !s.sample.values.is_empty() {
            s.sample.values.iter().fold(0u64, |a, &v| a.saturating_add(v.max(0) as u64))
        } else {
            s.sample.timestamps_unix_nano.len().max(1) as u64
        };
        let group = bounded_group(&out, group_of(&s, by));
        let n = out.entry(group).or_default().entry(frames.join(";")).or_default();
        *n = n.saturating_add(count);
    }
    out
}

#[async_trait::async_trait]
impl Exporter for FlamegraphExporter {
    async fn export(&self, batch: &Profiles) -> Result<(), ExportError> {
        if batch.is_empty() {
            return Ok(());
        }
        let groups = folded(batch, self.cfg.group_by, self.cfg.root_comm);
        let (t0, _) = crate::group::time_range(batch);
        let cfg = self.cfg.clone();
        tokio::task::spawn_blocking(move || -> Result<(), ExportError> {
            for (group, stacks) in groups {
                if stacks.values().all(|&n| n == 0) {
                    // inferno draws nothing of zero counts (and says so as an error).
                    tracing::debug!(%group, "no positive counts: no flame graph for this group");
                    continue;
                }
                let lines: Vec<String> = stacks.iter().map(|(k, v)| format!("{k} {v}")).collect();
                let mut opts = inferno::flamegraph::Options::default();
                opts.title = cfg.title.clone();
                opts.subtitle = Some(format!("{group} — {}", crate::group::timestamp(t0)));
                opts.count_name = "samples".into();
                // The java palette colours `_[k]` (kernel) frames apart.
                opts.colors = inferno::flamegraph::Palette::Multi(inferno::flamegraph::color::MultiPalette::Java);
                let mut svg = Vec::new();
                inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut svg)
                    .map_err(|e| ExportError::permanent(format!("drawing the flame graph: {e}")))?;
                let prefix = sanitize(&cfg.file_prefix);
                let path = unique_path(&cfg.directory, &prefix, t0, &group, "svg");
                write_atomic(&path, &svg)
                    .map_err(|e| ExportError::retryable(format!("writing {}: {e}", path.display())))?;
                if cfg.folded {
                    let mut text = lines.join("\n");
                    text.push('\n');
                    let fpath = path.with_extension("folded");
                    write_atomic(&fpath, text.as_bytes())
                        .map_err(|e| ExportError::retryable(format!("writing {}: {e}", fpath.display())))?;
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| ExportError::retryable(format!("writer task: {e}")))?
    }
}
