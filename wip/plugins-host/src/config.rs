//! The config sections of `wasm` processors and exporters, and the checks
//! `profcol validate` runs on them (the plugin file itself included).

use crate::inspect::{inspect, World};
use crate::plugin::PluginSettings;
use crate::sandbox::Allow;
use profcol_api::config::ConfigError;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A size in bytes, written as a number of bytes or with a unit (`64MiB`, `512KiB`, `1GiB`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let b = self.0;
        // The largest unit that divides the size exactly.
        for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
            if b >= 1 << shift && (b >> shift) << shift == b {
                return s.serialize_str(&format!("{}{unit}", b >> shift));
            }
        }
        s.serialize_u64(b)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => parse_size(&s).map(ByteSize).map_err(serde::de::Error::custom),
        }
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 =
        num.parse().map_err(|_| format!("invalid size {s:?}: expected e.g. 64MiB, 512KiB or a number of bytes"))?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        _ => return Err(format!("invalid size {s:?}: the unit must be B, KiB, MiB or GiB")),
    };
    n.checked_mul(1 << shift).ok_or_else(|| format!("size {s:?} is too large"))
}

/// What the processor does with a batch when the plugin fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// The batch continues unchanged.
    #[default]
    Pass,
    /// The batch is dropped (counted as dropped).
    Drop,
}

/// One exporter sink as configured: `{file: PATH}` or `{http: {endpoint, headers}}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SinkConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSink>,
}

/// One exporter sink: a file the host appends to, or an HTTP endpoint it POSTs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sink {
    File(PathBuf),
    Http(HttpSink),
}

impl SinkConfig {
    pub fn sink(&self) -> Result<Sink, String> {
        match (&self.file, &self.http) {
            (Some(f), None) => Ok(Sink::File(f.clone())),
            (None, Some(h)) => Ok(Sink::Http(h.clone())),
            _ => Err("a sink is either {file: PATH} or {http: {endpoint: URL, headers: {..}}}".into()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSink {
    pub endpoint: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

macro_rules! plugin_config {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $field:ident : $ty:ty = $default:expr,)* }) => {
        $(#[$m])*
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct $name {
            /// The plugin's `.wasm` component.
            pub path: PathBuf,
            /// Any YAML; handed to the plugin's `init` as JSON (`{}` when absent).
            pub config: serde_yaml::Value,
            /// Limit of one plugin call.
            #[serde(with = "humantime_serde")]
            pub call_timeout: Duration,
            /// Linear memory one instance may grow to.
            pub memory_limit: ByteSize,
            /// Failures within `failure_window` that disable the plugin.
            pub max_failures: u32,
            /// The window failures are counted in, and how long the plugin stays disabled.
            #[serde(with = "humantime_serde")]
            pub failure_window: Duration,
            /// Environment variables and directories the plugin may read.
            pub allow: Allow,
            $($(#[$fm])* pub $field: $ty,)*
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    path: PathBuf::new(),
                    config: serde_yaml::Value::Null,
                    call_timeout: Duration::from_millis(100),
                    memory_limit: ByteSize(64 << 20),
                    max_failures: 5,
                    failure_window: Duration::from_secs(60),
                    allow: Allow::default(),
                    $($field: $default,)*
                }
            }
        }

        impl $name {
            fn common(&self) -> Common<'_> {
                Common {
                    path: &self.path,
                    config: &self.config,
                    call_timeout: self.call_timeout,
                    memory_limit: self.memory_limit,
                    max_failures: self.max_failures,
                    failure_window: self.failure_window,
                    allow: &self.allow,
                }
            }
        }
    };
}

plugin_config!(
    /// `processors: wasm/NAME`.
    ProcessorConfig {
        /// Instances kept ready.
        pool_size: usize = 1,
        on_error: OnError = OnError::Pass,
    }
);

plugin_config!(
    /// `exporters: wasm/NAME` (plus the host's timeout / retry_on_failure / sending_queue).
    ExporterConfig {
        /// Instances kept ready; default: as many as exports run at once (`num_consumers`).
        pool_size: Option<usize> = None,
        /// Where the plugin's outputs go, by the sink name it gives them.
        sinks: BTreeMap<String, SinkConfig> = BTreeMap::new(),
    }
);

struct Common<'a> {
    path: &'a Path,
    config: &'a serde_yaml::Value,
    call_timeout: Duration,
    memory_limit: ByteSize,
    max_failures: u32,
    failure_window: Duration,
    allow: &'a Allow,
}

/// The key of the plugin file's hash in the effective config: a changed
/// file is a changed config, so a reload rebuilds the component.
pub const HASH_KEY: &str = "file_sha256";

/// The plugin's config as the JSON text `init` gets.
fn config_json(v: &serde_yaml::Value) -> Result<String, ConfigError> {
    match v {
        serde_yaml::Value::Null => Ok("{}".into()),
        v => {
            serde_json::to_string(v).map_err(|e| ConfigError::new("config", format!("cannot be turned into JSON: {e}")))
        }
    }
}

/// Checks the shared keys and the plugin file; returns the file's SHA-256.
fn check_common(c: &Common<'_>, world: World) -> Result<String, ConfigError> {
    if c.path.as_os_str().is_empty() {
        return Err(ConfigError::new(
            "path",
            format!("required: the plugin's .wasm file (a component of world `{world}`)"),
        ));
    }
    let bytes = std::fs::read(c.path)
        .map_err(|e| ConfigError::new("path", format!("cannot read plugin {}: {e}", c.path.display())))?;
    inspect(&bytes)
        .and_then(|i| i.check(world))
        .map_err(|e| ConfigError::new("path", format!("{}: {e}", c.path.display())))?;
    config_json(c.config)?;
    if c.call_timeout.is_zero() {
        return Err(ConfigError::new("call_timeout", "must be more than 0"));
    }
    if c.memory_limit.0 < 1 << 16 {
        return Err(ConfigError::new("memory_limit", "must be at least 64KiB (one WebAssembly page)"));
    }
    if c.max_failures == 0 {
        return Err(ConfigError::new("max_failures", "must be at least 1"));
    }
    for name in &c.allow.env {
        if name.is_empty() || name.contains('=') {
            return Err(ConfigError::new("allow.env", format!("{name:?} is not an environment variable name")));
        }
    }
    for (host, guest) in &c.allow.dirs {
        if !host.is_dir() {
            return Err(ConfigError::new(format!("allow.dirs.{}", host.display()), "no such directory on the host"));
        }
        if guest.is_empty() {
            return Err(ConfigError::new(
                format!("allow.dirs.{}", host.display()),
                "the path the plugin sees must not be empty",
            ));
        }
    }
    Ok(crate::cache::sha256_hex(&bytes))
}

/// The runtime settings of a checked config.
fn settings(
    c: &Common<'_>,
    component: &str,
    pool_size: usize,
    keep_idle: usize,
) -> Result<PluginSettings, ConfigError> {
    Ok(PluginSettings {
        component: component.to_owned(),
        config_json: config_json(c.config)?,
        call_timeout: c.call_timeout,
        memory_limit: c.memory_limit.0,
        pool_size,
        keep_idle,
        max_failures: c.max_failures,
        failure_window: c.failure_window,
        allow: c.allow.clone(),
        inherit_stdio: false,
    })
}

impl ProcessorConfig {
    pub fn check(&self) -> Result<String, ConfigError> {
        if self.pool_size == 0 {
            return Err(ConfigError::new("pool_size", "must be at least 1"));
        }
        check_common(&self.common(), World::Processor)
    }
    pub fn settings(&self, component: &str) -> Result<PluginSettings, ConfigError> {
        settings(&self.common(), component, self.pool_size, self.pool_size)
    }
}

impl ExporterConfig {
    pub fn check(&self) -> Result<String, ConfigError> {
        if self.pool_size == Some(0) {
            return Err(ConfigError::new("pool_size", "must be at least 1"));
        }
        if self.sinks.is_empty() {
            return Err(ConfigError::new(
                "sinks",
                "required: at least one sink, e.g. `sinks: {out: {file: /var/lib/profcol/out.txt}}`",
            ));
        }
        for (name, sink) in &self.sinks {
            if let Sink::Http(h) = sink.sink().map_err(|e| ConfigError::new(format!("sinks.{name}"), e))? {
                if !(h.endpoint.starts_with("http://") || h.endpoint.starts_with("https://")) {
                    return Err(ConfigError::new(
                        format!("sinks.{name}.http.endpoint"),
                        "must be an http:// or https:// URL",
                    ));
                }
            }
        }
        check_common(&self.common(), World::Exporter)
    }
    /// Without `pool_size`, one instance is made at start and the pool grows
    /// to the number of exports that run at once (the sending queue's
    /// `num_consumers`), keeping them all.
    pub fn settings(&self, component: &str) -> Result<PluginSettings, ConfigError> {
        match self.pool_size {
            Some(n) => settings(&self.common(), component, n, n),
            None => settings(&self.common(), component, 1, usize::MAX),
        }
    }
}

/// A factory's effective config: the typed section with defaults filled, plus
/// the plugin file's hash.
pub fn effective<C: Serialize>(c: &C, sha256: String) -> Result<serde_yaml::Value, ConfigError> {
    let mut v = profcol_api::config::encode(c)?;
    if let serde_yaml::Value::Mapping(m) = &mut v {
        m.insert(HASH_KEY.into(), sha256.into());
    }
    Ok(v)
}

/// An effective config without the hash, to decode as the typed section.
pub fn without_hash(v: &serde_yaml::Value) -> serde_yaml::Value {
    let mut v = v.clone();
    if let serde_yaml::Value::Mapping(m) = &mut v {
        m.remove(HASH_KEY);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("512 KiB"), Ok(512 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("64MB").is_err());
        assert!(parse_size("lots").is_err());
        assert_eq!(serde_yaml::to_string(&ByteSize(64 << 20)).unwrap().trim(), "64MiB");
        let c: ProcessorConfig =
            profcol_api::config::decode(&serde_yaml::from_str("memory_limit: 1GiB").unwrap()).unwrap();
        assert_eq!(c.memory_limit, ByteSize(1 << 30));
    }

    #[test]
    fn sinks_are_file_or_http() {
        let c: ExporterConfig = profcol_api::config::decode(
            &serde_yaml::from_str(
                "sinks: {out: {file: /tmp/x}, web: {http: {endpoint: 'http://h/p', headers: {a: b}}}}",
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(c.sinks["out"].sink(), Ok(Sink::File("/tmp/x".into())));
        assert!(matches!(&c.sinks["web"].sink(), Ok(Sink::Http(h)) if h.headers["a"] == "b"));
        assert!(profcol_api::config::decode::<ExporterConfig>(&serde_yaml::from_str("sinks: {x: {ftp: y}}").unwrap())
            .is_err());
        let both = ExporterConfig {
            sinks: [("x".to_owned(), SinkConfig { file: Some("/a".into()), http: c.sinks["web"].http.clone() })].into(),
            ..Default::default()
        };
        assert_eq!(both.check().unwrap_err().path, "sinks.x");
    }

    #[test]
    fn missing_and_non_component_files_point_at_path() {
        let c = ProcessorConfig { path: "/nonexistent/p.wasm".into(), ..Default::default() };
        let e = c.check().unwrap_err();
        assert_eq!(e.path, "path");
        assert!(e.message.contains("cannot read plugin"), "{e}");
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), b"\0asm\x01\0\0\0").unwrap();
        let e = ProcessorConfig { path: f.path().into(), ..Default::default() }.check().unwrap_err();
        assert_eq!(e.path, "path");
        assert!(e.message.contains("not a WebAssembly component"), "{e}");
        assert_eq!(ProcessorConfig::default().check().unwrap_err().path, "path");
    }
}
