//! The processor's config section.
//!
//! ```yaml
//! processors:
//!   user_symbols:
//!     max_wait: 200ms            # longest a batch waits for symbols still loading
//!     lines: true                # DWARF file:line and inlined frames
//!     debug_dirs: [/usr/lib/debug]  # .build-id/xx/rest.debug and .gnu_debuglink trees
//!     negative_ttl: 5m           # a binary without file or symbols is tried again after this
//!     cache: { max_bytes: 268435456 }  # loaded tables, least recently used evicted
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
    /// Directories of separate debug files, searched by build id (`DIR/.build-id/xx/rest.debug`) and by `.gnu_debuglink` (`DIR/<binary's directory>/NAME`).
    pub debug_dirs: Vec<PathBuf>,
    /// How long a binary whose file or symbols could not be found stays unnamed before it is tried again.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub negative_ttl: Duration,
    pub cache: CacheConfig,
}

/// The in-memory cache of loaded symbol tables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
#[schemars(rename = "UserSymbolsCacheConfig")]
pub struct CacheConfig {
    /// Bytes of loaded tables (symbols, debug sections, resolved addresses) kept; the least recently used table is evicted beyond it.
    pub max_bytes: u64,
}

/// 256 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig { max_bytes: DEFAULT_MAX_BYTES }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_wait: Duration::from_millis(200),
            lines: true,
            debug_dirs: vec![PathBuf::from("/usr/lib/debug")],
            negative_ttl: Duration::from_secs(300),
            cache: CacheConfig::default(),
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
