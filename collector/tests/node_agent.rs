//! The node agent as a user runs it (the real eBPF receiver and kernel
//! symbolizer in a started host) on a real program, `sha256sum` (Debian's
//! stripped binary, built without frame pointers), checked by what a backend
//! sees:
//!
//! - its flame graph has no phantom frame (no `0x0`, no sentinel, no
//!   `unknown`): stacks end at their last real frame, and an unnamed frame of
//!   the stripped binary is `sha256sum+0xOFFSET`, the offset in its file;
//!   Go's pprof reader finds no `<unknown>` frame in its pprof files;
//! - an OTLP server on the official Python stack sees `service.name` on
//!   every resource (from the process's environment when configured, else
//!   the executable's name), profcol's instrumentation scope on every scope,
//!   and samples without the CPU among their attributes.
//!
//! Root (or CAP_BPF + CAP_PERFMON) is needed: without it the tests are
//! skipped with a message, except under CI=true, where they fail.

mod common;

use common::service::{log, Host};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn require_bpf(test: &str) -> bool {
    profcol_testkit::tools::require(test, profcol_receivers::ebpf::bpf::privileges::Privileges::current().check())
}

/// `sha256sum /dev/zero`: hashes until killed, nearly all of it in the
/// stripped binary's own code, the rest reading /dev/zero.
fn sha256sum(env: &[(&str, &str)]) -> Child {
    Command::new("sha256sum")
        .arg("/dev/zero")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .spawn()
        .expect("sha256sum (coreutils) runs")
}

/// CPU seconds process `pid` has used (utime + stime of /proc/PID/stat).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesized comm: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = rest.split(' ').skip(11).take(2).map(|x| x.parse().unwrap()).collect();
    // SAFETY: sysconf has no preconditions.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (f[0] + f[1]) as f64 / tck
}

/// Waits until every process in `pids` has used `seconds` of CPU (the host
/// is shared: wall time says little), at most 30 s.
async fn burn_cpu(pids: &[u32], seconds: f64) {
    let t0 = Instant::now();
    while pids.iter().any(|&p| cpu_seconds(p) < seconds) {
        assert!(t0.elapsed() < Duration::from_secs(30), "sha256sum got less than {seconds} s of CPU in 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The file range `[offset, offset + len)` of the executable mapping of
/// `/usr/bin/sha256sum` in process `pid`.
fn text_range(pid: u32) -> (u64, u64) {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 6 || !f[1].contains('x') || !f[5].ends_with("/sha256sum") {
                return None;
            }
            let (s, e) = f[0].split_once('-')?;
            let (s, e) = (u64::from_str_radix(s, 16).ok()?, u64::from_str_radix(e, 16).ok()?);
            let off = u64::from_str_radix(f[2], 16).ok()?;
            Some((off, off + (e - s)))
        })
        .unwrap_or_else(|| panic!("no executable mapping of sha256sum in:\n{maps}"))
}

/// The folded lines (stack → count) of every flame graph written for `pid`.
fn folded_of(dir: &Path, pid: u32) -> BTreeMap<String, u64> {
    let mut lines = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(&format!("-pid-{pid}.folded")) {
            continue;
        }
        for l in std::fs::read_to_string(&p).unwrap().lines() {
            let (stack, n) = l.rsplit_once(' ').unwrap();
            *lines.entry(stack.to_owned()).or_insert(0) += n.parse::<u64>().unwrap();
        }
    }
    lines
}

#[test]
fn a_flame_graph_of_sha256sum_has_no_phantom_frame() {
    if !require_bpf("a_flame_graph_of_sha256sum_has_no_phantom_frame") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        log();
        let dir = tempfile::tempdir().unwrap();
        let yaml = format!(
            "receivers:\n  ebpf:\n    sample_frequency: 199\n    report_interval: 1s\n\
             processors:\n  kernel_symbols:\n\
             exporters:\n  flamegraph:\n    directory: {d}\n    folded: true\n    group_by: process\n\
             \x20 pprof:\n    directory: {d}\n    group_by: process\n\
             service:\n  telemetry:\n    metrics:\n      address: \"\"\n\
             \x20 pipelines:\n    profiles:\n      receivers: [ebpf]\n      processors: [kernel_symbols]\n\
             \x20     exporters: [flamegraph, pprof]\n",
            d = dir.path().display()
        );
        let mut host = Host::start(&yaml).await;
        let mut child = sha256sum(&[]);
        let pid = child.id();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (text_start, text_end) = text_range(pid);
        burn_cpu(&[pid], 1.5).await;
        child.kill().unwrap();
        child.wait().unwrap();
        // The interval it ended in is reported within report_interval.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        host.service.shutdown().await;

        let lines = folded_of(dir.path(), pid);
        let total: u64 = lines.values().sum();
        assert!(total >= 150, "{total} samples of sha256sum in 1.5 CPU seconds at 199 Hz: {lines:#?}");
        let (mut in_binary, mut named_offsets, mut in_exec) = (0u64, BTreeSet::new(), 0u64);
        for (stack, n) in &lines {
            let frames: Vec<&str> = stack.split(';').collect();
            // The child in its execve: its user registers are the spawning
            // thread's until the syscall returns. Before the point of no
            // return that is the spawning thread's name and image (the
            // spawn shares the test's memory); after it, sha256sum's name
            // over an image the old addresses are not in. Only that, and
            // only a few samples.
            if frames.iter().any(|f| f.starts_with("__x64_sys_execve")) {
                in_exec += n;
                continue;
            }
            assert_eq!(frames[0], "sha256sum", "rooted at the thread name: {stack}");
            for f in &frames[1..] {
                assert!(!f.contains("unknown"), "an `unknown` frame: {stack}");
                assert!(!f.starts_with("0x") && !f.ends_with("+0x0"), "a frame without a real address: {stack}");
                if f.ends_with("_[k]") {
                    continue;
                }
                // A user frame: binary basename + offset in its file, nothing unnamed.
                let (base, off) = f.split_once("+0x").unwrap_or_else(|| panic!("frame {f:?} in {stack}"));
                let off = u64::from_str_radix(off, 16).unwrap_or_else(|_| panic!("frame {f:?} in {stack}"));
                assert!(
                    ["sha256sum", "libc.so.6", "ld-linux-x86-64.so.2", "[vdso]"].contains(&base),
                    "frame {f:?} of an unexpected mapping in {stack}"
                );
                if base == "sha256sum" {
                    assert!(
                        (text_start..text_end).contains(&off),
                        "{f}: not in sha256sum's code [{text_start:#x}, {text_end:#x}) of the file"
                    );
                    named_offsets.insert(off);
                }
            }
            if frames.last().is_some_and(|f| f.starts_with("sha256sum+0x")) {
                in_binary += n;
            }
        }
        assert!(in_exec * 20 <= total, "{in_exec} of {total} samples in execve");
        assert!(in_binary * 2 > total, "most samples hash in sha256sum's own code: {in_binary} of {total}");
        assert!(named_offsets.len() > 3, "{named_offsets:x?}");
        // The SVG says the same.
        let svg: String = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(&format!("-pid-{pid}.svg")))
            .map(|p| std::fs::read_to_string(p).unwrap())
            .collect();
        assert!(svg.contains("sha256sum+0x") && !svg.contains("unknown"), "the flame graph SVG");
        // And Go's pprof reader, on the pprof files of the same run: every
        // frame in a mapping, none `<unknown>` (a frame at 0x0).
        if profcol_testkit::tools::tool_available("go", &["version"]) {
            let mut traces = String::new();
            for e in std::fs::read_dir(dir.path()).unwrap() {
                let p = e.unwrap().path();
                if !p.to_string_lossy().ends_with(&format!("-pid-{pid}.pb.gz")) {
                    continue;
                }
                let out = Command::new("go")
                    .args(["tool", "pprof", "-traces", "-symbolize=none"])
                    .arg(&p)
                    .output()
                    .expect("go tool pprof");
                assert!(out.status.success(), "go tool pprof: {}", String::from_utf8_lossy(&out.stderr));
                traces.push_str(&String::from_utf8_lossy(&out.stdout));
            }
            assert!(traces.contains("[sha256sum]"), "{traces}");
            // Trace by trace, leaving out the child in its execve as above
            // (its user frame is the spawning thread's code, in no mapping
            // of sha256sum's image).
            let in_execve = |t: &str| t.contains("__x64_sys_execve");
            let unknown: Vec<&str> =
                traces.split("-----------+").filter(|t| t.contains("<unknown>") && !in_execve(t)).collect();
            assert!(unknown.is_empty(), "a frame at no address in:\n{}", unknown.join("\n---\n"));
        }
    });
}

/// One request as the Python server reported it.
struct Seen {
    service_names: Vec<String>,
    scopes: Vec<String>,
    sample_attribute_keys: Vec<String>,
}

#[test]
fn an_otlp_server_sees_service_name_and_scope_on_every_resource() {
    use profcol_testkit::py_otlp::PyOtlpServer;
    if !require_bpf("an_otlp_server_sees_service_name_and_scope_on_every_resource") || !PyOtlpServer::available() {
        return;
    }
    let py = PyOtlpServer::start(&[]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let seen = rt.block_on(async {
        log();
        let yaml = format!(
            "receivers:\n  ebpf:\n    sample_frequency: 99\n    report_interval: 1s\n\
             \x20   service_name: [env:PROFCOL_TEST_SERVICE, executable]\n\
             processors:\n  kernel_symbols:\n  batch:\n    timeout: 200ms\n\
             exporters:\n  otlp:\n    endpoint: http://127.0.0.1:{}\n\
             service:\n  telemetry:\n    metrics:\n      address: \"\"\n\
             \x20 pipelines:\n    profiles:\n      receivers: [ebpf]\n      processors: [kernel_symbols, batch]\n\
             \x20     exporters: [otlp]\n",
            py.grpc_port
        );
        let mut host = Host::start(&yaml).await;
        let mut named = sha256sum(&[("PROFCOL_TEST_SERVICE", "hasher")]);
        let mut plain = sha256sum(&[]);
        burn_cpu(&[named.id(), plain.id()], 0.5).await;
        for c in [&mut named, &mut plain] {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        host.service.shutdown().await;
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Ok(l) = py.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            let v: serde_json::Value = serde_json::from_str(&l).unwrap();
            let list = |k: &str| -> Vec<String> {
                v[k].as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_owned()).collect()
            };
            seen.push(Seen {
                service_names: list("service_names"),
                scopes: list("scopes"),
                sample_attribute_keys: list("sample_attribute_keys"),
            });
        }
        seen
    });
    assert!(seen.len() >= 2, "{} requests", seen.len());
    let scope = format!("profcol/{}", env!("CARGO_PKG_VERSION"));
    let mut services = BTreeSet::new();
    for (i, r) in seen.iter().enumerate() {
        assert!(!r.service_names.is_empty(), "request {i} has no resource");
        assert!(r.service_names.iter().all(|s| !s.is_empty()), "request {i}: a resource without service.name");
        assert!(r.scopes.iter().all(|s| *s == scope), "request {i}: scopes {:?}", r.scopes);
        // Default sample attributes: thread id and name, not the CPU; and
        // `profcol.unwind.end` on stacks whose walk stopped early (a
        // process's first samples, before its unwind tables are loaded).
        for k in &r.sample_attribute_keys {
            assert!(
                ["thread.id", "thread.name", "profcol.unwind.end"].contains(&k.as_str()),
                "request {i}: sample attribute {k}"
            );
        }
        services.extend(r.service_names.iter().cloned());
    }
    // From the environment where the process sets it, else the executable.
    assert!(services.contains("hasher") && services.contains("sha256sum"), "{services:?}");
}
