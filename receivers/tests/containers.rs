//! Pod identity of a real container: containerd (Debian's, with runc)
//! runs a busybox loop with the annotations containerd's CRI plugin
//! writes; the receiver must find them in the OCI bundle under
//! /run/containerd and put the pod on every sample of that process, and
//! nothing of it on a busy process outside any container. Needs root and
//! containerd, runc, busybox (.ci/containers.sh installs them).
//!
//!     sudo -E cargo test -p profcol-receivers --test containers

mod ebpf_common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ebpf_common::*;
use profcol_api::model::{any_value::Value, keys};
use profcol_receivers::ebpf::config::ServiceNameSource;
use profcol_receivers::ebpf::process::procfs;
use profcol_receivers::ebpf::targets::{Matcher, TargetsConfig};
use profcol_receivers::ebpf::EbpfConfig;

const NAMESPACE: &str = "k8s.io";
/// The socket of a containerd already running with the default state dir.
const SYSTEM_SOCKET: &str = "/run/containerd/containerd.sock";

fn ctr(socket: &Path, args: &[&str]) -> std::process::Output {
    Command::new("ctr")
        .arg("--address")
        .arg(socket)
        .args(["--timeout", "20s", "-n", NAMESPACE])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("ctr: {e}"))
}

fn answers(socket: &Path) -> bool {
    socket.exists()
        && Command::new("ctr")
            .arg("--address")
            .arg(socket)
            .args(["--timeout", "2s", "version"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// The containerd the test uses (its own unless one runs already), and
/// the container it runs; all removed on drop, whatever failed.
struct Containerd {
    socket: PathBuf,
    daemon: Option<Child>,
    container: Option<String>,
    _dir: tempfile::TempDir,
}

impl Containerd {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        if answers(Path::new(SYSTEM_SOCKET)) {
            return Containerd { socket: SYSTEM_SOCKET.into(), daemon: None, container: None, _dir: dir };
        }
        let socket = dir.path().join("ctr.sock");
        // Without the CRI plugin (it wants CNI and ports): only the bundle
        // layout matters here, and containerd writes it the same way.
        let config = dir.path().join("config.toml");
        std::fs::write(&config, "version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n").unwrap();
        let log = std::fs::File::create(dir.path().join("containerd.log")).unwrap();
        // State under /run/containerd, where profcol looks by default.
        let daemon = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .arg("--root")
            .arg(dir.path().join("root"))
            .args(["--state", "/run/containerd", "--address"])
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("containerd: {e}"));
        let me = Containerd { socket, daemon: Some(daemon), container: None, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !answers(&me.socket) {
            let log = std::fs::read_to_string(me._dir.path().join("containerd.log")).unwrap_or_default();
            assert!(Instant::now() < deadline, "containerd did not answer in 20 s:\n{log}");
            std::thread::sleep(Duration::from_millis(100));
        }
        me
    }

    /// Runs `args` (after the image/rootfs options) as container `id`
    /// with `annotations`; returns its host pid.
    fn run(&mut self, id: &str, rootfs: &Path, annotations: &[(&str, &str)], cmd: &[&str]) -> u32 {
        let mut args = vec!["run".to_owned(), "-d".into(), "--rootfs".into()];
        for (k, v) in annotations {
            args.extend(["--annotation".into(), format!("{k}={v}")]);
        }
        args.push(rootfs.to_string_lossy().into_owned());
        args.push(id.into());
        args.extend(cmd.iter().map(|s| s.to_string()));
        self.container = Some(id.to_owned());
        let out = ctr(&self.socket, &args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(out.status.success(), "ctr run: {}", String::from_utf8_lossy(&out.stderr));
        // `task ls`: TASK PID STATUS.
        let out = ctr(&self.socket, &["task", "ls"]);
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next() == Some(id)).then(|| f.next()?.parse().ok()).flatten()
            })
            .unwrap_or_else(|| panic!("no task {id} in:\n{text}"))
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Some(id) = self.container.take() {
            let _ = ctr(&self.socket, &["task", "kill", "-s", "SIGKILL", &id]);
            // The task is deleted once it has stopped.
            for _ in 0..50 {
                if ctr(&self.socket, &["task", "delete", &id]).status.success() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = ctr(&self.socket, &["container", "rm", &id]);
        }
        if let Some(mut d) = self.daemon.take() {
            // SAFETY: signals the daemon this test started, by its pid.
            unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
            let _ = d.wait();
        }
    }
}

fn strings(attrs: &[(String, Value)]) -> Vec<(String, String)> {
    attrs
        .iter()
        .filter_map(|(k, v)| match v {
            Value::StringValue(s) => Some((k.clone(), s.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_process_carries_its_pod_and_a_host_process_none() {
    let test = "a_container_process_carries_its_pod_and_a_host_process_none";
    if !require_bpf(test) {
        return;
    }
    let tools = profcol_testkit::tools::tool_available("containerd", &["--version"])
        && profcol_testkit::tools::tool_available("ctr", &["--version"])
        && profcol_testkit::tools::tool_available("runc", &["--version"])
        && profcol_testkit::tools::tool_available("/bin/busybox", &["true"]);
    if !tools {
        return;
    }
    let mut containerd = Containerd::start();
    let rootfs = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(rootfs.path().join("bin")).unwrap();
    std::fs::copy("/bin/busybox", rootfs.path().join("bin/busybox")).unwrap();

    // A fresh id each run: 64 hex digits as CRI makes them.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let id = format!("{:032x}{:016x}{:016x}", nanos, std::process::id(), 0xc0ffee_u64);
    let uid = "7f3c2a1e-5b6d-4e8f-9a0b-1c2d3e4f5a6b";
    let want = [
        (keys::K8S_POD_NAME, "shop-7d9"),
        (keys::K8S_NAMESPACE_NAME, "prod"),
        (keys::K8S_POD_UID, uid),
        (keys::K8S_CONTAINER_NAME, "api"),
        (keys::CONTAINER_IMAGE_NAME, "docker.io/library/busybox"),
        (keys::CONTAINER_ID, id.as_str()),
        (keys::CONTAINER_RUNTIME, "containerd"),
        (keys::SERVICE_NAME, "api"),
    ];
    let annotations = [
        ("io.kubernetes.cri.sandbox-name", "shop-7d9"),
        ("io.kubernetes.cri.sandbox-namespace", "prod"),
        ("io.kubernetes.cri.sandbox-uid", uid),
        ("io.kubernetes.cri.container-name", "api"),
        ("io.kubernetes.cri.image-name", "docker.io/library/busybox:1.36"),
        ("io.kubernetes.cri.container-type", "container"),
    ];
    let pid = containerd.run(&id, rootfs.path(), &annotations, &["/bin/busybox", "sh", "-c", "while :; do :; done"]);
    let mut host = Command::new("/bin/busybox").args(["sh", "-c", "while :; do :; done"]).spawn().expect("busybox");
    let host_pid = host.id();

    let running = start(EbpfConfig {
        sample_frequency: 99,
        report_interval: Duration::from_millis(500),
        pids: vec![pid, host_pid],
        service_name: vec![ServiceNameSource::K8sContainer, ServiceNameSource::Executable],
        ..Default::default()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (batches, metrics) = running.stop().await;

    // The same two processes, every process of the host sampled but for
    // `targets`: the pod's container in, the rest out in the kernel.
    let selected = start(EbpfConfig {
        sample_frequency: 99,
        report_interval: Duration::from_millis(500),
        targets: TargetsConfig {
            include: vec![Matcher {
                k8s_namespace: Some("prod".into()),
                k8s_pod: Some("shop-*".into()),
                k8s_container: Some("api".into()),
                ..Default::default()
            }],
            exclude: vec![],
        },
        ..Default::default()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (chosen, chosen_metrics) = selected.stop().await;
    let _ = host.kill();
    let _ = host.wait();
    drop(containerd);

    let inside = samples_of(&batches, pid);
    let n: usize = inside.iter().map(|s| s.count).sum();
    assert!(n >= 50, "too few samples of the container's process: {n}\n{metrics}");
    for s in &inside {
        let got = strings(&s.resource);
        for (k, v) in want {
            assert!(got.contains(&(k.to_owned(), v.to_owned())), "{k}={v} missing: {got:?}");
        }
    }
    let outside = samples_of(&batches, host_pid);
    let n: usize = outside.iter().map(|s| s.count).sum();
    assert!(n >= 50, "too few samples of the host process: {n}\n{metrics}");
    // The host process's own cgroup may name a container (the test itself
    // run in one): then that id, and still nothing of the pod.
    let own = procfs::container_id(&std::fs::read_to_string("/proc/self/cgroup").unwrap());
    for s in &outside {
        let got = strings(&s.resource);
        let id = got.iter().find(|(k, _)| k == keys::CONTAINER_ID).map(|(_, v)| v.clone());
        assert_eq!(id, own, "{got:?}");
        for k in [keys::K8S_POD_NAME, keys::K8S_NAMESPACE_NAME, keys::K8S_POD_UID, keys::K8S_CONTAINER_NAME] {
            assert!(got.iter().all(|(g, _)| g != k), "{k} on a host process: {got:?}");
        }
        assert!(got.contains(&(keys::SERVICE_NAME.into(), "busybox".into())), "{got:?}");
    }

    let n: usize = samples_of(&chosen, pid).iter().map(|s| s.count).sum();
    assert!(n >= 150, "too few samples of the selected container's process: {n}\n{chosen_metrics}");
    let n: usize = samples_of(&chosen, host_pid).iter().map(|s| s.count).sum();
    assert_eq!(n, 0, "the host process is outside the selection\n{chosen_metrics}");
    let filtered = metric(&chosen_metrics, "profcol_receiver_ebpf_samples_filtered_total");
    assert!(filtered >= 150.0, "{filtered} samples filtered in the kernel\n{chosen_metrics}");
}
