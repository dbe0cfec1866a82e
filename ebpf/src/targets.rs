//! The kernel side of `targets` (`target_*` in `cpu_sample.bpf.c`): a
//! verdict per cgroup v2 id, or per process where the executable decides,
//! written by the reader when the first sample of one asks for it.

/// `BPF_MAP_TYPE_LRU_HASH` `u64` cgroup v2 id → `u8` verdict.
pub const CGROUPS_MAP: &str = "target_cgroups";
/// `BPF_MAP_TYPE_LRU_HASH` `u32` tgid → `u8` verdict, for cgroups whose
/// verdict is [`BY_PROCESS`].
pub const PROCS_MAP: &str = "target_procs";
/// `BPF_MAP_TYPE_RINGBUF` of [`Ask`] records.
pub const ASKS_MAP: &str = "target_asks";
/// Entries of [`CGROUPS_MAP`] and [`PROCS_MAP`] when `targets` is set.
pub const CAPACITY: u32 = 16384;
/// `u32` global: nonzero when `targets` is configured.
pub const ENABLED_GLOBAL: &str = "cfg_targets";

/// Sampled.
pub const IN: u8 = 1;
/// Dropped before any stack walk.
pub const OUT: u8 = 2;
/// Asked about, no verdict yet (written by the program).
pub const ASKED: u8 = 3;
/// The executable decides: see [`PROCS_MAP`].
pub const BY_PROCESS: u8 = 4;

/// What a sample with no verdict asks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AskKind {
    /// A cgroup ([`CGROUPS_MAP`]).
    Cgroup,
    /// A process of a [`BY_PROCESS`] cgroup ([`PROCS_MAP`]).
    Process,
}

/// One `struct target_ask`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    pub cgroup_id: u64,
    /// The tgid of the sample that asked.
    pub pid: u32,
    pub kind: AskKind,
}

/// Size of a `struct target_ask`.
pub const ASK_SIZE: usize = 16;

impl Ask {
    /// Decodes a record; `None` when short or of an unknown kind.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let b = bytes.get(..ASK_SIZE)?;
        let kind = match u32::from_le_bytes(b[12..16].try_into().ok()?) {
            1 => AskKind::Cgroup,
            2 => AskKind::Process,
            _ => return None,
        };
        Some(Ask {
            cgroup_id: u64::from_le_bytes(b[..8].try_into().ok()?),
            pid: u32::from_le_bytes(b[8..12].try_into().ok()?),
            kind,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_parse_and_short_or_unknown_ones_do_not() {
        let mut v = Vec::new();
        v.extend(77u64.to_le_bytes());
        v.extend(42u32.to_le_bytes());
        v.extend(2u32.to_le_bytes());
        assert_eq!(Ask::parse(&v), Some(Ask { cgroup_id: 77, pid: 42, kind: AskKind::Process }));
        assert_eq!(Ask::parse(&v[..15]), None);
        v[12] = 9;
        assert_eq!(Ask::parse(&v), None);
    }
}
