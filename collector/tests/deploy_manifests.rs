//! The Kubernetes manifests (deploy/kubernetes): every overlay renders with
//! `kubectl kustomize`, validates strictly against the Kubernetes 1.30
//! schemas (PyPI kubernetes-validate), and every profcol config a pod mounts
//! from a ConfigMap passes `profcol validate` with the environment the pod
//! spec gives it (literal values as written, envFrom ConfigMaps as rendered,
//! downward-API values as placeholders). Tools: .ci/deploy.sh.

mod common;

use profcol_testkit::tools::tool_available;
use serde::Deserialize;
use serde_yaml::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const KUBERNETES_VERSION: &str = "1.30.0";

fn kubernetes_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

fn render(overlay: &Path) -> String {
    let out = Command::new("kubectl").arg("kustomize").arg(overlay).output().expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed:\n{}",
        overlay.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 YAML")
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(*k))?.as_str()
}

fn seq<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> {
    v.get(key).and_then(Value::as_sequence).into_iter().flatten()
}

/// The environment a container gets: `env` (values as written, `valueFrom`
/// as a placeholder) and `envFrom` ConfigMaps (their rendered data).
fn container_env(c: &Value, config_maps: &BTreeMap<String, Value>) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for from in seq(c, "envFrom") {
        let name = str_at(from, &["configMapRef", "name"]).expect("envFrom names a ConfigMap (no Secrets by default)");
        let data = config_maps.get(name).unwrap_or_else(|| panic!("envFrom {name}: no such ConfigMap rendered"));
        for (k, v) in data.get("data").and_then(Value::as_mapping).into_iter().flatten() {
            env.insert(k.as_str().unwrap().to_owned(), v.as_str().unwrap_or_default().to_owned());
        }
    }
    for e in seq(c, "env") {
        let name = str_at(e, &["name"]).unwrap().to_owned();
        let value = match str_at(e, &["value"]) {
            Some(v) => v.to_owned(),
            None => format!("placeholder-{}", name.to_lowercase().replace('_', "-")),
        };
        env.insert(name, value);
    }
    env
}

/// What one overlay's pods run: (workload kind/name, container, config text, env).
struct PodConfig {
    workload: String,
    config: String,
    env: BTreeMap<String, String>,
}

fn pod_configs(docs: &[Value]) -> Vec<PodConfig> {
    let config_maps: BTreeMap<String, Value> = docs
        .iter()
        .filter(|d| str_at(d, &["kind"]) == Some("ConfigMap"))
        .map(|d| (str_at(d, &["metadata", "name"]).unwrap().to_owned(), d.clone()))
        .collect();
    let mut out = Vec::new();
    for d in docs {
        let kind = str_at(d, &["kind"]).unwrap_or_default();
        if !matches!(kind, "DaemonSet" | "StatefulSet" | "Deployment") {
            continue;
        }
        let workload = format!("{kind}/{}", str_at(d, &["metadata", "name"]).unwrap());
        let spec = &d["spec"]["template"]["spec"];
        let volumes: BTreeMap<&str, &str> = seq(spec, "volumes")
            .filter_map(|v| Some((str_at(v, &["name"])?, str_at(v, &["configMap", "name"])?)))
            .collect();
        for c in seq(spec, "containers") {
            let env = container_env(c, &config_maps);
            for m in seq(c, "volumeMounts") {
                let Some(cm) = str_at(m, &["name"]).and_then(|n| volumes.get(n)) else { continue };
                let data =
                    config_maps.get(*cm).unwrap_or_else(|| panic!("{workload} mounts ConfigMap {cm}, not rendered"));
                for (key, text) in data["data"].as_mapping().into_iter().flatten() {
                    if key.as_str().is_some_and(|k| k.ends_with(".yaml")) {
                        let config = text.as_str().unwrap().to_owned();
                        out.push(PodConfig { workload: workload.clone(), config, env: env.clone() });
                    }
                }
            }
        }
    }
    out
}

fn profcol_validate(dir: &Path, name: &str, pc: &PodConfig) {
    let path = common::write(&dir.join(name), &pc.config);
    let out = Command::new(common::bin())
        .arg("validate")
        .arg("--config")
        .arg(&path)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(&pc.env)
        .output()
        .expect("profcol validate runs");
    assert!(
        out.status.success(),
        "{}: its config does not validate with env {:?}:\n{}\n{}",
        pc.workload,
        pc.env,
        String::from_utf8_lossy(&out.stderr),
        pc.config
    );
}

#[test]
fn every_overlay_renders_validates_against_kubernetes_1_30_and_its_profcol_configs_validate() {
    if !tool_available("kubectl", &["version", "--client"]) || !tool_available("kubernetes-validate", &["--version"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let overlays = ["agent", "gateway", "fleet"];
    for overlay in overlays {
        let rendered = render(&kubernetes_dir().join("overlays").join(overlay));
        let file = common::write(&dir.path().join(format!("{overlay}.yaml")), &rendered);
        let out = Command::new("kubernetes-validate")
            .args(["--strict", "--quiet", "-k", KUBERNETES_VERSION])
            .arg(&file)
            .output()
            .expect("kubernetes-validate runs");
        assert!(
            out.status.success(),
            "overlay {overlay} does not validate against Kubernetes {KUBERNETES_VERSION} (strict):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );

        let docs: Vec<Value> =
            serde_yaml::Deserializer::from_str(&rendered).map(|d| Value::deserialize(d).unwrap()).collect();
        let configs = pod_configs(&docs);
        let workloads: Vec<&str> = configs.iter().map(|c| c.workload.as_str()).collect();
        let want: &[&str] = match overlay {
            "agent" => &["DaemonSet/profcol-agent"],
            "gateway" => &["StatefulSet/profcol-gateway"],
            _ => &["StatefulSet/profcol-gateway", "DaemonSet/profcol-agent"],
        };
        assert_eq!(workloads, want, "overlay {overlay}: the profcol configs its pods mount");
        for (i, pc) in configs.iter().enumerate() {
            profcol_validate(dir.path(), &format!("{overlay}-{i}.yaml"), pc);
        }
        if overlay == "fleet" {
            let agent = configs.iter().find(|c| c.workload.starts_with("DaemonSet")).unwrap();
            assert!(agent.config.contains("balancer:"), "fleet agents balance over the gateways");
            let host = &agent.env["PROFCOL_GATEWAY_HOSTNAME"];
            let headless = docs
                .iter()
                .find(|d| str_at(d, &["kind"]) == Some("Service") && str_at(d, &["spec", "clusterIP"]) == Some("None"));
            assert_eq!(headless.and_then(|d| str_at(d, &["metadata", "name"])), Some(host.as_str()));
        }
        assert_pod_security(overlay, &docs);
    }
}

/// What the issue asks of the pods: the agent not privileged, with hostPID,
/// a read-only root and named capabilities; the gateway non-root.
fn assert_pod_security(overlay: &str, docs: &[Value]) {
    for d in docs {
        let kind = str_at(d, &["kind"]).unwrap_or_default();
        let spec = &d["spec"]["template"]["spec"];
        let c = &spec["containers"][0];
        match kind {
            "DaemonSet" => {
                assert_eq!(spec["hostPID"].as_bool(), Some(true), "{overlay}: the agent sees the node's processes");
                assert_eq!(c["securityContext"]["privileged"].as_bool(), Some(false));
                assert_eq!(c["securityContext"]["readOnlyRootFilesystem"].as_bool(), Some(true));
                let add: Vec<&str> =
                    seq(&c["securityContext"]["capabilities"], "add").filter_map(Value::as_str).collect();
                assert!(add.contains(&"BPF") && add.contains(&"PERFMON") && !add.contains(&"SYS_ADMIN"), "{add:?}");
                assert!(seq(spec, "tolerations").any(|t| str_at(t, &["operator"]) == Some("Exists")));
                // Container identity: each runtime's state, read-only, no socket.
                for path in [
                    "/run/containerd/io.containerd.runtime.v2.task",
                    "/run/containers/storage/overlay-containers",
                    "/var/lib/docker/containers",
                ] {
                    let m = seq(c, "volumeMounts").find(|m| str_at(m, &["mountPath"]) == Some(path));
                    let m = m.unwrap_or_else(|| panic!("{overlay}: the agent mounts {path}"));
                    assert_eq!(m["readOnly"].as_bool(), Some(true), "{overlay}: {path}");
                    assert_eq!(str_at(m, &["mountPropagation"]), Some("HostToContainer"), "{overlay}: {path}");
                }
            }
            "StatefulSet" => {
                assert_eq!(spec["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
                assert_eq!(c["securityContext"]["readOnlyRootFilesystem"].as_bool(), Some(true));
                let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
                assert!(grace > 10, "longer than the receivers' 10 s wait for requests in flight: {grace}");
            }
            _ => {}
        }
    }
}
