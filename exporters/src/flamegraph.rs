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
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// `exporters: flamegraph: ...`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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

impl profcol_api::config::Validate for FlamegraphConfig {}

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
    /// Graphs written, so a retried batch does not write them again.
    delivered: Arc<crate::group::Delivered>,
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
        Ok(FlamegraphExporter { cfg, delivered: Arc::default() })
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

/// Most bytes of folded-stack text one batch builds. A distinct stack costs
/// its depth × its names' length, from a few bytes per sample on the wire;
/// past the budget a stack folds to [`OVER_BUDGET`], so its samples still count.
pub const MAX_FOLDED_BYTES: usize = 64 << 20;
/// The one frame a stack past [`MAX_FOLDED_BYTES`] is drawn as.
pub const OVER_BUDGET: &str = "[stack_past_the_flame_graph_size_budget]";

/// The frames of a sample's stack, root first, `;`-joined; `None` when they
/// would take more than `budget` bytes.
fn stack_frames(s: &profcol_api::model::view::SampleView<'_>, budget: usize) -> Option<String> {
    let mut names: Vec<String> = Vec::new();
    let mut len = 0usize;
    for f in s.frames() {
        let kernel =
            f.attribute_str(keys::FRAME_TYPE) == Some("kernel") || f.mapping_filename() == keys::KERNEL_MAPPING;
        let mut name = match f.function_name() {
            Some(n) => frame_name(n),
            None => {
                let m = f.mapping_filename().rsplit('/').next().unwrap_or("");
                let m = if m.is_empty() { "unknown" } else { m };
                frame_name(&format!("{m}+0x{:x}", f.location.address))
            }
        };
        if kernel {
            name.push_str("_[k]");
        }
        len += name.len() + 1;
        if len > budget {
            return None;
        }
        names.push(name);
    }
    names.reverse();
    Some(names.join(";"))
}

/// Folded stacks of a batch per group: `frames (root first) → count`.
///
/// Each distinct stack is folded once (not once per sample), and all the
/// text together stays within [`MAX_FOLDED_BYTES`].
pub fn folded(batch: &Profiles, by: GroupBy, root_comm: bool) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut budget = MAX_FOLDED_BYTES;
    // Stack index → its frames, or None when over budget.
    let mut stacks: FxHashMap<i32, Option<String>> = FxHashMap::default();
    // (group, comm, stack index) → count; the lines are made once per key below.
    let mut counts: BTreeMap<(String, Option<String>, i32), u64> = BTreeMap::new();
    let mut groups: BTreeMap<String, ()> = BTreeMap::new();
    for s in batch.samples() {
        stacks.entry(s.sample.stack_index).or_insert_with(|| {
            let f = stack_frames(&s, budget);
            budget = budget.saturating_sub(f.as_ref().map_or(0, String::len));
            f
        });
        let comm = if root_comm {
            attr(&s, keys::THREAD_NAME).or_else(|| attr(&s, keys::PROCESS_EXECUTABLE_NAME)).map(|c| frame_name(&c))
        } else {
            None
        };
        let count: u64 = if !s.sample.values.is_empty() {
            s.sample.values.iter().fold(0u64, |a, &v| a.saturating_add(v.max(0) as u64))
        } else {
            s.sample.timestamps_unix_nano.len().max(1) as u64
        };
        let group = bounded_group(&groups, group_of(&s, by));
        groups.entry(group.clone()).or_default();
        let n = counts.entry((group, comm, s.sample.stack_index)).or_default();
        *n = n.saturating_add(count);
    }
    let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for ((group, comm, stack), count) in counts {
        let frames = match stacks.get(&stack) {
            Some(Some(f)) if !f.is_empty() => f.as_str(),
            Some(Some(_)) => "[no stack]",
            _ => OVER_BUDGET,
        };
        let need = frames.len() + comm.as_ref().map_or(0, |c| c.len() + 1);
        let line = match comm {
            _ if need > budget => OVER_BUDGET.to_owned(),
            Some(c) => format!("{c};{frames}"),
            None => frames.to_owned(),
        };
        budget = budget.saturating_sub(line.len());
        let n = out.entry(group).or_default().entry(line).or_default();
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
        let (cfg, delivered) = (self.cfg.clone(), Arc::clone(&self.delivered));
        tokio::task::spawn_blocking(move || -> Result<(), ExportError> {
            for (group, stacks) in groups {
                if stacks.values().all(|&n| n == 0) {
                    // inferno draws nothing of zero counts (and says so as an error).
                    tracing::debug!(%group, "no positive counts: no flame graph for this group");
                    continue;
                }
                let lines: Vec<String> = stacks.iter().map(|(k, v)| format!("{k} {v}")).collect();
                let key = crate::group::Delivered::key(&format!("{group} {t0}"), lines.iter().map(|l| l.as_bytes()));
                if delivered.contains(key) {
                    continue; // written by an earlier attempt of this batch
                }
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
                delivered.insert(key);
            }
            Ok(())
        })
        .await
        .map_err(|e| ExportError::retryable(format!("writer task: {e}")))?
    }
}
