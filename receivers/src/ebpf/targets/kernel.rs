//! Answers the BPF program's asks: reads what the node says of the asking
//! cgroup (or process) and writes the verdict into the program's maps.

use super::{Facts, Targets, Verdict};
use crate::ebpf::process::containers::Container;
use crate::ebpf::process::procfs;
use aya::maps::{HashMap as BpfHashMap, MapData, RingBuf};
use profcol_ebpf::targets::{Ask, AskKind};
use std::sync::Arc;

/// The program's `target_*` maps.
pub(crate) struct TargetMaps {
    pub cgroups: BpfHashMap<MapData, u64, u8>,
    pub procs: BpfHashMap<MapData, u32, u8>,
    pub asks: RingBuf<MapData>,
}

/// What answering the asks of one read did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Answered {
    pub cgroups: u64,
    pub processes: u64,
    /// Asks that could not be judged (the process gone, the cgroup not
    /// found): asked again after [`ASK_AGAIN_AFTER`].
    pub unanswered: u64,
    pub malformed: u64,
}

/// How long a cgroup (or process) that could not be judged stays asked
/// (its samples dropped) before its next sample asks again: an ask costs
/// a wake-up and, at worst, a walk of the cgroup tree.
pub(crate) const ASK_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

impl Targets {
    /// Answers every ask in the ring. `container` tells who a container id
    /// is (the process table's one cache of containers).
    pub(crate) fn answer_asks(
        &mut self,
        maps: &mut TargetMaps,
        container: &mut dyn FnMut(&str) -> Option<Arc<Container>>,
        now: std::time::Instant,
    ) -> Answered {
        let mut done = Answered::default();
        // Unjudged asks due again: their entries go, the next sample asks.
        while self.unjudged.front().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, ask)) = self.unjudged.pop_front() {
                let _ = match ask.kind {
                    AskKind::Cgroup => maps.cgroups.remove(&ask.cgroup_id),
                    AskKind::Process => maps.procs.remove(&ask.pid),
                };
            }
        }
        let mut asks = Vec::new();
        while let Some(item) = maps.asks.next() {
            match Ask::parse(&item) {
                Some(a) => asks.push(a),
                None => done.malformed += 1,
            }
        }
        for ask in asks {
            let verdict = self.judge(ask, container);
            let written = match (ask.kind, verdict) {
                (AskKind::Cgroup, Some(v)) => {
                    done.cgroups += 1;
                    maps.cgroups.insert(&ask.cgroup_id, &v.map_value(), 0)
                }
                (AskKind::Process, Some(v)) => {
                    done.processes += 1;
                    maps.procs.insert(&ask.pid, &v.map_value(), 0)
                }
                (_, None) => {
                    // Left asked for a while (bounded: one per asked entry).
                    done.unanswered += 1;
                    if self.unjudged.len() < profcol_ebpf::targets::CAPACITY as usize * 2 {
                        self.unjudged.push_back((now + ASK_AGAIN_AFTER, ask));
                    }
                    Ok(())
                }
            };
            if let Err(e) = written {
                tracing::debug!("ebpf receiver: targets: writing the verdict for {ask:?}: {e}");
            }
        }
        done
    }

    /// The verdict for an ask; `None` when the asking cgroup cannot be
    /// found (the process gone, the cgroup removed).
    fn judge(&self, ask: Ask, container: &mut dyn FnMut(&str) -> Option<Arc<Container>>) -> Option<Verdict> {
        let path = self.cgroup_path(ask)?;
        // The container id as /proc/PID/cgroup gives it, from the path.
        let container_id = procfs::container_id(&format!("0::{path}"));
        let c = container_id.as_deref().and_then(container);
        let exe = match ask.kind {
            AskKind::Cgroup => None,
            AskKind::Process => Some(std::fs::read_link(format!("/proc/{}/exe", ask.pid)).ok()?),
        };
        let exe = exe.as_ref().map(|p| p.to_string_lossy());
        let facts = Facts {
            cgroup_path: &path,
            container_id: container_id.as_deref(),
            k8s_namespace: c.as_ref().and_then(|c| c.namespace.as_deref()),
            k8s_pod: c.as_ref().and_then(|c| c.pod_name.as_deref()),
            k8s_container: c.as_ref().and_then(|c| c.container_name.as_deref()),
            executable: exe.as_deref(),
        };
        let v = self.verdict(&facts);
        // A process in a ByProcess cgroup always has an executable here.
        Some(if ask.kind == AskKind::Process && v == Verdict::ByProcess { Verdict::Out } else { v })
    }

    /// The path of the asking cgroup (its id is its directory's inode
    /// number in the cgroup2 tree): the asking process's, when it is still
    /// there, else found in the host's tree (an agent in its own cgroup
    /// namespace sees other pods' paths relative to its own).
    fn cgroup_path(&self, ask: Ask) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        let from_proc = procfs::read_cgroup(ask.pid).and_then(|c| {
            // cgroup v2: the "0::" line (the only one on a v2-only host).
            c.lines().find_map(|l| l.strip_prefix("0::")).map(str::to_owned)
        });
        let Some(root) = &self.cgroup2_root else {
            return from_proc;
        };
        if let Some(p) = from_proc {
            let dir = root.join(p.trim_start_matches('/'));
            if std::fs::metadata(dir).is_ok_and(|m| m.ino() == ask.cgroup_id) {
                return Some(p);
            }
        }
        find_cgroup(root, ask.cgroup_id)
    }
}

/// Directories of the cgroup tree looked at at most in one search.
const MAX_CGROUP_DIRS: usize = 65_536;

/// The path (from `root`) of the cgroup whose directory has inode `id`.
fn find_cgroup(root: &std::path::Path, id: u64) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata(root).ok()?.ino() == id {
        return Some("/".into());
    }
    let mut stack = vec![root.to_path_buf()];
    let mut seen = 0;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let Ok(t) = e.file_type() else { continue };
            if !t.is_dir() {
                continue;
            }
            seen += 1;
            if seen > MAX_CGROUP_DIRS {
                return None;
            }
            if e.metadata().is_ok_and(|m| m.ino() == id) {
                let rel = e.path();
                return Some(format!("/{}", rel.strip_prefix(root).ok()?.to_string_lossy()));
            }
            stack.push(e.path());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_cgroup_is_found_by_its_directory_inode() {
        let root = tempfile::tempdir().unwrap();
        let deep = root.path().join("kubepods.slice/pod1/abc");
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(root.path().join("kubepods.slice/cgroup.procs"), "").unwrap();
        let ino = |p: &std::path::Path| std::fs::metadata(p).unwrap().ino();
        assert_eq!(find_cgroup(root.path(), ino(&deep)).as_deref(), Some("/kubepods.slice/pod1/abc"));
        assert_eq!(find_cgroup(root.path(), ino(root.path())).as_deref(), Some("/"));
        assert_eq!(find_cgroup(root.path(), u64::MAX), None);
    }
}
