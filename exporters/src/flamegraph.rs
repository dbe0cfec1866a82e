//! The `flamegraph` exporter: an interactive SVG per batch (report interval)
//! and group, drawn with inferno; optionally the folded-stacks text that
//! `flamegraph.pl` and inferno read.
//!
//! Folded lines are `comm;root;...;leaf count`, root first, made by
//! `profcol_model_rules::folded` (kernel frames `name_[k]`, unsymbolized ones
//! `mapping+0xaddr`), the rules the `folded_exporter` example plugin uses too.

use crate::delivered::Delivered;
use crate::file_names::{sanitize, time_range, timestamp, unique_path};
use crate::group::{bounded_group, own_report_type, GroupBy, GroupNames};
use crate::output::write_atomic;
use crate::sample_attrs::AttrReader;
use profcol_api::component::{factory, Component, ComponentError, CreateSettings, Factory, FactoryMeta, Kind};
use profcol_api::{ExportError, Exporter, Profiles, Stability};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// `exporters: flamegraph: ...`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct FlamegraphConfig {
    /// Where `{file_prefix}-{time}-{group}.svg` (and `.folded`) go.
    #[schemars(extend("x-profcol-creates" = "directory"))]
    pub directory: PathBuf,
    /// First part of each file name (no '/').
    pub file_prefix: String,
    /// One graph per report (`none`), per process (`process`) or per container (`container`).
    pub group_by: GroupBy,
    /// Also write the folded stacks next to each SVG.
    pub folded: bool,
    /// SVG title; the group and time are added below it.
    pub title: String,
    /// Put the process/thread name at the root of every stack.
    pub root_comm: bool,
    /// Permissions of the files it creates (octal string).
    pub file_mode: profcol_api::config::Mode,
    /// Permissions of the directories it creates (octal string).
    pub dir_mode: profcol_api::config::Mode,
}

impl profcol_api::config::Validate for FlamegraphConfig {
    fn validate(&self, p: &mut profcol_api::config::Problems) {
        p.check("directory", profcol_api::config::checks::writable_dir(&self.directory));
        if self.file_prefix.is_empty() || self.file_prefix.contains('/') {
            p.add("file_prefix", "must be a non-empty file name prefix without '/' (default flamegraph)");
        }
    }
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
            file_mode: crate::output::DEFAULT_FILE_MODE,
            dir_mode: crate::output::DEFAULT_DIR_MODE,
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
    delivered: Arc<Delivered>,
}

impl FlamegraphExporter {
    pub fn new(_settings: CreateSettings, cfg: FlamegraphConfig) -> Result<Self, ComponentError> {
        crate::output::create_dirs(&cfg.directory, cfg.dir_mode).map_err(|e| {
            ComponentError::msg(format!("directory {}: cannot create it: {e}", cfg.directory.display()))
        })?;
        Ok(FlamegraphExporter { cfg, delivered: Arc::default() })
    }
}

pub use profcol_model_rules::folded::{MAX_FOLDED_BYTES, OVER_BUDGET};

/// A frame as the shared folding rules see it.
struct Folding<'a>(profcol_api::model::view::FrameView<'a>);

impl profcol_model_rules::folded::Frame for Folding<'_> {
    fn function_name(&self) -> Option<&str> {
        self.0.function_name()
    }
    fn mapping_filename(&self) -> &str {
        self.0.mapping_filename()
    }
    fn address(&self) -> u64 {
        self.0.location.address
    }
    fn file_offset(&self) -> Option<u64> {
        let m = self.0.mapping()?;
        profcol_model_rules::folded::offset_in_file(
            self.0.location.address,
            m.memory_start,
            m.memory_limit,
            m.file_offset,
        )
    }
    fn frame_type(&self) -> Option<&str> {
        self.0.attribute_str(profcol_model_rules::folded::FRAME_TYPE_KEY)
    }
}

/// Folded stacks of a batch per group: `frames (root first) → count`.
///
/// The lines follow `profcol_model_rules::folded` (shared with the
/// `folded_exporter` example plugin): each distinct stack is folded once
/// (not once per sample), and all the text together stays within
/// [`MAX_FOLDED_BYTES`].
pub fn folded(batch: &Profiles, by: GroupBy, root_comm: bool) -> BTreeMap<String, BTreeMap<String, u64>> {
    use profcol_model_rules::folded;
    let mut folder = folded::Folder::new();
    let mut groups: BTreeMap<String, ()> = BTreeMap::new();
    let (mut reader, mut names) = (AttrReader::default(), GroupNames::new(by));
    for s in batch.samples() {
        let comm = if root_comm { folded::comm(|| s.attributes(), s.resource) } else { None };
        let count = folded::sample_count(&s.sample.values, s.sample.timestamps_unix_nano.len());
        let attrs = if by == GroupBy::None { Default::default() } else { reader.read(&s) };
        let mut group = names.of(&attrs).to_owned();
        if let Some(own) = own_report_type(s.sample_type().0) {
            group.push('-');
            group.push_str(own);
        }
        let group = bounded_group(&groups, group);
        groups.entry(group.clone()).or_default();
        folder.add(group, s.sample.stack_index, || s.frames().map(Folding), comm.as_deref(), count);
    }
    folder.finish()
}

#[async_trait::async_trait]
impl Exporter for FlamegraphExporter {
    async fn export(&self, batch: &Profiles) -> Result<(), ExportError> {
        if batch.is_empty() {
            return Ok(());
        }
        let groups = folded(batch, self.cfg.group_by, self.cfg.root_comm);
        let (t0, _) = time_range(batch);
        let (cfg, delivered) = (self.cfg.clone(), Arc::clone(&self.delivered));
        tokio::task::spawn_blocking(move || -> Result<(), ExportError> {
            for (group, stacks) in groups {
                if stacks.values().all(|&n| n == 0) {
                    // inferno draws nothing of zero counts (and says so as an error).
                    tracing::debug!(%group, "no positive counts: no flame graph for this group");
                    continue;
                }
                let lines: Vec<String> = stacks.iter().map(|(k, v)| format!("{k} {v}")).collect();
                let key = Delivered::key(&format!("{group} {t0}"), lines.iter().map(|l| l.as_bytes()));
                if delivered.contains(key) {
                    continue; // written by an earlier attempt of this batch
                }
                let mut opts = inferno::flamegraph::Options::default();
                opts.title = cfg.title.clone();
                opts.subtitle = Some(format!("{group} — {}", timestamp(t0)));
                opts.count_name = "samples".into();
                // The java palette colours `_[k]` (kernel) frames apart.
                opts.colors = inferno::flamegraph::Palette::Multi(inferno::flamegraph::color::MultiPalette::Java);
                let mut svg = Vec::new();
                inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut svg)
                    .map_err(|e| ExportError::permanent(format!("drawing the flame graph: {e}")))?;
                let prefix = sanitize(&cfg.file_prefix);
                let path = unique_path(&cfg.directory, &prefix, t0, &group, "svg");
                write_atomic(&path, &svg, cfg.file_mode)
                    .map_err(|e| ExportError::retryable(format!("writing {}: {e}", path.display())))?;
                if cfg.folded {
                    let text = profcol_model_rules::folded::text(&stacks);
                    let fpath = path.with_extension("folded");
                    write_atomic(&fpath, text.as_bytes(), cfg.file_mode)
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
