//! Answers the BPF program's asks: reads what the node says of the asking
//! cgroup (or process) and writes the verdict into the program's maps.

use super::{Facts, Targets, Verdict};
use crate::ebpf::process::procfs;
use aya::maps::{HashMap as BpfHashMap, MapData, RingBuf};
use profcol_ebpf::targets::{Ask, AskKind};

/// The program's `target_*` maps.
pub(crate) struct TargetMaps {
    pub cgroups: BpfHashMap<MapData, u64, u8>,
    pub procs: BpfHashMap<MapData, u32, u8>,
    pub asks: RingBuf<MapData>,
}

/// The pod a container belongs to, as the container runtime's files say.
#[derive(Clone, Debug, Default)]
pub(crate) struct PodFacts {
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub container: Option<String>,
}

/// What answering the asks of one read did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Answered {
    pub cgroups: u64,
    pub processes: u64,
    /// Asks whose process was gone before it could be read: the entry is
    /// deleted, so the next sample of the cgroup asks again.
    pub unanswered: u64,
    pub malformed: u64,
}

impl Targets {
    /// Answers every ask in the ring. `pod_of` gives the pod of a container
    /// id (read once per container by the process table).
    pub(crate) fn answer_asks(
        &self,
        maps: &mut TargetMaps,
        pod_of: &mut dyn FnMut(&str) -> Option<PodFacts>,
    ) -> Answered {
        let mut done = Answered::default();
        let mut asks = Vec::new();
        while let Some(item) = maps.asks.next() {
            match Ask::parse(&item) {
                Some(a) => asks.push(a),
                None => done.malformed += 1,
            }
        }
        for ask in asks {
            let verdict = self.judge(ask, pod_of);
            let written = match (ask.kind, verdict) {
                (AskKind::Cgroup, Some(v)) => {
                    done.cgroups += 1;
                    maps.cgroups.insert(&ask.cgroup_id, &v.map_value(), 0)
                }
                (AskKind::Process, Some(v)) => {
                    done.processes += 1;
                    maps.procs.insert(&ask.pid, &v.map_value(), 0)
                }
                (AskKind::Cgroup, None) => {
                    done.unanswered += 1;
                    maps.cgroups.remove(&ask.cgroup_id)
                }
                (AskKind::Process, None) => {
                    done.unanswered += 1;
                    maps.procs.remove(&ask.pid)
                }
            };
            if let Err(e) = written {
                tracing::debug!("ebpf receiver: targets: writing the verdict for {ask:?}: {e}");
            }
        }
        done
    }

    /// The verdict for an ask, from the asking process's /proc entry;
    /// `None` when it is gone (or moved to another cgroup meanwhile).
    fn judge(&self, ask: Ask, pod_of: &mut dyn FnMut(&str) -> Option<PodFacts>) -> Option<Verdict> {
        let cgroup = procfs::read_cgroup(ask.pid)?;
        // cgroup v2: the "0::" line (the only one on a v2-only host).
        let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
        // The process may have moved since it asked: the path must be the
        // asking cgroup's (its id is the directory's inode number).
        if let Some(root) = &self.cgroup2_root {
            use std::os::unix::fs::MetadataExt;
            if std::fs::metadata(root.join(path.trim_start_matches('/'))).ok()?.ino() != ask.cgroup_id {
                return None;
            }
        }
        let container_id = procfs::container_id(&cgroup);
        let pod = container_id.as_deref().and_then(&mut *pod_of).unwrap_or_default();
        let exe = match ask.kind {
            AskKind::Cgroup => None,
            AskKind::Process => Some(std::fs::read_link(format!("/proc/{}/exe", ask.pid)).ok()?),
        };
        let exe = exe.as_ref().map(|p| p.to_string_lossy());
        let facts = Facts {
            cgroup_path: path,
            container_id: container_id.as_deref(),
            k8s_namespace: pod.namespace.as_deref(),
            k8s_pod: pod.pod.as_deref(),
            k8s_container: pod.container.as_deref(),
            executable: exe.as_deref(),
        };
        let v = self.verdict(&facts);
        // A process in a ByProcess cgroup always has an executable here.
        Some(if ask.kind == AskKind::Process && v == Verdict::ByProcess { Verdict::Out } else { v })
    }
}
