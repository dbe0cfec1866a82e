//! The processor's config section.
//!
//! ```yaml
//! processors:
//!   kernel_symbols:
//!     kallsyms: /proc/kallsyms
//!     sysfs: /sys          # holds module/ and kernel/notes
//!     retain: 60s          # how long superseded generations stay resolvable
//!     uevents: true        # follow module loads (NETLINK_KOBJECT_UEVENT)
//!     bpf: true            # bpf syscall enumeration + PERF_RECORD_KSYMBOL
//!     reload: { debounce: 100ms, min_interval: 10s, max_backoff: 5m }
//! ```

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::reload::ReloadConfig;
use super::store::StoreConfig;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub kallsyms: PathBuf,
    pub sysfs: PathBuf,
    #[serde(with = "humantime_serde")]
    pub retain: Duration,
    pub uevents: bool,
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

impl Config {
    /// What is wrong with the values serde accepted.
    pub fn validate(&self) -> Result<(), String> {
        if self.reload.min_interval.is_zero() {
            return Err("reload.min_interval must be above 0 (it rate-limits kallsyms reads; default 10s)".into());
        }
        if self.reload.max_backoff < self.reload.min_interval {
            return Err(format!(
                "reload.max_backoff ({:?}) must be at least reload.min_interval ({:?})",
                self.reload.max_backoff, self.reload.min_interval
            ));
        }
        Ok(())
    }

    pub fn store(&self) -> StoreConfig {
        StoreConfig {
            kallsyms: self.kallsyms.clone(),
            sysfs: self.sysfs.clone(),
            bpf_syscall: self.bpf,
            retain: self.retain,
        }
    }
}
