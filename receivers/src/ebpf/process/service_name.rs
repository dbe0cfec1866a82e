//! Each process's `service.name` (OTel semantic conventions: the logical
//! name a backend files a process's data under), from the sources the
//! config lists in `service_name:`, tried in order:
//!
//! - `executable`: the executable's base name (the default: every process
//!   has one);
//! - `env:NAME`: the process's environment variable NAME, e.g.
//!   `env:OTEL_SERVICE_NAME`, the variable OTel SDKs read;
//! - `container_label:KEY`: label KEY of the process's container, e.g.
//!   `container_label:com.docker.compose.service`, or in Kubernetes the
//!   annotation containerd's CRI writes, `io.kubernetes.cri.container-name`
//!   (CRI-O: `io.kubernetes.container.name`);
//! - `k8s_container`: the Kubernetes container name of the process's
//!   container;
//! - `k8s_label:KEY`: label KEY of the process's pod, e.g. `k8s_label:app`
//!   (CRI-O and Docker keep pod labels on the node, containerd does not);
//! - `value:TEXT`: TEXT, whatever the process.
//!
//! When no source gives a value the name is `unknown_service:` + the
//! executable name, as OTel SDKs name a service nobody named.
//!
//! Containers and their labels come from the shared container table
//! ([`super::containers`]), read once per container.

use super::containers::Container;
use super::procfs::read_bounded;
use std::path::PathBuf;

/// One entry of `service_name:`, written `executable`, `env:NAME`,
/// `container_label:KEY`, `k8s_container`, `k8s_label:KEY` or `value:TEXT`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Source {
    Executable,
    Env(String),
    ContainerLabel(String),
    K8sContainer,
    K8sLabel(String),
    Value(String),
}

impl TryFrom<String> for Source {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        let arg = |prefix: &str| -> Option<Result<String, String>> {
            let rest = s.strip_prefix(prefix)?;
            Some(if rest.is_empty() {
                Err(format!("{s:?}: say what after `{prefix}` (e.g. `env:OTEL_SERVICE_NAME`)"))
            } else {
                Ok(rest.to_owned())
            })
        };
        if s == "executable" {
            return Ok(Source::Executable);
        }
        if s == "k8s_container" {
            return Ok(Source::K8sContainer);
        }
        if let Some(v) = arg("env:") {
            return v.map(Source::Env);
        }
        if let Some(v) = arg("container_label:") {
            return v.map(Source::ContainerLabel);
        }
        if let Some(v) = arg("k8s_label:") {
            return v.map(Source::K8sLabel);
        }
        if let Some(v) = arg("value:") {
            return v.map(Source::Value);
        }
        Err(format!(
            "{s:?} is not a service name source; use `executable`, `env:NAME`, `container_label:KEY`, `k8s_container`, `k8s_label:KEY` or `value:TEXT`"
        ))
    }
}

impl From<Source> for String {
    fn from(s: Source) -> String {
        match s {
            Source::Executable => "executable".into(),
            Source::Env(v) => format!("env:{v}"),
            Source::ContainerLabel(v) => format!("container_label:{v}"),
            Source::K8sContainer => "k8s_container".into(),
            Source::K8sLabel(v) => format!("k8s_label:{v}"),
            Source::Value(v) => format!("value:{v}"),
        }
    }
}

/// Longest environment read from /proc/PID/environ.
const MAX_ENVIRON: u64 = 1 << 20;

/// Names processes by the configured sources.
pub struct ServiceNamer {
    sources: Vec<Source>,
    /// Where the host's /proc is ("/" but in tests).
    root: PathBuf,
}

impl ServiceNamer {
    pub fn new(sources: Vec<Source>) -> Self {
        Self::with_root(sources, PathBuf::from("/"))
    }

    pub fn with_root(sources: Vec<Source>, root: PathBuf) -> Self {
        ServiceNamer { sources, root }
    }

    /// The name of a process /proc could not tell about: the first
    /// `value:` or `executable` source (its thread's comm standing for the
    /// executable's name), else `unknown_service:<comm>`.
    pub(crate) fn name_without_process(&self, exe_or_comm: &str) -> String {
        for s in &self.sources {
            match s {
                Source::Value(v) => return v.clone(),
                Source::Executable if !exe_or_comm.is_empty() => return exe_or_comm.to_owned(),
                _ => {}
            }
        }
        unknown(exe_or_comm)
    }

    /// `service.name` of process `pid`, running `exe_name`, in `container`
    /// (if any).
    pub fn name(&self, pid: u32, exe_name: &str, container: Option<&Container>) -> String {
        let mut environ: Option<Option<Vec<u8>>> = None;
        for source in &self.sources {
            let found = match source {
                Source::Executable => (!exe_name.is_empty()).then(|| exe_name.to_owned()),
                Source::Value(v) => Some(v.clone()),
                Source::Env(var) => {
                    let env = environ.get_or_insert_with(|| {
                        read_bounded(&self.root.join(format!("proc/{pid}/environ")), MAX_ENVIRON)
                    });
                    env.as_deref().and_then(|e| env_var(e, var))
                }
                Source::ContainerLabel(key) => container.and_then(|c| c.labels.get(key).cloned()),
                Source::K8sContainer => container.and_then(|c| c.container_name.clone()),
                Source::K8sLabel(key) => container.and_then(|c| c.pod_labels.get(key).cloned()),
            };
            if let Some(n) = found.filter(|n| !n.is_empty()) {
                return n;
            }
        }
        unknown(exe_name)
    }
}

fn unknown(exe: &str) -> String {
    if exe.is_empty() {
        "unknown_service".into()
    } else {
        format!("unknown_service:{exe}")
    }
}

/// `var`'s value in a NUL-separated environment block.
fn env_var(environ: &[u8], var: &str) -> Option<String> {
    environ.split(|&b| b == 0).find_map(|kv| {
        let v = kv.strip_prefix(var.as_bytes())?.strip_prefix(b"=")?;
        Some(String::from_utf8_lossy(v).into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(list: &[&str]) -> Vec<Source> {
        list.iter().map(|s| Source::try_from(s.to_string()).unwrap()).collect()
    }

    #[test]
    fn sources_parse_and_print_back_and_bad_ones_say_what_to_write() {
        for s in [
            "executable",
            "env:OTEL_SERVICE_NAME",
            "container_label:com.docker.compose.service",
            "k8s_container",
            "k8s_label:app.kubernetes.io/name",
            "value:shop",
        ] {
            assert_eq!(String::from(Source::try_from(s.to_owned()).unwrap()), s);
        }
        let e = Source::try_from("exe".to_owned()).unwrap_err();
        assert!(e.contains("`executable`, `env:NAME`"), "{e}");
        assert!(e.contains("`k8s_container`, `k8s_label:KEY`"), "{e}");
        let e = Source::try_from("env:".to_owned()).unwrap_err();
        assert!(e.contains("after `env:`"), "{e}");
        let e = Source::try_from("k8s_label:".to_owned()).unwrap_err();
        assert!(e.contains("after `k8s_label:`"), "{e}");
    }

    #[test]
    fn the_first_source_with_a_value_names_the_process() {
        let root = tempfile::tempdir().unwrap();
        let id = "ab".repeat(32);
        let proc_dir = root.path().join("proc/42");
        std::fs::create_dir_all(&proc_dir).unwrap();
        std::fs::write(proc_dir.join("environ"), b"PATH=/bin\0OTEL_SERVICE_NAME=checkout\0EMPTY=\0").unwrap();
        let docker = root.path().join(format!("var/lib/docker/containers/{id}"));
        std::fs::create_dir_all(&docker).unwrap();
        std::fs::write(
            docker.join("config.v2.json"),
            r#"{"Config":{"Labels":{"com.docker.compose.service":"web","n":1}}}"#,
        )
        .unwrap();
        let cri = "cd".repeat(32);
        let bundle = root.path().join(format!("run/containerd/io.containerd.runtime.v2.task/k8s.io/{cri}"));
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::write(bundle.join("config.json"), r#"{"annotations":{"io.kubernetes.cri.container-name":"api"}}"#)
            .unwrap();
        let mut table = super::super::containers::ContainerTable::with_root(root.path().to_owned());
        let (web, api) = (table.get(&id), table.get(&cri));
        let (web, api) = (web.as_deref(), api.as_deref());
        let pod = Container {
            id: "ef".repeat(32),
            pod_labels: [("app".to_owned(), "cart".to_owned())].into(),
            ..Default::default()
        };
        let namer = |list: &[&str]| ServiceNamer::with_root(sources(list), root.path().to_owned());

        assert_eq!(namer(&["executable"]).name(42, "nginx", None), "nginx");
        assert_eq!(namer(&["env:OTEL_SERVICE_NAME", "executable"]).name(42, "java", None), "checkout");
        // Unset or empty: the next source.
        assert_eq!(namer(&["env:MISSING", "env:EMPTY", "executable"]).name(42, "java", None), "java");
        let label = "container_label:com.docker.compose.service";
        assert_eq!(namer(&[label, "executable"]).name(42, "nginx", web), "web");
        assert_eq!(namer(&[label, "executable"]).name(42, "nginx", None), "nginx");
        let k8s = "container_label:io.kubernetes.cri.container-name";
        assert_eq!(namer(&[k8s]).name(7, "server", api), "api");
        assert_eq!(namer(&["k8s_container", "executable"]).name(7, "server", api), "api");
        assert_eq!(namer(&["k8s_container", "executable"]).name(7, "server", web), "server");
        assert_eq!(namer(&["k8s_label:app", "k8s_container"]).name(7, "server", Some(&pod)), "cart");
        assert_eq!(namer(&["k8s_label:app", "k8s_container"]).name(7, "server", api), "api");
        assert_eq!(namer(&["value:shop", "executable"]).name(42, "nginx", None), "shop");
        // Nothing found: unknown_service:<executable>, as OTel SDKs do.
        assert_eq!(namer(&["env:MISSING"]).name(42, "nginx", None), "unknown_service:nginx");
        assert_eq!(namer(&["env:MISSING"]).name(42, "", None), "unknown_service");
        // A process /proc says nothing about: the fixed value, or its comm.
        assert_eq!(namer(&["env:X", "value:shop"]).name_without_process("nginx"), "shop");
        assert_eq!(namer(&["executable"]).name_without_process("nginx"), "nginx");
        assert_eq!(namer(&["env:X"]).name_without_process("nginx"), "unknown_service:nginx");
    }
}
