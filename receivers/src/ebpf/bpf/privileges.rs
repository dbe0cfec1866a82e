//! Can this process sample the whole host? Checked before loading so a
//! missing privilege fails `start` with a message that says what to do.

use std::fmt;

pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// Effective capabilities and the perf sysctl, as read from /proc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Privileges {
    pub cap_eff: u64,
    pub perf_event_paranoid: Option<i32>,
}

impl Privileges {
    pub fn current() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let paranoid =
            std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").ok().and_then(|s| s.trim().parse().ok());
        Privileges { cap_eff: parse_cap_eff(&status).unwrap_or(0), perf_event_paranoid: paranoid }
    }

    pub fn has(&self, cap: u32) -> bool {
        self.cap_eff & (1u64 << cap) != 0
    }

    /// CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN which implies both.
    pub fn missing(&self) -> Vec<&'static str> {
        if self.has(CAP_SYS_ADMIN) {
            return Vec::new();
        }
        let mut m = Vec::new();
        if !self.has(CAP_BPF) {
            m.push("CAP_BPF");
        }
        if !self.has(CAP_PERFMON) {
            m.push("CAP_PERFMON");
        }
        m
    }

    /// Whether CPU-wide perf events are allowed: with CAP_PERFMON (or
    /// CAP_SYS_ADMIN) always; otherwise only if perf_event_paranoid <= 0.
    pub(crate) fn cpu_wide_perf_allowed(&self) -> bool {
        self.has(CAP_PERFMON) || self.has(CAP_SYS_ADMIN) || self.perf_event_paranoid.is_some_and(|p| p <= 0)
    }

    /// Fails with a message naming what is missing and how to grant it.
    pub fn check(&self) -> Result<(), PrivilegeError> {
        let missing = self.missing();
        if missing.is_empty() {
            return Ok(());
        }
        Err(PrivilegeError { missing, paranoid: self.perf_event_paranoid, perf_allowed: self.cpu_wide_perf_allowed() })
    }
}

/// `start` cannot sample: which capabilities are missing and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrivilegeError {
    pub missing: Vec<&'static str>,
    pub paranoid: Option<i32>,
    pub perf_allowed: bool,
}

impl fmt::Display for PrivilegeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the ebpf receiver needs CAP_BPF and CAP_PERFMON (or root) to load its BPF program and sample every CPU; \
             missing: {}. Run profcol as root, or grant the capabilities to the binary: \
             `sudo setcap cap_bpf,cap_perfmon,cap_sys_ptrace+ep /path/to/profcol` \
             (cap_sys_ptrace lets it read /proc/PID/maps of other users' processes), \
             or in a container add them with `--cap-add BPF --cap-add PERFMON`",
            self.missing.join(", ")
        )?;
        if !self.perf_allowed {
            if let Some(p) = self.paranoid {
                write!(
                    f,
                    ". Also, kernel.perf_event_paranoid is {p}, which forbids CPU-wide sampling without \
                     CAP_PERFMON (it would have to be -1 or 0: `sudo sysctl kernel.perf_event_paranoid=-1`)"
                )?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for PrivilegeError {}

/// Explains why opening a sampling perf event failed.
pub(crate) fn perf_open_hint(err: &std::io::Error, privs: &Privileges, frequency: u64) -> String {
    let max_rate = std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    match err.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => {
            let mut m = String::from("opening the sampling perf event was refused");
            if let Some(p) = privs.perf_event_paranoid {
                m.push_str(&format!(
                    ": kernel.perf_event_paranoid is {p}; CPU-wide sampling needs CAP_PERFMON (or root), \
                     or `sudo sysctl kernel.perf_event_paranoid=-1`"
                ));
            }
            m
        }
        Some(libc::EINVAL) if max_rate.is_some_and(|r| frequency > r) => format!(
            "sample_frequency {frequency} Hz exceeds kernel.perf_event_max_sample_rate ({}); lower it",
            max_rate.unwrap_or(0)
        ),
        Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::EOPNOTSUPP) => {
            "the kernel does not offer the software cpu-clock perf event here".to_owned()
        }
        Some(libc::EMFILE) | Some(libc::ENFILE) => {
            "out of file descriptors (one perf event is opened per CPU); raise `ulimit -n`".to_owned()
        }
        _ => "opening the sampling perf event failed".to_owned(),
    }
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    status.lines().find_map(|l| l.strip_prefix("CapEff:")).and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status() {
        assert_eq!(parse_cap_eff("Name:\tx\nCapEff:\t000001ffffffffff\n"), Some(0x1ffffffffff));
        assert_eq!(parse_cap_eff("CapEff: zz"), None);
        assert_eq!(parse_cap_eff(""), None);
    }

    #[test]
    fn root_and_caps_ok_and_messages() {
        let root = Privileges { cap_eff: 0x1ff_ffff_ffff, perf_event_paranoid: Some(2) };
        assert!(root.check().is_ok());
        let caps = Privileges { cap_eff: (1 << CAP_BPF) | (1 << CAP_PERFMON), perf_event_paranoid: Some(4) };
        assert!(caps.check().is_ok());
        let none = Privileges { cap_eff: 0, perf_event_paranoid: Some(2) };
        let e = none.check().unwrap_err().to_string();
        assert!(e.contains("missing: CAP_BPF, CAP_PERFMON"), "{e}");
        assert!(e.contains("setcap cap_bpf,cap_perfmon"), "{e}");
        assert!(e.contains("kernel.perf_event_paranoid is 2"), "{e}");
        let bpf_only = Privileges { cap_eff: 1 << CAP_BPF, perf_event_paranoid: Some(-1) };
        let e = bpf_only.check().unwrap_err().to_string();
        assert!(e.contains("missing: CAP_PERFMON") && !e.contains("paranoid"), "{e}");
    }
}
