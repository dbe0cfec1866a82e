//! The processor's config section.
//!
//! ```yaml
//! processors:
//!   user_symbols:
//!     max_wait: 200ms            # longest a batch waits for symbols still loading
//!     lines: true                # DWARF file:line and inlined frames
//!     minidebuginfo: true        # .gnu_debugdata's symbols of stripped binaries
//!     go_pclntab: true           # Go's .gopclntab of stripped Go binaries
//!     debug_dirs: [/usr/lib/debug]  # .build-id/xx/rest.debug and .gnu_debuglink trees
//!     negative_ttl: 5m           # a binary without file or symbols is tried again after this
//!     cache:
//!       max_bytes: 268435456     # loaded tables, least recently used evicted
//!       dir: /var/cache/profcol/symbols  # optional: tables kept on disk across restarts
//!       dir_max_bytes: 1073741824        # files in dir, least recently used removed
//!     debuginfod: { urls: [], timeout: 5s, negative_ttl: 10m, max_download_bytes: 536870912 }
//! ```

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
#[schemars(rename = "UserSymbolsConfig")]
pub struct Config {
    /// Longest a batch waits for symbol tables still loading; then it goes on with those frames unnamed (counted as `pending`).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub max_wait: Duration,
    /// Read DWARF line tables: file and line for each frame, and inlined functions as extra lines of the location.
    pub lines: bool,
    /// Read MiniDebugInfo (`.gnu_debugdata`, an xz-compressed `.symtab`; Fedora and its kin) of a binary without `.symtab`: names of its static functions.
    pub minidebuginfo: bool,
    /// Read Go's `.gopclntab` of a Go binary without DWARF (`go build -ldflags='-s -w'`): function, file and line (inlined calls show the callee's line under the caller's name, as `go tool addr2line` does).
    pub go_pclntab: bool,
    /// Directories of separate debug files, searched by build id (`DIR/.build-id/xx/rest.debug`) and by `.gnu_debuglink` (`DIR/<binary's directory>/NAME`).
    pub debug_dirs: Vec<PathBuf>,
    /// How long a binary whose file or symbols could not be found stays unnamed before it is tried again.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub negative_ttl: Duration,
    pub cache: CacheConfig,
    pub debuginfod: DebuginfodConfig,
}

/// debuginfod servers asked for the debug file of a binary without DWARF
/// (or without symbols), by build id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
#[schemars(rename = "UserSymbolsDebuginfodConfig")]
pub struct DebuginfodConfig {
    /// Server base URLs, asked in order; empty: the `DEBUGINFOD_URLS` environment variable (space separated); neither: no requests.
    pub urls: Vec<String>,
    /// Limit of one request (a server that does not answer holds only the loader thread, this long per server).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub timeout: Duration,
    /// A build id no server has is asked for again only after this long.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub negative_ttl: Duration,
    /// Largest file (debug file or executable) downloaded, in bytes; a larger answer is abandoned and counted as an error.
    pub max_download_bytes: u64,
}

impl Default for DebuginfodConfig {
    fn default() -> Self {
        DebuginfodConfig {
            urls: Vec::new(),
            timeout: Duration::from_secs(5),
            negative_ttl: Duration::from_secs(600),
            max_download_bytes: 512 << 20,
        }
    }
}

/// The cache of loaded symbol tables, in memory and (optionally) on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
#[schemars(rename = "UserSymbolsCacheConfig")]
pub struct CacheConfig {
    /// Heap bytes of loaded tables (symbols, DWARF's unit index, recent lookups, the units they parsed and the maps of units read more than once, decompressed debug sections, resolved addresses) kept; the least recently used table is evicted beyond it. Debug sections read in place from a binary's mapping, and names read in place from `cache.dir` files, are page cache and do not count (`profcol_processor_user_symbols_cache_mapped_bytes` shows them).
    pub max_bytes: u64,
    /// Directory where each binary's function table (segments and front-coded names, not DWARF) is written once loaded and read back after a restart, so frames are named without parsing the binary again; its names are read in place from that file (mapped: page cache, not the agent's heap); created mode 0700, refused (with a warning) when others can write it. Compressed debug sections (a distribution's debug files) are decompressed into unlinked files here and mapped, so they are page cache rather than the agent's heap; they take disk space while their table is loaded, outside `dir_max_bytes`. Unset: no files, and those sections are decompressed into the heap.
    pub dir: Option<PathBuf>,
    /// Bytes of table files kept in `dir`; the least recently used files are removed beyond it.
    pub dir_max_bytes: u64,
}

/// 256 MiB.
pub(crate) const DEFAULT_MAX_BYTES: u64 = 256 << 20;
/// 1 GiB.
pub(crate) const DEFAULT_DIR_MAX_BYTES: u64 = 1 << 30;

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig { max_bytes: DEFAULT_MAX_BYTES, dir: None, dir_max_bytes: DEFAULT_DIR_MAX_BYTES }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_wait: Duration::from_millis(200),
            lines: true,
            minidebuginfo: true,
            go_pclntab: true,
            debug_dirs: vec![PathBuf::from("/usr/lib/debug")],
            negative_ttl: Duration::from_secs(300),
            cache: CacheConfig::default(),
            debuginfod: DebuginfodConfig::default(),
        }
    }
}

impl profcol_api::config::Validate for Config {
    fn validate(&self, p: &mut profcol_api::config::Problems) {
        if self.max_wait > Duration::from_secs(60) {
            p.add(
                "max_wait",
                format!("{:?} holds every batch that long; use at most 60s (default 200ms)", self.max_wait),
            );
        }
        if self.cache.max_bytes < 1 << 20 {
            p.add(
                "cache.max_bytes",
                format!(
                    "{} bytes cannot hold a symbol table; use at least 1048576 (default {DEFAULT_MAX_BYTES})",
                    self.cache.max_bytes
                ),
            );
        }
        if let Some(dir) = &self.cache.dir {
            if !dir.is_absolute() {
                p.add(
                    "cache.dir",
                    format!(
                        "{} is relative; give an absolute directory such as /var/cache/profcol/symbols",
                        dir.display()
                    ),
                );
            }
        }
        if self.cache.dir_max_bytes < 1 << 20 {
            p.add(
                "cache.dir_max_bytes",
                format!(
                    "{} bytes cannot hold a table file; use at least 1048576 (default {DEFAULT_DIR_MAX_BYTES})",
                    self.cache.dir_max_bytes
                ),
            );
        }
        for (i, u) in self.debuginfod.urls.iter().enumerate() {
            let ok = (u.starts_with("http://") || u.starts_with("https://")) && reqwest::Url::parse(u).is_ok();
            if !ok {
                p.add(
                    &format!("debuginfod.urls[{i}]"),
                    format!("{u:?} is not an http(s) URL; give the server's base, e.g. https://debuginfod.debian.net"),
                );
            }
        }
        if self.debuginfod.timeout.is_zero() {
            p.add("debuginfod.timeout", "0 would fail every request; use a positive duration (default 5s)");
        }
        for (i, d) in self.debug_dirs.iter().enumerate() {
            if !d.is_absolute() {
                p.add(
                    &format!("debug_dirs[{i}]"),
                    format!("{} is relative; give an absolute directory such as /usr/lib/debug", d.display()),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profcol_api::config::{Problems, Validate};

    fn problems(cfg: &Config) -> Vec<String> {
        let mut p = Problems::new();
        cfg.validate(&mut p);
        p.into_errors().into_iter().map(|e| e.path).collect()
    }

    #[test]
    fn cache_dir_keys_are_checked() {
        assert!(problems(&Config::default()).is_empty());
        let json = r#"{"cache": {"dir": "/var/cache/profcol/symbols", "dir_max_bytes": 2097152}}"#;
        let cfg: Config = serde_json::from_str(json).unwrap();
        assert_eq!(cfg.cache.dir.as_deref(), Some(std::path::Path::new("/var/cache/profcol/symbols")));
        assert_eq!(cfg.cache.max_bytes, DEFAULT_MAX_BYTES, "unset keys keep their defaults");
        assert!(problems(&cfg).is_empty());
        let bad = Config {
            cache: CacheConfig { dir: Some("relative/dir".into()), dir_max_bytes: 1000, ..Default::default() },
            ..Default::default()
        };
        assert_eq!(problems(&bad), ["cache.dir", "cache.dir_max_bytes"]);
    }
}
