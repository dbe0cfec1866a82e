//! What a plugin file is, read from its component structure without
//! compiling it: whether it is a component at all, which profcol world it
//! implements, for which WIT version, and its imports and exports. Used by
//! `profcol validate` (cheap: no compile) and `profcol plugin inspect`.

use std::fmt;
use wasmparser::component_types::{ComponentDefinedType, ComponentEntityType, ComponentValType};
use wasmparser::types::Types;
use wasmparser::{Encoding, Parser, Payload, ValidPayload, Validator};

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
    /// The functions of that interface and their types as `plugins/wit/plugin.wit`
    /// declares them (parameter names aside: they are not part of the check).
    fn functions(self) -> &'static [(&'static str, &'static str)] {
        const INIT: &str = "func(string) -> result<_, string>";
        const PROCESS: &str = concat!(
            "func(list<u8>) -> result<option<list<u8>>, ",
            "record { kind: enum { retryable, permanent, drop }, message: string }>"
        );
        const EXPORT: &str = concat!(
            "func(list<u8>) -> result<list<record { sink: string, content-type: string, data: list<u8> }>, ",
            "record { kind: enum { retryable, permanent, drop }, message: string }>"
        );
        match self {
            World::Processor => &[("init", INIT), ("process", PROCESS)],
            World::Exporter => &[("init", INIT), ("export", EXPORT)],
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
    /// The functions of each exported instance, with their types in WIT
    /// notation (`func(list<u8>) -> ...`); empty when the component's types
    /// could not be read.
    pub functions: Vec<(String, String, String)>,
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
    #[error("its export `{function}` of `{interface}` has type `{found}`, but {WIT_PACKAGE}@{WIT_VERSION} declares `{expected}`: rebuild the plugin against plugins/wit/plugin.wit")]
    WrongSignature { interface: String, function: String, found: String, expected: String },
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
    let functions = component_types(bytes).map(|t| exported_functions(&t, &exports)).unwrap_or_default();
    Ok(Inspection { size: bytes.len(), imports, exports, functions })
}

/// The type information of the top-level component. Function bodies are
/// not validated (wasmtime does that when it compiles): reading the types is
/// cheap even for a large plugin.
fn component_types(bytes: &[u8]) -> Option<Types> {
    let mut validator = Validator::new();
    let mut last = None;
    for payload in Parser::new(0).parse_all(bytes) {
        if let ValidPayload::End(types) = validator.payload(&payload.ok()?).ok()? {
            last = Some(types);
        }
    }
    last
}

/// Every function of every exported instance, with its type.
fn exported_functions(types: &Types, exports: &[String]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for name in exports {
        let Some(ComponentEntityType::Instance(id)) = types.component_item_for_export(name).map(|i| i.ty) else {
            continue;
        };
        for (f, item) in &types[id].exports {
            if let ComponentEntityType::Func(fid) = item.ty {
                let func = &types[fid];
                let params: Vec<String> = func.params.iter().map(|(_, t)| wit_type(types, *t)).collect();
                let mut sig = format!("func({})", params.join(", "));
                if let Some(r) = func.result {
                    sig.push_str(" -> ");
                    sig.push_str(&wit_type(types, r));
                }
                out.push((name.clone(), f.clone(), sig));
            }
        }
    }
    out
}

/// A value type in WIT notation, named types written out structurally.
fn wit_type(types: &Types, t: ComponentValType) -> String {
    let opt = |t: Option<ComponentValType>| t.map_or("_".to_owned(), |t| wit_type(types, t));
    let id = match t {
        ComponentValType::Primitive(p) => return format!("{p:?}").to_lowercase(),
        ComponentValType::Type(id) => id,
    };
    match &types[id] {
        ComponentDefinedType::Primitive(p) => format!("{p:?}").to_lowercase(),
        ComponentDefinedType::Record(r) => {
            let fields: Vec<String> = r.fields.iter().map(|(n, t)| format!("{n}: {}", wit_type(types, *t))).collect();
            format!("record {{ {} }}", fields.join(", "))
        }
        ComponentDefinedType::Variant(v) => {
            let cases: Vec<String> = v
                .cases
                .iter()
                .map(|(n, c)| match c.ty {
                    Some(t) => format!("{n}({})", wit_type(types, t)),
                    None => n.to_string(),
                })
                .collect();
            format!("variant {{ {} }}", cases.join(", "))
        }
        ComponentDefinedType::List { element, .. } => format!("list<{}>", wit_type(types, *element)),
        ComponentDefinedType::Tuple(t) => {
            let ts: Vec<String> = t.types.iter().map(|t| wit_type(types, *t)).collect();
            format!("tuple<{}>", ts.join(", "))
        }
        ComponentDefinedType::Flags(f) => {
            format!("flags {{ {} }}", f.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", "))
        }
        ComponentDefinedType::Enum(e) => {
            format!("enum {{ {} }}", e.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", "))
        }
        ComponentDefinedType::Option { ty, .. } => format!("option<{}>", wit_type(types, *ty)),
        ComponentDefinedType::Result { ok: None, err: None, .. } => "result".into(),
        ComponentDefinedType::Result { ok, err, .. } => format!("result<{}, {}>", opt(*ok), opt(*err)),
        other => {
            let d = format!("{other:?}");
            d.split(|c: char| !c.is_alphanumeric()).next().unwrap_or("?").to_lowercase()
        }
    }
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
        self.check_functions(expected)
    }

    /// Checks the types of the world's functions (when they could be read).
    fn check_functions(&self, world: World) -> Result<(), InspectError> {
        let interface = format!("{WIT_PACKAGE}/{}@{WIT_VERSION}", world.export_interface());
        if self.functions.is_empty() {
            return Ok(()); // types unread: the start's link checks them
        }
        let found: Vec<_> = self.functions.iter().filter(|(i, _, _)| *i == interface).collect();
        for (function, expected) in world.functions() {
            let sig = found.iter().find(|(_, f, _)| f == function).map(|(_, _, s)| s.as_str());
            if sig != Some(*expected) {
                return Err(InspectError::WrongSignature {
                    interface,
                    function: (*function).to_owned(),
                    found: sig.unwrap_or("(missing)").to_owned(),
                    expected: (*expected).to_owned(),
                });
            }
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
            functions: vec![],
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
