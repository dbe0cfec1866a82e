//! The processor's config section.
//!
//! ```yaml
//! processors:
//!   kernel_symbols:
//!     kallsyms: /proc/kallsyms
//!     sysfs: /sys          # holds module/ and kernel/notes
//!     retain: 60s          # how long superseded generations and unloaded BPF functions stay resolvable
//!     uevents: true        # follow module loads (NETLINK_KOBJECT_UEVENT)
//!     bpf: true            # bpf syscall enumeration + PERF_RECORD_KSYMBOL
//!     reload: { debounce: 100ms, min_interval: 10s, max_backoff: 5m }
//! ```

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::reload::ReloadConfig;
use super::store::StoreConfig;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
#[schemars(rename = "KernelSymbolsConfig")]
pub struct Config {
    /// The kernel symbol table read at start and on reloads.
    pub kallsyms: PathBuf,
    /// sysfs root for module sections and build ids.
    pub sysfs: PathBuf,
    /// How long replaced symbol generations and unloaded BPF functions are kept for late samples.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub retain: Duration,
    /// Follow module loads and unloads through kernel uevents.
    pub uevents: bool,
    /// Name BPF programs (bpf syscall, PERF_RECORD_KSYMBOL events).
    pub bpf: bool,
    pub reload: ReloadConfig,
}

impl Default for Config {
    fn default() -> Self {
        let s = StoreConfig::default();
        Config {
            kallsyms: s.kallsyms,
            sysfs: s.sysfs,
            retain: s.retain,
            uevents: true,
            bpf: true,
            reload: ReloadConfig::default(),
        }
    }
}

impl profcol_api::config::Validate for Config {
    fn validate(&self, p: &mut profcol_api::config::Problems) {
        use profcol_api::config::checks::positive;
        p.check(
            "reload.min_interval",
            positive(self.reload.min_interval, "it rate-limits kallsyms reads; default 10s"),
        );
        if self.reload.max_backoff < self.reload.min_interval {
            p.add(
                "reload.max_backoff",
                format!(
                    "{:?} must be at least reload.min_interval ({:?}); raise it or lower min_interval",
                    self.reload.max_backoff, self.reload.min_interval
                ),
            );
        }
        p.check("kallsyms", profcol_api::config::checks::readable_file(&self.kallsyms));
    }
}

impl Config {
    /// What is wrong with the values serde accepted.
    pub fn store(&self) -> StoreConfig {
        StoreConfig {
            kallsyms: self.kallsyms.clone(),
            sysfs: self.sysfs.clone(),
            bpf_syscall: self.bpf,
            retain: self.retain,
        }
    }
}
