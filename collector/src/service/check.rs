//! Checks every component section against its factory: known type, valid
//! settings. Produces the effective config (defaults filled) of each.

use crate::exporter_helper::settings::{self as exporterhelper, ExporterHelperConfig};
use crate::registry::Registry;
use profcol_api::component::{ComponentId, Kind};
use profcol_api::config::ConfigValue;
use profcol_config::{Config, ConfigError, ConfigErrors};
use std::collections::BTreeMap;

/// A component's checked settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Checked {
    /// The section handed to the factory (host keys removed for exporters),
    /// as written: secrets in it are real.
    pub config: ConfigValue,
    /// The effective section (defaults filled, secrets redacted), for print-config.
    pub effective: ConfigValue,
    /// Exporters only: the host's queue / retry / timeout settings.
    pub helper: Option<ExporterHelperConfig>,
}

pub type CheckedComponents = BTreeMap<(Kind, ComponentId), Checked>;

const KINDS: [Kind; 4] = [Kind::Receiver, Kind::Processor, Kind::Exporter, Kind::Extension];

/// Runs every factory's check (decode and [`profcol_api::config::Validate`])
/// on its section: the one check behind `profcol validate`, the start and
/// every reload. Nothing is created or started here.
pub fn check(config: &Config, registry: &Registry) -> Result<CheckedComponents, ConfigErrors> {
    let mut out = BTreeMap::new();
    let mut errors = Vec::new();
    for kind in KINDS {
        let section = Config::section_name(kind);
        let comps = match kind {
            Kind::Receiver => &config.receivers,
            Kind::Processor => &config.processors,
            Kind::Exporter => &config.exporters,
            Kind::Extension => &config.extensions,
        };
        for (id, raw) in comps {
            let ids = id.to_string();
            let Some(f) = registry.get(kind, id.type_name()) else {
                errors.push(config.error_at(
                    &[section, ids.as_str()],
                    format!(
                        "unknown {kind} type {:?}; known {kind} types: {} (see `profcol components`)",
                        id.type_name(),
                        registry.types(kind).join(", ")
                    ),
                ));
                continue;
            };
            let mut place = |es: Vec<profcol_api::config::ConfigError>| {
                errors.extend(es.iter().map(|e| located(config, section, &ids, e)));
            };
            let (helper, raw) = if kind == Kind::Exporter {
                match exporterhelper::split(raw) {
                    Ok((h, rest)) => (Some(h), rest),
                    Err(es) => {
                        place(es);
                        // Still check the exporter's own keys, so every error is reported.
                        if let Err(es) = f.check(&exporterhelper::without_host_keys(raw)) {
                            place(es);
                        }
                        continue;
                    }
                }
            } else {
                (None, raw.clone())
            };
            match f.check(&raw) {
                Ok(effective) => {
                    out.insert((kind, id.clone()), Checked { config: raw, effective, helper });
                }
                Err(es) => place(es),
            }
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// A factory's error, placed at its full config path.
fn located(config: &Config, section: &str, id: &str, e: &profcol_api::config::ConfigError) -> ConfigError {
    let mut path = vec![section.to_owned(), id.to_owned()];
    path.extend(e.path.split('.').filter(|s| !s.is_empty() && *s != "?").map(str::to_owned));
    config.error_at(&path, e.message.clone())
}
