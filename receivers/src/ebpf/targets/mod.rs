//! `targets:` which processes the ebpf receiver samples, decided in the
//! kernel before any stack walk. A verdict is kept per cgroup v2 id in a
//! BPF map; the first sample of a cgroup with none asks (a ring record),
//! and the reader answers from what the node says of that cgroup: its
//! path, its container and the container's pod. Where an `executable`
//! matcher decides, the verdict is kept per process instead.
//!
//! A process is sampled when it matches an `include` matcher (or the list
//! is empty) and no `exclude` matcher. A matcher matches when all its keys
//! do.

use crate::ebpf::uprobes::matcher::BinaryPattern;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `targets:` section.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TargetsConfig {
    /// Sample only processes matching one of these (empty: every process).
    pub include: Vec<Matcher>,
    /// Never sample processes matching one of these.
    pub exclude: Vec<Matcher>,
}

/// One matcher: every key given must match. Values are globs (`*`, `?`,
/// `[...]`); a value with a `/` is matched against the whole text, one
/// without against its last `/`-separated part.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Matcher {
    /// The cgroup v2 path, as in /proc/PID/cgroup (`/kubepods.slice/...`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_path: Option<String>,
    /// The container id (64 hex digits) found in the cgroup path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The pod's namespace (`k8s.namespace.name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k8s_namespace: Option<String>,
    /// The pod's name (`k8s.pod.name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k8s_pod: Option<String>,
    /// The container's name in its pod (`k8s.container.name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k8s_container: Option<String>,
    /// The executable: a path or base name glob (per process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub executable: Option<String>,
}

impl TargetsConfig {
    pub fn is_set(&self) -> bool {
        !self.include.is_empty() || !self.exclude.is_empty()
    }

    /// Problems, keyed by field path under `targets`.
    pub(crate) fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (list, ms) in [("include", &self.include), ("exclude", &self.exclude)] {
            for (i, m) in ms.iter().enumerate() {
                let at = format!("targets.{list}[{i}]");
                if m.fields().all(|(_, v)| v.is_none()) {
                    out.push((
                        at.clone(),
                        "empty matcher; give cgroup_path, container_id, k8s_namespace, k8s_pod, k8s_container or \
                         executable"
                            .into(),
                    ));
                }
                for (key, v) in m.fields() {
                    if let Some(Err(e)) = v.map(BinaryPattern::parse) {
                        out.push((format!("{at}.{key}"), e));
                    }
                }
            }
        }
        out
    }
}

impl Matcher {
    fn fields(&self) -> impl Iterator<Item = (&'static str, Option<&str>)> {
        [
            ("cgroup_path", self.cgroup_path.as_deref()),
            ("container_id", self.container_id.as_deref()),
            ("k8s_namespace", self.k8s_namespace.as_deref()),
            ("k8s_pod", self.k8s_pod.as_deref()),
            ("k8s_container", self.k8s_container.as_deref()),
            ("executable", self.executable.as_deref()),
        ]
        .into_iter()
    }
}

/// What the node says of a cgroup (and, per process, its executable).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Facts<'a> {
    pub cgroup_path: &'a str,
    pub container_id: Option<&'a str>,
    pub k8s_namespace: Option<&'a str>,
    pub k8s_pod: Option<&'a str>,
    pub k8s_container: Option<&'a str>,
    /// `None` when judging a whole cgroup.
    pub executable: Option<&'a str>,
}

/// A verdict: sampled, not, or (for a whole cgroup) up to each process's
/// executable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    In,
    Out,
    ByProcess,
}

impl Verdict {
    /// The value the BPF program reads.
    pub(crate) fn map_value(self) -> u8 {
        match self {
            Verdict::In => profcol_ebpf::targets::IN,
            Verdict::Out => profcol_ebpf::targets::OUT,
            Verdict::ByProcess => profcol_ebpf::targets::BY_PROCESS,
        }
    }
}

/// Parsed matchers.
pub(crate) struct Targets {
    include: Vec<Compiled>,
    exclude: Vec<Compiled>,
    /// Where the cgroup v2 hierarchy is mounted (if it is).
    cgroup2_root: Option<std::path::PathBuf>,
    /// Asks that could not be judged, in the order they are due again.
    unjudged: std::collections::VecDeque<(std::time::Instant, profcol_ebpf::targets::Ask)>,
}

struct Compiled {
    cgroup_path: Option<BinaryPattern>,
    container_id: Option<BinaryPattern>,
    k8s_namespace: Option<BinaryPattern>,
    k8s_pod: Option<BinaryPattern>,
    k8s_container: Option<BinaryPattern>,
    executable: Option<BinaryPattern>,
}

/// Kleene's three values: `None` is "unknown" (an executable matcher
/// while judging a whole cgroup).
type Tri = Option<bool>;

impl Compiled {
    fn new(m: &Matcher) -> Result<Self, String> {
        let p = |v: &Option<String>| v.as_deref().map(BinaryPattern::parse).transpose();
        Ok(Compiled {
            cgroup_path: p(&m.cgroup_path)?,
            container_id: p(&m.container_id)?,
            k8s_namespace: p(&m.k8s_namespace)?,
            k8s_pod: p(&m.k8s_pod)?,
            k8s_container: p(&m.k8s_container)?,
            executable: p(&m.executable)?,
        })
    }

    fn matches(&self, f: &Facts) -> Tri {
        let known =
            |p: &Option<BinaryPattern>, v: Option<&str>| p.as_ref().is_none_or(|p| v.is_some_and(|v| p.matches(v)));
        let fixed = known(&self.cgroup_path, Some(f.cgroup_path))
            && known(&self.container_id, f.container_id)
            && known(&self.k8s_namespace, f.k8s_namespace)
            && known(&self.k8s_pod, f.k8s_pod)
            && known(&self.k8s_container, f.k8s_container);
        if !fixed {
            return Some(false);
        }
        match (&self.executable, f.executable) {
            (None, _) => Some(true),
            (Some(p), Some(exe)) => Some(p.matches(exe)),
            (Some(_), None) => None,
        }
    }
}

/// Whether any matcher of `list` matches.
fn any(list: &[Compiled], f: &Facts) -> Tri {
    let mut unknown = false;
    for m in list {
        match m.matches(f) {
            Some(true) => return Some(true),
            None => unknown = true,
            Some(false) => {}
        }
    }
    if unknown {
        None
    } else {
        Some(false)
    }
}

impl Targets {
    pub(crate) fn new(c: &TargetsConfig) -> Result<Self, String> {
        let compile = |l: &[Matcher]| l.iter().map(Compiled::new).collect::<Result<Vec<_>, _>>();
        Ok(Targets {
            include: compile(&c.include)?,
            exclude: compile(&c.exclude)?,
            cgroup2_root: cgroup2_root(),
            unjudged: Default::default(),
        })
    }

    /// As [`Self::new`], and an error where there is no cgroup v2 tree: the
    /// kernel then gives every task the same cgroup id, and no verdict
    /// could tell processes apart.
    pub(crate) fn for_this_host(c: &TargetsConfig) -> Result<Self, String> {
        let t = Self::new(c)?;
        if t.cgroup2_root.is_none() {
            return Err("targets needs the cgroup v2 hierarchy, and this host mounts none (cgroup v1 only); mount \
                        cgroup2 (alone, or beside v1 at /sys/fs/cgroup/unified) or remove `targets`"
                .into());
        }
        Ok(t)
    }

    /// The verdict for `f`: `ByProcess` only when `f.executable` is `None`
    /// and an executable matcher decides.
    pub(crate) fn verdict(&self, f: &Facts) -> Verdict {
        let included = if self.include.is_empty() { Some(true) } else { any(&self.include, f) };
        let excluded = any(&self.exclude, f);
        // included AND NOT excluded, in three values.
        match (included, excluded) {
            (Some(false), _) | (_, Some(true)) => Verdict::Out,
            (Some(true), Some(false)) => Verdict::In,
            _ => Verdict::ByProcess,
        }
    }
}

/// The host's cgroup2 hierarchy: where pid 1 mounts it, seen through
/// /proc/1/root (an agent in a container with the host's pid namespace
/// reads the host's tree, with paths as the host names them), else this
/// mount namespace's.
fn cgroup2_root() -> Option<std::path::PathBuf> {
    let mount_of = |mountinfo: &str| -> Option<String> {
        let info = std::fs::read_to_string(mountinfo).ok()?;
        info.lines().find_map(|l| {
            // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS... - FSTYPE SOURCE SUPER
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            (right.split(' ').next()? == "cgroup2" && f.get(3) == Some(&"/"))
                .then(|| f.get(4).map(|m| m.to_string()))?
        })
    };
    if let Some(m) = mount_of("/proc/1/mountinfo") {
        let host = std::path::Path::new("/proc/1/root").join(m.trim_start_matches('/'));
        if host.join("cgroup.procs").exists() {
            return Some(host);
        }
    }
    mount_of("/proc/self/mountinfo").map(std::path::PathBuf::from)
}

pub(crate) mod kernel;

#[cfg(test)]
mod tests;
