//! What a plugin file is, read from its component structure without
//! compiling it: whether it is a component at all, which profcol world it
//! implements, for which WIT version, and its imports and exports. Used by
//! `profcol validate` (cheap: no compile) and `profcol plugin inspect`.

use std::fmt;
use wasmparser::{Encoding, Parser, Payload};

/// The WIT package the host implements.
pub const WIT_PACKAGE: &str = "profcol:plugin";
/// Its version; a plugin built against another version is refused.
pub const WIT_VERSION: &str = "0.1.0";

/// The two plugin worlds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum World {
    Processor,
    Exporter,
}

impl World {
    pub fn as_str(self) -> &'static str {
        match self {
            World::Processor => "processor",
            World::Exporter => "exporter",
        }
    }
    /// The interface this world exports, without version.
    fn export_interface(self) -> &'static str {
        match self {
            World::Processor => "process-batch",
            World::Exporter => "export-batch",
        }
    }
}

impl fmt::Display for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outside of a plugin component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspection {
    pub size: usize,
    /// Top-level import names (`wasi:cli/environment@0.2.x`, `profcol:plugin/host@0.1.0`).
    pub imports: Vec<String>,
    pub exports: Vec<String>,
}

/// The file cannot be a profcol plugin.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InspectError {
    #[error("not a WebAssembly component: {0} (build it for wasm32-wasip2, or turn a core module into a component with `wasm-tools component new`)")]
    NotComponent(String),
    #[error("exports no profcol plugin world: it exports {exports:?}, expected `{WIT_PACKAGE}/process-batch@{WIT_VERSION}` (world processor) or `{WIT_PACKAGE}/export-batch@{WIT_VERSION}` (world exporter)")]
    NoWorld { exports: Vec<String> },
    #[error("built for WIT {WIT_PACKAGE}@{found}, but this profcol implements {WIT_PACKAGE}@{WIT_VERSION}: rebuild the plugin against plugins/wit/plugin.wit {WIT_VERSION}")]
    WitVersion { found: String },
    #[error("implements world `{found}` but is used as a {expected}: a `wasm` {expected} needs a plugin of world `{expected}`")]
    WrongWorld { found: World, expected: World },
}

/// Reads the component's top-level imports and exports.
pub fn inspect(bytes: &[u8]) -> Result<Inspection, InspectError> {
    let mut imports = Vec::new();
    let mut exports = Vec::new();
    // Nested modules and components report their own sections; only depth 1
    // is the plugin's outside.
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| InspectError::NotComponent(e.to_string()))?;
        match payload {
            Payload::Version { encoding, .. } => {
                if depth == 0 && encoding != Encoding::Component {
                    return Err(InspectError::NotComponent("the file is a core module".into()));
                }
                depth += 1;
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(r) if depth == 1 => {
                for i in r {
                    let i = i.map_err(|e| InspectError::NotComponent(e.to_string()))?;
                    imports.push(i.name.name.to_owned());
                }
            }
            Payload::ComponentExportSection(r) if depth == 1 => {
                for e in r {
                    let e = e.map_err(|e| InspectError::NotComponent(e.to_string()))?;
                    exports.push(e.name.name.to_owned());
                }
            }
            _ => {}
        }
    }
    if depth != 0 && imports.is_empty() && exports.is_empty() {
        return Err(InspectError::NotComponent("truncated file".into()));
    }
    Ok(Inspection { size: bytes.len(), imports, exports })
}

impl Inspection {
    /// The profcol world the plugin implements (and its WIT version).
    pub fn world(&self) -> Result<(World, String), InspectError> {
        for w in [World::Processor, World::Exporter] {
            let prefix = format!("{WIT_PACKAGE}/{}", w.export_interface());
            for e in &self.exports {
                match e.strip_prefix(&prefix) {
                    Some("") => return Ok((w, String::new())),
                    Some(v) if v.starts_with('@') => return Ok((w, v[1..].to_owned())),
                    _ => {}
                }
            }
        }
        Err(InspectError::NoWorld { exports: self.exports.clone() })
    }

    /// Checks that the plugin implements `expected` at this host's WIT version.
    pub fn check(&self, expected: World) -> Result<(), InspectError> {
        let (found, version) = self.world()?;
        if version != WIT_VERSION {
            return Err(InspectError::WitVersion {
                found: if version.is_empty() { "(unversioned)".into() } else { version },
            });
        }
        if found != expected {
            return Err(InspectError::WrongWorld { found, expected });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_modules_and_garbage_are_not_components() {
        // The smallest core module: magic + version 1.
        let core = b"\0asm\x01\0\0\0";
        assert!(matches!(inspect(core), Err(InspectError::NotComponent(_))));
        assert!(matches!(inspect(b"#!/bin/sh\necho hi\n"), Err(InspectError::NotComponent(_))));
    }

    #[test]
    fn world_and_version_come_from_the_export_names() {
        let i = |exports: &[&str]| Inspection {
            size: 0,
            imports: vec![],
            exports: exports.iter().map(|s| s.to_string()).collect(),
        };
        let p = i(&["profcol:plugin/process-batch@0.1.0"]);
        assert_eq!(p.world().unwrap(), (World::Processor, "0.1.0".into()));
        p.check(World::Processor).unwrap();
        assert!(matches!(p.check(World::Exporter), Err(InspectError::WrongWorld { .. })));
        let old = i(&["profcol:plugin/export-batch@0.2.0"]);
        assert!(matches!(old.check(World::Exporter), Err(InspectError::WitVersion { found }) if found == "0.2.0"));
        assert!(matches!(i(&["wasi:cli/run@0.2.0"]).world(), Err(InspectError::NoWorld { .. })));
    }
}
