//! Who a container is, from the container runtime's files on the node (no
//! API server): its runtime, Kubernetes pod, namespace and container name,
//! image, labels. Read once per container id, kept in one bounded table
//! that `container.id`, `k8s.*` attributes and `service_name` share.
//!
//! The files, tried in this order (paths under `root`, "/" but in tests):
//!
//! - Docker (and cri-dockerd): `var/lib/docker/containers/<id>/config.v2.json`,
//!   `Config.Labels` (kubelet's `io.kubernetes.pod.*` and
//!   `io.kubernetes.container.name`), `Config.Image`; the pod's labels are
//!   the labels of its sandbox container (`io.kubernetes.sandbox.id`).
//! - CRI-O: `run/containers/storage/overlay-containers/<id>/userdata/config.json`
//!   (or under `var/lib/containers/storage`), the OCI spec's `annotations`
//!   and the container's labels in `io.kubernetes.cri-o.Labels` (a JSON
//!   object in a string); image `io.kubernetes.cri-o.ImageName` (else
//!   `io.kubernetes.cri-o.Image`); the pod's labels are
//!   `io.kubernetes.cri-o.Labels` of its sandbox (`io.kubernetes.cri-o.SandboxID`).
//!   Podman's containers live there too (`io.container.manager: libpod`).
//! - containerd: the OCI bundle `config.json` under
//!   `run/containerd/io.containerd.runtime.v2.task/<namespace>/<id>/` (k3s:
//!   `run/k3s/containerd/...`), annotations `io.kubernetes.cri.sandbox-name`,
//!   `-namespace`, `-uid`, `io.kubernetes.cri.container-name`, `image-name`.
//!   containerd keeps pod labels in its own database, not in the bundle:
//!   no pod labels.

use super::procfs::read_bounded;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Containers remembered at most: a node runs far fewer at once.
const MAX_CONTAINERS: usize = 4096;
/// Largest runtime state file read.
const MAX_STATE_FILE: u64 = 4 << 20;
/// containerd namespaces looked into at most.
const MAX_NAMESPACES: usize = 64;
/// How often remembered containers are checked against their state file.
/// A container id is never reused, so what was read stays true while the
/// container lives; the check only forgets containers that are gone (their
/// runtime removed the file), one `stat` per container per period.
pub(crate) const RECHECK_INTERVAL: Duration = Duration::from_secs(60);

/// One container as its runtime describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Container {
    /// The 64-hex-digit id (`container.id`).
    pub id: String,
    /// `containerd`, `cri-o`, `docker` or `podman`; `None` when no
    /// runtime's files tell about the container.
    pub runtime: Option<&'static str>,
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
    pub namespace: Option<String>,
    pub container_name: Option<String>,
    /// The image reference as the runtime has it (name, tag or digest).
    pub image_name: Option<String>,
    /// The runtime's labels / annotations of the container
    /// (`container_label:KEY`).
    pub labels: BTreeMap<String, String>,
    /// The pod's labels, where the runtime keeps them (CRI-O, Docker).
    pub pod_labels: BTreeMap<String, String>,
}

struct Entry {
    container: Arc<Container>,
    /// The state file it was read from: while it exists the container does.
    state: Option<PathBuf>,
}

/// Containers by id, read once each, bounded.
pub struct ContainerTable {
    root: PathBuf,
    entries: FxHashMap<String, Entry>,
    last_check: Instant,
    /// State files read (for tests and telemetry: one per container).
    pub reads: u64,
}

impl ContainerTable {
    pub fn new() -> Self {
        Self::with_root(PathBuf::from("/"))
    }

    /// Runtime files are looked for under `root` ("/" but in tests).
    pub fn with_root(root: PathBuf) -> Self {
        ContainerTable { root, entries: FxHashMap::default(), last_check: Instant::now(), reads: 0 }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Container `id`, read on first sight. `None` for an id that is not
    /// hex (it never becomes a path); a container no runtime file tells
    /// about has its id only.
    pub fn get(&mut self, id: &str) -> Option<Arc<Container>> {
        if id.is_empty() || id.len() > 128 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        if let Some(e) = self.entries.get(id) {
            return Some(e.container.clone());
        }
        if self.entries.len() >= MAX_CONTAINERS {
            self.forget_gone();
            if self.entries.len() >= MAX_CONTAINERS {
                self.entries.clear();
            }
        }
        self.reads += 1;
        let (container, state) = match read(&self.root, id) {
            Some((c, path)) => (c, Some(path)),
            None => (Container { id: id.to_owned(), ..Default::default() }, None),
        };
        let container = Arc::new(container);
        self.entries.insert(id.to_owned(), Entry { container: container.clone(), state });
        Some(container)
    }

    /// Forgets containers whose state file is gone, at most once per
    /// [`RECHECK_INTERVAL`].
    pub fn sweep(&mut self, now: Instant) {
        if now.duration_since(self.last_check) >= RECHECK_INTERVAL {
            self.last_check = now;
            self.forget_gone();
        }
    }

    /// Containers known by id only are forgotten too: cheap to look up
    /// again, and their runtime may have written its files since.
    fn forget_gone(&mut self) {
        self.entries.retain(|_, e| e.state.as_deref().is_some_and(|p| p.exists()));
    }
}

impl Default for ContainerTable {
    fn default() -> Self {
        Self::new()
    }
}

/// Container `id` (hex) from the first runtime whose files hold it, and
/// the file read.
fn read(root: &Path, id: &str) -> Option<(Container, PathBuf)> {
    let docker = root.join(format!("var/lib/docker/containers/{id}/config.v2.json"));
    if let Some(doc) = read_json(&docker) {
        return Some((docker_container(root, id, &doc), docker));
    }
    for dir in ["run/containers/storage", "var/lib/containers/storage"] {
        let path = root.join(format!("{dir}/overlay-containers/{id}/userdata/config.json"));
        if let Some(doc) = read_json(&path) {
            let sandbox_labels = |sandbox: &str| {
                let p = root.join(format!("{dir}/overlay-containers/{sandbox}/userdata/config.json"));
                read_json(&p).map(|d| json_labels(&d["annotations"]["io.kubernetes.cri-o.Labels"]))
            };
            return Some((crio_container(id, &doc, sandbox_labels), path));
        }
    }
    for tasks in ["run/containerd/io.containerd.runtime.v2.task", "run/k3s/containerd/io.containerd.runtime.v2.task"] {
        let tasks = root.join(tasks);
        // Kubernetes' namespace first: one open in the common case.
        let k8s = tasks.join("k8s.io").join(id).join("config.json");
        if let Some(doc) = read_json(&k8s) {
            return Some((containerd_container(id, "k8s.io", &doc), k8s));
        }
        let Ok(dir) = std::fs::read_dir(&tasks) else { continue };
        for ns in dir.flatten().take(MAX_NAMESPACES) {
            let name = ns.file_name();
            let Some(name) = name.to_str().filter(|n| *n != "k8s.io") else { continue };
            let path = ns.path().join(id).join("config.json");
            if let Some(doc) = read_json(&path) {
                return Some((containerd_container(id, name, &doc), path));
            }
        }
    }
    None
}

fn docker_container(root: &Path, id: &str, doc: &serde_json::Value) -> Container {
    let labels = string_map(&doc["Config"]["Labels"]);
    let pod_labels = labels
        .get("io.kubernetes.sandbox.id")
        .filter(|s| *s != id && is_hex(s))
        .and_then(|s| read_json(&root.join(format!("var/lib/docker/containers/{s}/config.v2.json"))))
        .map(|d| pod_labels(string_map(&d["Config"]["Labels"])))
        .unwrap_or_default();
    Container {
        id: id.to_owned(),
        runtime: Some("docker"),
        pod_name: labels.get("io.kubernetes.pod.name").cloned(),
        pod_uid: labels.get("io.kubernetes.pod.uid").cloned(),
        namespace: labels.get("io.kubernetes.pod.namespace").cloned(),
        container_name: labels.get("io.kubernetes.container.name").cloned(),
        image_name: doc["Config"]["Image"].as_str().filter(|s| !s.is_empty()).map(str::to_owned),
        labels,
        pod_labels,
    }
}

fn crio_container(
    id: &str,
    doc: &serde_json::Value,
    sandbox_labels: impl Fn(&str) -> Option<BTreeMap<String, String>>,
) -> Container {
    let a = &doc["annotations"];
    let mut labels = string_map(a);
    // The container's labels (kubelet's `io.kubernetes.*` among them);
    // CRI-O usually copies them into the annotations as well.
    for (k, v) in json_labels(&a["io.kubernetes.cri-o.Labels"]) {
        labels.entry(k).or_insert(v);
    }
    let pod_labels = labels
        .get("io.kubernetes.cri-o.SandboxID")
        .filter(|s| *s != id && is_hex(s))
        .and_then(|s| sandbox_labels(s))
        .map(pod_labels)
        .unwrap_or_default();
    let get = |k: &str| labels.get(k).filter(|v| !v.is_empty()).cloned();
    Container {
        id: id.to_owned(),
        // Podman keeps its containers in the same storage, and says so.
        runtime: Some(if labels.get("io.container.manager").is_some_and(|m| m == "libpod") {
            "podman"
        } else {
            "cri-o"
        }),
        pod_name: get("io.kubernetes.pod.name"),
        pod_uid: get("io.kubernetes.pod.uid"),
        namespace: get("io.kubernetes.pod.namespace"),
        container_name: get("io.kubernetes.container.name"),
        image_name: get("io.kubernetes.cri-o.ImageName").or_else(|| get("io.kubernetes.cri-o.Image")),
        pod_labels,
        labels,
    }
}

fn containerd_container(id: &str, namespace: &str, doc: &serde_json::Value) -> Container {
    let labels = string_map(&doc["annotations"]);
    let get = |k: &str| labels.get(k).filter(|v| !v.is_empty()).cloned();
    Container {
        id: id.to_owned(),
        // Docker runs its containers in containerd's `moby` namespace.
        runtime: Some(if namespace == "moby" { "docker" } else { "containerd" }),
        pod_name: get("io.kubernetes.cri.sandbox-name"),
        pod_uid: get("io.kubernetes.cri.sandbox-uid"),
        namespace: get("io.kubernetes.cri.sandbox-namespace"),
        container_name: get("io.kubernetes.cri.container-name"),
        image_name: get("io.kubernetes.cri.image-name"),
        labels,
        pod_labels: BTreeMap::new(),
    }
}

/// A sandbox's labels less those kubelet and cri-dockerd add (pod
/// identity, `annotation.*` copies of annotations): the pod's own labels.
fn pod_labels(mut labels: BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels.retain(|k, _| !k.starts_with("io.kubernetes.") && !k.starts_with("annotation."));
    labels
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_slice(&read_bounded(path, MAX_STATE_FILE)?).ok()
}

/// The string-valued entries of a JSON object.
fn string_map(v: &serde_json::Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect())
        .unwrap_or_default()
}

/// A JSON object held in a JSON string (CRI-O's `io.kubernetes.cri-o.Labels`).
fn json_labels(v: &serde_json::Value) -> BTreeMap<String, String> {
    v.as_str().and_then(|s| serde_json::from_str(s).ok()).map(|v: serde_json::Value| string_map(&v)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// An OCI bundle `config.json` as containerd's CRI plugin writes it
    /// (abridged to the parts read; the rest is there to be skipped).
    fn containerd_bundle(image: &str) -> String {
        format!(
            r#"{{"ociVersion":"1.1.0","process":{{"user":{{"uid":0,"gid":0}},"args":["/bin/busybox","sh"],"cwd":"/"}},
            "root":{{"path":"rootfs"}},"annotations":{{
            "io.kubernetes.cri.container-name":"api",
            "io.kubernetes.cri.container-type":"container",
            "io.kubernetes.cri.image-name":"{image}",
            "io.kubernetes.cri.sandbox-id":"{sb}",
            "io.kubernetes.cri.sandbox-name":"shop-7d9",
            "io.kubernetes.cri.sandbox-namespace":"prod",
            "io.kubernetes.cri.sandbox-uid":"0f5e6c1a-6f0e-4d7b-9a49-7d3f1e2b8c11"}},
            "linux":{{"cgroupsPath":"kubepods-besteffort-pod0f5e6c1a.slice:cri-containerd:x"}}}}"#,
            sb = "ee".repeat(32)
        )
    }

    #[test]
    fn containerd_bundles_in_any_namespace_and_k3s() {
        let root = tempfile::tempdir().unwrap();
        let (a, b, c) = ("a1".repeat(32), "b2".repeat(32), "c3".repeat(32));
        let tasks = "run/containerd/io.containerd.runtime.v2.task";
        write(
            root.path(),
            &format!("{tasks}/k8s.io/{a}/config.json"),
            &containerd_bundle("docker.io/library/busybox:1.36"),
        );
        write(root.path(), &format!("{tasks}/default/{b}/config.json"), r#"{"ociVersion":"1.1.0"}"#);
        write(
            root.path(),
            &format!("run/k3s/containerd/io.containerd.runtime.v2.task/k8s.io/{c}/config.json"),
            &containerd_bundle("nginx:1"),
        );
        let moby = "d4".repeat(32);
        write(root.path(), &format!("{tasks}/moby/{moby}/config.json"), "{}");
        let mut t = ContainerTable::with_root(root.path().to_owned());
        // Docker's containers in containerd's `moby` namespace are Docker's.
        assert_eq!(t.get(&moby).unwrap().runtime, Some("docker"));
        t.reads = 0;
        let k = t.get(&a).unwrap();
        assert_eq!(k.runtime, Some("containerd"));
        assert_eq!(k.pod_name.as_deref(), Some("shop-7d9"));
        assert_eq!(k.namespace.as_deref(), Some("prod"));
        assert_eq!(k.pod_uid.as_deref(), Some("0f5e6c1a-6f0e-4d7b-9a49-7d3f1e2b8c11"));
        assert_eq!(k.container_name.as_deref(), Some("api"));
        assert_eq!(k.image_name.as_deref(), Some("docker.io/library/busybox:1.36"));
        assert_eq!(k.labels.get("io.kubernetes.cri.container-type").map(String::as_str), Some("container"));
        assert!(k.pod_labels.is_empty(), "containerd keeps no pod labels in the bundle");
        // Outside Kubernetes: the runtime, nothing of a pod.
        let d = t.get(&b).unwrap();
        assert_eq!((d.runtime, d.pod_name.as_deref(), d.image_name.as_deref()), (Some("containerd"), None, None));
        assert_eq!(t.get(&c).unwrap().image_name.as_deref(), Some("nginx:1"));
        // Read once each.
        assert_eq!(t.reads, 3);
        assert!(Arc::ptr_eq(&t.get(&a).unwrap(), &k));
        assert_eq!(t.reads, 3);
    }

    #[test]
    fn crio_userdata_with_pod_labels_from_the_sandbox() {
        let root = tempfile::tempdir().unwrap();
        let (id, sb) = ("49".repeat(32), "1f".repeat(32));
        let dir = "run/containers/storage/overlay-containers";
        // As CRI-O writes them: the container's kubelet labels both as a
        // JSON string and copied into the annotations.
        write(
            root.path(),
            &format!("{dir}/{id}/userdata/config.json"),
            &format!(
                r#"{{"ociVersion":"1.0.2-dev","annotations":{{
                "io.container.manager":"cri-o",
                "io.kubernetes.cri-o.ContainerType":"container",
                "io.kubernetes.cri-o.SandboxID":"{sb}",
                "io.kubernetes.cri-o.Image":"sha256:98bd7cfc",
                "io.kubernetes.cri-o.ImageName":"quay.io/crio/redis:alpine",
                "io.kubernetes.cri-o.Labels":"{{\"io.kubernetes.container.name\":\"redis\",\"io.kubernetes.pod.name\":\"cache-0\",\"io.kubernetes.pod.namespace\":\"data\",\"io.kubernetes.pod.uid\":\"9c0e\"}}",
                "io.kubernetes.container.name":"redis",
                "io.kubernetes.pod.name":"cache-0"}}}}"#
            ),
        );
        write(
            root.path(),
            &format!("{dir}/{sb}/userdata/config.json"),
            r#"{"annotations":{"io.kubernetes.cri-o.ContainerType":"sandbox",
            "io.kubernetes.cri-o.Labels":"{\"app\":\"cache\",\"tier\":\"backend\",\"io.kubernetes.pod.name\":\"cache-0\",\"io.kubernetes.container.name\":\"POD\"}"}}"#,
        );
        let mut t = ContainerTable::with_root(root.path().to_owned());
        let c = t.get(&id).unwrap();
        assert_eq!(c.runtime, Some("cri-o"));
        assert_eq!(
            (c.pod_name.as_deref(), c.namespace.as_deref(), c.pod_uid.as_deref(), c.container_name.as_deref()),
            (Some("cache-0"), Some("data"), Some("9c0e"), Some("redis"))
        );
        assert_eq!(c.image_name.as_deref(), Some("quay.io/crio/redis:alpine"));
        let pod: Vec<_> = c.pod_labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(pod, [("app", "cache"), ("tier", "backend")]);
        // Under /var/lib, without ImageName or a sandbox: Image, no pod labels.
        let other = "0a".repeat(32);
        write(
            root.path(),
            &format!("var/lib/containers/storage/overlay-containers/{other}/userdata/config.json"),
            r#"{"annotations":{"io.kubernetes.cri-o.Image":"quay.io/x:1","io.kubernetes.cri-o.Labels":"not json"}}"#,
        );
        let o = t.get(&other).unwrap();
        assert_eq!((o.runtime, o.image_name.as_deref()), (Some("cri-o"), Some("quay.io/x:1")));
        assert!(o.pod_labels.is_empty() && o.pod_name.is_none());
        // Podman's, in the same storage.
        let podman = "9f".repeat(32);
        write(
            root.path(),
            &format!("var/lib/containers/storage/overlay-containers/{podman}/userdata/config.json"),
            r#"{"annotations":{"io.container.manager":"libpod","org.opencontainers.image.stopSignal":"15"}}"#,
        );
        assert_eq!(t.get(&podman).unwrap().runtime, Some("podman"));
    }

    #[test]
    fn docker_and_cri_dockerd_config_v2() {
        let root = tempfile::tempdir().unwrap();
        let (id, sb, plain) = ("d0".repeat(32), "5b".repeat(32), "77".repeat(32));
        let dir = "var/lib/docker/containers";
        write(
            root.path(),
            &format!("{dir}/{id}/config.v2.json"),
            &format!(
                r#"{{"ID":"{id}","Name":"/k8s_web_front-1_shop_2b1f_0","Config":{{"Image":"sha256:4e1b","Labels":{{
                "io.kubernetes.container.name":"web","io.kubernetes.docker.type":"container",
                "io.kubernetes.pod.name":"front-1","io.kubernetes.pod.namespace":"shop",
                "io.kubernetes.pod.uid":"2b1f","io.kubernetes.sandbox.id":"{sb}","n":1}}}}}}"#
            ),
        );
        write(
            root.path(),
            &format!("{dir}/{sb}/config.v2.json"),
            r#"{"Config":{"Image":"registry.k8s.io/pause:3.9","Labels":{"app":"front",
            "annotation.kubernetes.io/config.seen":"x","io.kubernetes.docker.type":"podsandbox",
            "io.kubernetes.pod.name":"front-1"}}}"#,
        );
        write(
            root.path(),
            &format!("{dir}/{plain}/config.v2.json"),
            r#"{"Config":{"Image":"nginx:1.27","Labels":{"com.docker.compose.service":"web"}}}"#,
        );
        // Docker's own containerd bundle of the same container: Docker's file wins.
        write(root.path(), &format!("run/containerd/io.containerd.runtime.v2.task/moby/{plain}/config.json"), "{}");
        let mut t = ContainerTable::with_root(root.path().to_owned());
        let c = t.get(&id).unwrap();
        assert_eq!(c.runtime, Some("docker"));
        assert_eq!(
            (c.pod_name.as_deref(), c.namespace.as_deref(), c.pod_uid.as_deref(), c.container_name.as_deref()),
            (Some("front-1"), Some("shop"), Some("2b1f"), Some("web"))
        );
        assert_eq!(c.image_name.as_deref(), Some("sha256:4e1b"));
        assert_eq!(c.pod_labels.keys().collect::<Vec<_>>(), ["app"]);
        assert!(!c.labels.contains_key("n"), "only string labels");
        let p = t.get(&plain).unwrap();
        assert_eq!(
            (p.runtime, p.image_name.as_deref(), p.pod_name.as_deref()),
            (Some("docker"), Some("nginx:1.27"), None)
        );
        assert_eq!(p.labels.get("com.docker.compose.service").map(String::as_str), Some("web"));
    }

    #[test]
    fn bad_ids_and_bad_files_are_no_container_and_no_panic() {
        let root = tempfile::tempdir().unwrap();
        let mut t = ContainerTable::with_root(root.path().to_owned());
        for bad in ["", "../../etc", "k8s.io/abc", "abc/../def", "zz", &"a".repeat(129)] {
            assert!(t.get(bad).is_none(), "{bad:?}");
        }
        assert_eq!(t.reads, 0, "a bad id never becomes a path");
        let tasks = "run/containerd/io.containerd.runtime.v2.task/k8s.io";
        let cases = [
            ("01", format!("{tasks}/{}/config.json", "01".repeat(32)), "{\"annotations\":".to_owned()),
            ("02", format!("{tasks}/{}/config.json", "02".repeat(32)), "[1,2]".to_owned()),
            ("03", format!("var/lib/docker/containers/{}/config.v2.json", "03".repeat(32)), "\0\u{1}".to_owned()),
            (
                "04",
                format!("{tasks}/{}/config.json", "04".repeat(32)),
                r#"{"annotations":{"io.kubernetes.cri.sandbox-name":7}}"#.to_owned(),
            ),
        ];
        for (id, path, text) in &cases {
            write(root.path(), path, text);
            let c = t.get(&id.repeat(32)).expect("a hex id is a container");
            assert_eq!(c.pod_name, None, "{path}: {text}");
        }
        // Truncated JSON: unreadable, the id only; a valid document of
        // another shape: the runtime, nothing else.
        assert_eq!(t.get(&"01".repeat(32)).unwrap().runtime, None);
        assert_eq!(t.get(&"04".repeat(32)).unwrap().runtime, Some("containerd"));
        // A file over the bound is cut, so unparsable.
        let big = "05".repeat(32);
        let huge = format!("{{\"annotations\":{{\"x\":\"{}\"}}}}", "y".repeat(MAX_STATE_FILE as usize));
        write(root.path(), &format!("{tasks}/{big}/config.json"), &huge);
        assert_eq!(t.get(&big).unwrap().runtime, None);
    }

    #[test]
    fn gone_containers_are_forgotten_and_the_table_is_bounded() {
        let root = tempfile::tempdir().unwrap();
        let mut t = ContainerTable::with_root(root.path().to_owned());
        let (live, gone) = ("aa".repeat(32), "bb".repeat(32));
        let tasks = root.path().join("run/containerd/io.containerd.runtime.v2.task/k8s.io");
        for id in [&live, &gone] {
            write(&tasks, &format!("{id}/config.json"), &containerd_bundle("x"));
            t.get(id).unwrap();
        }
        std::fs::remove_dir_all(tasks.join(&gone)).unwrap();
        let t0 = t.last_check;
        t.sweep(t0 + Duration::from_secs(1));
        assert_eq!(t.len(), 2, "not checked before the interval");
        t.sweep(t0 + RECHECK_INTERVAL);
        assert_eq!(t.len(), 1);
        assert!(t.entries.contains_key(&live));
        for i in 0..MAX_CONTAINERS + 10 {
            t.get(&format!("{i:064x}"));
            assert!(t.len() <= MAX_CONTAINERS);
        }
    }
}
