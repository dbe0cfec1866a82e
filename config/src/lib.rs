//! `profcol-config`: loads the OTel-Collector-style YAML configuration.
//!
//! Files are parsed, `${env:...}` references expanded, merged in order
//! (maps deep-merged, lists replaced), `--set` overrides applied, and the
//! structure validated: top-level sections, component ids, the typed
//! `service` section and every pipeline reference. Per-component sections stay
//! raw YAML; the host hands them to their factories, and reports their errors
//! through [`Config::error_at`] so they carry file:line:column too.
//! Every problem found is reported together.

mod error;
mod expand;
mod merge;
mod positions;
mod service;
mod telemetry;
mod value;

use error::render_path;
pub use error::{ConfigError, ConfigErrors, Position};
pub use positions::Positions;
pub use service::{PipelineConfig, PluginsConfig, RuntimeConfig, ServiceConfig};
pub use telemetry::{
    BatchProcessorConfig, LogEncoding, LogProcessorConfig, LogsConfig, MetricReaderConfig, MetricsConfig, OtlpProtocol,
    OtlpTelemetryExporter, PeriodicReaderConfig, PrometheusConfig, PullExporterConfig, PullReaderConfig,
    PushExporterConfig, TelemetryConfig, TelemetryTls, TracesConfig,
};
pub use value::parse_section;

use profcol_api::component::{ComponentId, Kind};
use profcol_api::config::ConfigValue;
use serde_yaml::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where config text comes from.
#[derive(Clone, Debug)]
pub enum Source {
    File(PathBuf),
    /// Text with a display name (the embedded default config).
    Text {
        name: String,
        text: String,
    },
}

/// A loaded, structurally valid configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub receivers: BTreeMap<ComponentId, ConfigValue>,
    pub processors: BTreeMap<ComponentId, ConfigValue>,
    pub exporters: BTreeMap<ComponentId, ConfigValue>,
    pub extensions: BTreeMap<ComponentId, ConfigValue>,
    pub service: ServiceConfig,
    /// Pipelines with parsed ids, in name order.
    pub pipelines: BTreeMap<String, Pipeline>,
    pub positions: Positions,
}

/// A pipeline with its references resolved to ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pipeline {
    pub receivers: Vec<ComponentId>,
    pub processors: Vec<ComponentId>,
    pub exporters: Vec<ComponentId>,
}

const SECTIONS: [(&str, Kind); 4] = [
    ("receivers", Kind::Receiver),
    ("processors", Kind::Processor),
    ("exporters", Kind::Exporter),
    ("extensions", Kind::Extension),
];

/// Collects errors with their positions.
struct Report<'a> {
    positions: &'a Positions,
    errors: Vec<ConfigError>,
}

impl Report<'_> {
    fn at<S: AsRef<str>>(&mut self, path: &[S], message: impl Into<String>) {
        self.errors.push(ConfigError {
            position: self.positions.locate(path),
            path: render_path(path),
            message: message.into(),
        });
    }
}

/// Loads sources in order, applies `sets`, and validates the structure.
pub fn load(sources: &[Source], sets: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigErrors> {
    match load_partial(sources, sets, env) {
        (Some(c), e) if e.is_empty() => Ok(c),
        (_, e) => Err(ConfigErrors(e)),
    }
}

/// Like [`load`], but returns the config whenever the files parsed, next to
/// the structural errors found, so a caller can add its own checks and report
/// every problem together.
pub fn load_partial(
    sources: &[Source],
    sets: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> (Option<Config>, Vec<ConfigError>) {
    let mut positions = Positions::default();
    let mut merged = Value::Mapping(Default::default());
    let mut errors = Vec::new();
    for src in sources {
        let (name, text) = match src {
            Source::File(p) => match std::fs::read_to_string(p) {
                Ok(t) => (p.clone(), t),
                Err(e) => {
                    errors.push(ConfigError {
                        position: None,
                        path: String::new(),
                        message: format!("cannot read config file {}: {e}", p.display()),
                    });
                    continue;
                }
            },
            Source::Text { name, text } => (PathBuf::from(name), text.clone()),
        };
        match parse_file(&name, &text, env, &mut positions) {
            Ok(v) => merge::deep_merge(&mut merged, v),
            Err(mut e) => errors.append(&mut e),
        }
    }
    for s in sets {
        match merge::set_to_value(s) {
            Ok(v) => merge::deep_merge(&mut merged, v),
            Err(m) => errors.push(ConfigError { position: None, path: String::new(), message: m }),
        }
    }
    if !errors.is_empty() {
        return (None, errors);
    }
    from_value(merged, positions)
}

/// Parses one file: YAML syntax, then `${...}` expansion.
fn parse_file(
    name: &Path,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
    positions: &mut Positions,
) -> Result<Value, Vec<ConfigError>> {
    let mut v: Value = match serde_yaml::from_str(text) {
        Ok(Value::Null) => Value::Mapping(Default::default()),
        Ok(v) => v,
        Err(e) => {
            let position =
                e.location().map(|l| Position { file: name.to_path_buf(), line: l.line(), column: l.column() });
            let msg = e.to_string();
            // serde_yaml appends " at line X column Y"; the position says that already.
            let message = match msg.rfind(" at line ") {
                Some(i) if position.is_some() => msg[..i].to_owned(),
                _ => msg,
            };
            return Err(vec![ConfigError {
                position,
                path: String::new(),
                message: format!("invalid YAML: {message}"),
            }]);
        }
    };
    positions.add_file(name, text);
    let mut errs = Vec::new();
    expand::expand_value(&mut v, &mut Vec::new(), env, &mut errs);
    if errs.is_empty() {
        Ok(v)
    } else {
        let mut r = Report { positions, errors: vec![] };
        for (path, m) in errs {
            r.at(&path, m);
        }
        Err(r.errors)
    }
}

/// Validates the merged document's structure.
fn from_value(merged: Value, positions: Positions) -> (Option<Config>, Vec<ConfigError>) {
    let mut r = Report { positions: &positions, errors: vec![] };
    let mut sections: BTreeMap<&str, BTreeMap<ComponentId, ConfigValue>> = BTreeMap::new();
    let mut service = ServiceConfig::default();
    let Value::Mapping(top) = merged else {
        r.at(
            &[""; 0],
            "the configuration must be a mapping with receivers, processors, exporters, extensions and service",
        );
        return (None, r.errors);
    };
    for (k, v) in top {
        let key = expand::key_str(&k);
        if let Some((name, _)) = SECTIONS.iter().find(|(n, _)| *n == key) {
            let comps = sections.entry(name).or_default();
            match v {
                Value::Null => {}
                Value::Mapping(m) => {
                    for (id, cfg) in m {
                        let id_s = expand::key_str(&id);
                        match id_s.parse::<ComponentId>() {
                            Ok(id) => {
                                comps.insert(id, value::to_config_value(cfg));
                            }
                            Err(e) => r.at(&[key.as_str(), id_s.as_str()], e.to_string()),
                        }
                    }
                }
                _ => r.at(&[key.as_str()], "must be a mapping of component id to its settings"),
            }
        } else if key == "service" {
            match serde_path_to_error::deserialize::<_, ServiceConfig>(if v.is_null() {
                Value::Mapping(Default::default())
            } else {
                v
            }) {
                Ok(s) => {
                    check_service(&s, &mut r);
                    service = s;
                }
                Err(e) => {
                    let mut path = vec!["service".to_owned()];
                    path.extend(
                        e.path().to_string().split('.').filter(|s| !s.is_empty() && *s != "?").map(str::to_owned),
                    );
                    let msg = e.into_inner().to_string();
                    r.at(&path, msg);
                }
            }
        } else if key == "connectors" {
            r.at(&[key.as_str()], "connectors are not supported by profcol; remove the section");
        } else {
            r.at(
                &[key.as_str()],
                format!(
                    "unknown top-level key {key:?}; expected receivers, processors, exporters, extensions or service"
                ),
            );
        }
    }
    let mut take = |n: &str| sections.remove(n).unwrap_or_default();
    let (receivers, processors, exporters, extensions) =
        (take("receivers"), take("processors"), take("exporters"), take("extensions"));

    let mut pipelines = BTreeMap::new();
    for (pid, p) in &service.pipelines {
        let path = ["service", "pipelines", pid.as_str()];
        let signal = pid.split('/').next().unwrap_or_default();
        if signal != "profiles" || pid.ends_with('/') {
            r.at(&path, format!("invalid pipeline id {pid:?}: profcol carries profiles only; name pipelines profiles or profiles/<name>"));
            continue;
        }
        let mut resolve = |kind: &str, ids: &[String], known: &BTreeMap<ComponentId, ConfigValue>, field: &str| {
            let mut out = Vec::new();
            for (i, s) in ids.iter().enumerate() {
                let ipath = ["service", "pipelines", pid.as_str(), field, &i.to_string()];
                match s.parse::<ComponentId>() {
                    Ok(id) if known.contains_key(&id) => out.push(id),
                    Ok(_) => r.at(&ipath[..3], format!("references {kind} {s:?} which is not configured")),
                    Err(e) => r.at(&ipath, e.to_string()),
                }
            }
            out
        };
        let pr = resolve("receiver", &p.receivers, &receivers, "receivers");
        let pp = resolve("processor", &p.processors, &processors, "processors");
        let pe = resolve("exporter", &p.exporters, &exporters, "exporters");
        if p.receivers.is_empty() {
            r.at(&path, "must have at least one receiver");
        }
        if p.exporters.is_empty() {
            r.at(&path, "must have at least one exporter");
        }
        pipelines.insert(pid.clone(), Pipeline { receivers: pr, processors: pp, exporters: pe });
    }
    if service.pipelines.is_empty() && r.errors.is_empty() {
        r.at(
            &["service", "pipelines"],
            "no pipelines configured; add service::pipelines::profiles with receivers and exporters",
        );
    }
    for (i, e) in service.extensions.iter().enumerate() {
        match e.parse::<ComponentId>() {
            Ok(id) if extensions.contains_key(&id) => {}
            Ok(_) => r.at(
                &["service", "extensions", &i.to_string()],
                format!("references extension {e:?} which is not configured"),
            ),
            Err(err) => r.at(&["service", "extensions", &i.to_string()], err.to_string()),
        }
    }
    let errors = r.errors;
    (Some(Config { receivers, processors, exporters, extensions, service, pipelines, positions }), errors)
}

/// What the typed `service` section must hold beyond its types.
fn check_service(s: &ServiceConfig, r: &mut Report<'_>) {
    use profcol_api::config::checks;
    let mut problems = Vec::new();
    telemetry::check(&s.telemetry, &mut problems);
    for (path, m) in problems {
        let mut full = vec!["service".to_owned(), "telemetry".to_owned()];
        full.extend(path);
        r.at(&full, m);
    }
    if let Err(m) = checks::positive(s.shutdown_timeout, "the drain budget on SIGINT/SIGTERM; default 10s") {
        r.at(&["service", "shutdown_timeout"], m);
    }
    if let Some(n) = s.runtime.worker_threads {
        if !(1..=1024).contains(&n) {
            r.at(
                &["service", "runtime", "worker_threads"],
                format!("{n}: use 1 to 1024 (leave it out for one per CPU)"),
            );
        }
    }
    if let Some(n) = s.runtime.malloc_arenas {
        if !(1..=1024).contains(&n) {
            r.at(
                &["service", "runtime", "malloc_arenas"],
                format!("{n}: use 1 to 1024 (leave it out for glibc's default)"),
            );
        }
    }
}

impl Config {
    /// The raw section of component `id` of `kind`.
    pub fn section(&self, kind: Kind, id: &ComponentId) -> Option<&ConfigValue> {
        match kind {
            Kind::Receiver => self.receivers.get(id),
            Kind::Processor => self.processors.get(id),
            Kind::Exporter => self.exporters.get(id),
            Kind::Extension => self.extensions.get(id),
        }
    }

    /// An error at a config path, with the file position of its deepest located node.
    pub fn error_at<S: AsRef<str>>(&self, path: &[S], message: impl Into<String>) -> ConfigError {
        ConfigError { position: self.positions.locate(path), path: render_path(path), message: message.into() }
    }

    /// The top-level section name of `kind`.
    pub fn section_name(kind: Kind) -> &'static str {
        SECTIONS.iter().find(|(_, k)| *k == kind).map(|(n, _)| *n).unwrap_or("extensions")
    }
}
