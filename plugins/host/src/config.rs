//! The config sections of `wasm` processors and exporters, and the checks
//! `profcol validate` runs on them (the plugin file itself included).

use crate::inspect::{inspect, World};
use crate::plugin::PluginSettings;
use crate::sandbox::Allow;
use profcol_api::config::schema::DurationText;
use profcol_api::config::{checks, ConfigError, ConfigValue, Problems, Validate};
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
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

impl JsonSchema for ByteSize {
    fn schema_name() -> Cow<'static, str> {
        "ByteSize".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": ["string", "integer"],
            "pattern": "^\\s*[0-9]+\\s*(B|KiB|MiB|GiB)?\\s*$",
            "minimum": 0,
            "description": "A size: a number of bytes, or with a unit (B, KiB, MiB, GiB), e.g. 64MiB."
        })
    }
}

/// A size: bytes, or a number with a unit (B, KiB, MiB, GiB).
pub fn parse_size(s: &str) -> Result<u64, String> {
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// The batch continues unchanged.
    #[default]
    Pass,
    /// The batch is dropped (counted as dropped).
    Drop,
}

/// One exporter sink as configured: `{file: PATH}` or `{http: {endpoint, headers}}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SinkConfig {
    /// A file the host appends the outputs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// An endpoint the host POSTs each output to (with its content type).
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpSink {
    /// `http://` or `https://` URL.
    pub endpoint: String,
    /// Headers sent with every POST.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

macro_rules! plugin_config {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $field:ident : $ty:ty = $default:expr,)* }) => {
        $(#[$m])*
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields, default)]
        pub struct $name {
            /// The plugin's `.wasm` component (required).
            pub path: PathBuf,
            /// Any value; handed to the plugin's `init` as JSON (`null` when absent).
            pub config: serde_json::Value,
            /// Limit of one plugin call (a call still running is interrupted).
            #[serde(with = "humantime_serde")]
            #[schemars(with = "DurationText")]
            pub call_timeout: Duration,
            /// Linear memory one instance may grow to.
            pub memory_limit: ByteSize,
            /// Failures within `failure_window` that disable the plugin.
            pub max_failures: u32,
            /// The window failures are counted in, and how long the plugin stays disabled.
            #[serde(with = "humantime_serde")]
            #[schemars(with = "DurationText")]
            pub failure_window: Duration,
            /// Environment variables and directories the plugin may read (nothing else).
            pub allow: Allow,
            $($(#[$fm])* pub $field: $ty,)*
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    path: PathBuf::new(),
                    config: serde_json::Value::Null,
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
        /// Instances kept ready (a call finding none idle makes one).
        pool_size: usize = 1,
        /// When the plugin fails: `pass` forwards the batch unchanged, `drop` drops it.
        on_error: OnError = OnError::Pass,
        /// Times a batch the plugin answers `retryable` is handed to it again
        /// (after 10ms, doubling), before `on_error` applies (kind `retries_exhausted`).
        max_retries: u32 = 3,
    }
);

plugin_config!(
    /// `exporters: wasm/NAME` (plus the host's timeout / retry_on_failure / sending_queue).
    ExporterConfig {
        /// Instances kept ready; default: as many as exports run at once
        /// (`sending_queue.num_consumers`, 1 without a queue).
        pool_size: Option<usize> = None,
        /// Where the plugin's outputs go, by the sink name it gives them.
        sinks: BTreeMap<String, SinkConfig> = BTreeMap::new(),
    }
);

struct Common<'a> {
    path: &'a Path,
    config: &'a serde_json::Value,
    call_timeout: Duration,
    memory_limit: ByteSize,
    max_failures: u32,
    failure_window: Duration,
    allow: &'a Allow,
}

/// The key of the plugin file's hash in the effective config: a changed
/// file is a changed config, so a reload rebuilds the component.
pub const HASH_KEY: &str = "file_sha256";

/// The plugin's config as the JSON text `init` gets (`null` when absent,
/// which the SDK's `config` reads as the type's `Default`).
fn config_json(v: &serde_json::Value) -> String {
    v.to_string()
}

/// Checks the plugin file: there, a component, of `world`, at this host's WIT version.
fn check_file(path: &Path, world: World) -> Result<(), String> {
    if path.as_os_str().is_empty() {
        return Err(format!("is required: the plugin's .wasm file (a component of world `{world}`)"));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read plugin {}: {e}", path.display()))?;
    inspect(&bytes).and_then(|i| i.check(world)).map_err(|e| format!("{}: {e}", path.display()))
}

/// Checks the keys both components share, the plugin file included.
fn check_common(c: &Common<'_>, world: World, p: &mut Problems) {
    p.check("path", check_file(c.path, world));
    p.check("call_timeout", checks::positive(c.call_timeout, "a plugin call needs time to run"));
    if c.memory_limit.0 < 1 << 16 {
        p.add("memory_limit", "must be at least 64KiB (one WebAssembly page)");
    }
    if c.max_failures == 0 {
        p.add("max_failures", "must be at least 1 (default 5)");
    }
    p.check("failure_window", checks::positive(c.failure_window, "failures are counted within it"));
    for name in &c.allow.env {
        if name.is_empty() || name.contains('=') {
            p.add("allow.env", format!("{name:?} is not an environment variable name"));
        }
    }
    for (host, guest) in &c.allow.dirs {
        let at = format!("allow.dirs.{}", host.display());
        if !host.is_dir() {
            p.add(&at, "no such directory on the host");
        }
        if !guest.starts_with('/') {
            p.add(&at, format!("the path the plugin sees must be absolute (e.g. /data), not {guest:?}"));
        }
    }
}

/// The runtime settings of a checked config.
fn settings(c: &Common<'_>, component: &str, pool_size: usize, keep_idle: usize) -> PluginSettings {
    PluginSettings {
        component: component.to_owned(),
        config_json: config_json(c.config),
        call_timeout: c.call_timeout,
        memory_limit: c.memory_limit.0,
        pool_size,
        keep_idle,
        max_failures: c.max_failures,
        failure_window: c.failure_window,
        allow: c.allow.clone(),
        inherit_stdio: false,
    }
}

impl Validate for ProcessorConfig {
    fn validate(&self, p: &mut Problems) {
        if self.pool_size == 0 {
            p.add("pool_size", "must be at least 1 (default 1)");
        }
        check_common(&self.common(), World::Processor, p);
    }
}

impl ProcessorConfig {
    pub fn settings(&self, component: &str) -> PluginSettings {
        settings(&self.common(), component, self.pool_size, self.pool_size)
    }
}

impl Validate for ExporterConfig {
    fn validate(&self, p: &mut Problems) {
        if self.pool_size == Some(0) {
            p.add("pool_size", "must be at least 1 (default: the sending queue's num_consumers)");
        }
        if self.sinks.is_empty() {
            p.add("sinks", "is required: at least one sink, e.g. `sinks: {out: {file: /var/lib/profcol/out.txt}}`");
        }
        for (name, sink) in &self.sinks {
            match sink.sink() {
                Err(e) => p.add(&format!("sinks.{name}"), e),
                Ok(Sink::Http(h)) => p.check(&format!("sinks.{name}.http.endpoint"), checks::http_url(&h.endpoint)),
                Ok(Sink::File(f)) => p.check(&format!("sinks.{name}.file"), checks::writable_file(&f)),
            }
        }
        check_common(&self.common(), World::Exporter, p);
    }
}

impl ExporterConfig {
    /// The pool: `pool_size` instances, or as many as exports run at once
    /// (`consumers`, the sending queue's `num_consumers`).
    pub fn settings(&self, component: &str, consumers: usize) -> PluginSettings {
        let n = self.pool_size.unwrap_or(consumers).max(1);
        settings(&self.common(), component, n, n)
    }
}

/// [`profcol_api::component::Factory::check`] of both components: decode,
/// [`Validate`] (the plugin file included), then the effective config with
/// the plugin file's hash added.
pub fn check<C>(raw: &ConfigValue) -> Result<ConfigValue, Vec<ConfigError>>
where
    C: serde::de::DeserializeOwned + Serialize + Validate + PluginPath,
{
    let c: C = raw.decode().map_err(|e| vec![e])?;
    let mut problems = Problems::new();
    c.validate(&mut problems);
    if !problems.is_empty() {
        return Err(problems.into_errors());
    }
    let bytes = std::fs::read(c.plugin_path()).map_err(|e| {
        vec![ConfigError::new("path", format!("cannot read plugin {}: {e}", c.plugin_path().display()))]
    })?;
    let mut v = ConfigValue::encode(&c).map_err(|e| vec![e])?;
    v.extend(ConfigValue::from(serde_json::json!({ HASH_KEY: crate::cache::sha256_hex(&bytes) })));
    Ok(v)
}

/// The plugin file of a config section.
pub trait PluginPath {
    fn plugin_path(&self) -> &Path;
}

impl PluginPath for ProcessorConfig {
    fn plugin_path(&self) -> &Path {
        &self.path
    }
}

impl PluginPath for ExporterConfig {
    fn plugin_path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decode<C: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<C, ConfigError> {
        ConfigValue::from(v).decode()
    }

    fn problems(v: &dyn Validate) -> Vec<ConfigError> {
        let mut p = Problems::new();
        v.validate(&mut p);
        p.into_errors()
    }

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("512 KiB"), Ok(512 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("64MB").is_err());
        assert!(parse_size("lots").is_err());
        assert_eq!(serde_json::to_value(ByteSize(64 << 20)).unwrap(), json!("64MiB"));
        let c: ProcessorConfig = decode(json!({"memory_limit": "1GiB"})).unwrap();
        assert_eq!(c.memory_limit, ByteSize(1 << 30));
    }

    #[test]
    fn sinks_are_file_or_http() {
        let c: ExporterConfig = decode(json!({"sinks": {"out": {"file": "/tmp/x"}, "web": {"http": {"endpoint": "http://h/p", "headers": {"a": "b"}}}}})).unwrap();
        assert_eq!(c.sinks["out"].sink(), Ok(Sink::File("/tmp/x".into())));
        assert!(matches!(&c.sinks["web"].sink(), Ok(Sink::Http(h)) if h.headers["a"] == "b"));
        assert!(decode::<ExporterConfig>(json!({"sinks": {"x": {"ftp": "y"}}})).is_err());
        let both = ExporterConfig {
            sinks: [("x".to_owned(), SinkConfig { file: Some("/a".into()), http: c.sinks["web"].http.clone() })].into(),
            ..Default::default()
        };
        assert!(problems(&both).iter().any(|e| e.path == "sinks.x"), "{:?}", problems(&both));
    }

    #[test]
    fn missing_and_non_component_files_point_at_path() {
        let c = ProcessorConfig { path: "/nonexistent/p.wasm".into(), ..Default::default() };
        let e = &problems(&c)[0];
        assert_eq!(e.path, "path");
        assert!(e.message.contains("cannot read plugin"), "{e}");
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), b"\0asm\x01\0\0\0").unwrap();
        let e = &problems(&ProcessorConfig { path: f.path().into(), ..Default::default() })[0];
        assert_eq!(e.path, "path");
        assert!(e.message.contains("not a WebAssembly component"), "{e}");
        assert_eq!(problems(&ProcessorConfig::default())[0].path, "path");
    }

    #[test]
    fn every_problem_is_reported_at_its_key() {
        let c: ProcessorConfig = decode(json!({
            "call_timeout": "0s", "memory_limit": 1024, "max_failures": 0, "pool_size": 0,
            "allow": {"env": ["A=B"], "dirs": {"/nonexistent-dir": "data"}}
        }))
        .unwrap();
        let paths: Vec<_> = problems(&c).into_iter().map(|e| e.path).collect();
        assert_eq!(
            paths,
            [
                "pool_size",
                "path",
                "call_timeout",
                "memory_limit",
                "max_failures",
                "allow.env",
                "allow.dirs./nonexistent-dir",
                "allow.dirs./nonexistent-dir"
            ]
        );
    }
}
