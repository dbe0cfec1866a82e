//! JIT frames named from the perf maps runtimes write, held against the
//! runtimes' own profilers.
//!
//! - Node.js (`--perf-basic-prof`) runs two hot JavaScript functions of
//!   unequal cost while node's own `--cpu-prof` profiles the same run:
//!   at least 90% of profcol's main-thread samples whose leaf is JIT code
//!   have it named; each function's share of the samples is `--cpu-prof`'s
//!   within 5 points; the frames carry the function's file and line.
//! - Node.js (`--perf-prof`, a jitdump and no perf map): at least 90% of
//!   the main-thread JIT leaves named; the hot function's frames carry
//!   lines inside its body, per instruction, not only its first line.
//! - Java 17 runs a hot method: before its map exists its JIT frames are
//!   sampled and left unnamed (never misnamed); once `jcmd PID
//!   Compiler.perfmap` wrote the map, the method names at least 90% of the
//!   samples whose leaf is JIT code. A second JVM gets its map from the
//!   receiver itself (`jit.jvm_perfmap: attach`).
//!
//! profcol's pprof files are read with Go's pprof reader (`go tool pprof
//! -raw`), in the embedded default's counting mode (stacks counted in the
//! kernel are named at the report like the rest).
//!
//! Needs root, Go, node and a JDK (javac, jcmd); without them it is skipped
//! with a message, except under CI=true. About a minute.
//!
//!     sudo -E cargo test -p profcol --test jit_frames -- --nocapture

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use profcol_testkit::pprof_raw::{profcol_stacks, Stack};
use profcol_testkit::tools::{require, tool_available};

/// A child killed if the test ends first.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
        // A JVM killed leaves its attach socket behind.
        let _ = std::fs::remove_file(format!("/tmp/.java_pid{}", self.0.id()));
    }
}

/// `cmd` started with its stdout piped, once it printed "ready".
fn spawn_ready(cmd: &mut Command) -> KillOnDrop {
    let mut child = KillOnDrop(cmd.stdout(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("{cmd:?}: {e}")));
    let mut first = String::new();
    BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert_eq!(first.trim(), "ready", "{cmd:?} did not start its workload");
    child
}

/// Removes a process's perf map when the test ends.
struct MapFile(PathBuf);

impl Drop for MapFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn can_run(test: &str, tools: &[(&str, &[&str])]) -> bool {
    if !require(test, profcol_receivers::ebpf::bpf::privileges::Privileges::current().check()) {
        return false;
    }
    tools.iter().all(|(cmd, args)| tool_available(cmd, args))
}

/// profcol sampling `pid` at 99 Hz in counting mode, writing pprof files
/// to `profiles` and OTLP JSON to `otlp.jsonl` every 2 s (or as
/// `start_every` says); `extra` goes into
/// the receiver's section.
struct Agent {
    child: KillOnDrop,
    log: PathBuf,
    profiles: PathBuf,
}

impl Agent {
    fn start(dir: &Path, pid: u32, extra: &str) -> Agent {
        let agent = Agent::start_every(dir, pid, extra, "2s");
        agent.wait_for_reports(1);
        agent
    }

    /// Reports every `interval`; returns once it samples.
    fn start_every(dir: &Path, pid: u32, extra: &str, interval: &str) -> Agent {
        let profiles = dir.join("profiles");
        let config = dir.join("profcol.yaml");
        std::fs::write(
            &config,
            format!(
                "receivers:\n  ebpf:\n    sample_frequency: 99\n    report_interval: {interval}\n\
                 \x20   count_in_kernel: true\n    pids: [{pid}]\n{extra}\
                 exporters:\n  pprof:\n    directory: {}\n  file:\n    path: {}\n\
                 service:\n  telemetry:\n    metrics:\n      address: \"\"\n\
                 \x20 pipelines:\n    profiles:\n      receivers: [ebpf]\n      exporters: [pprof, file]\n",
                profiles.display(),
                dir.join("otlp.jsonl").display()
            ),
        )
        .unwrap();
        let log = dir.join("profcol.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = KillOnDrop(
            Command::new(env!("CARGO_BIN_EXE_profcol"))
                .arg("--config")
                .arg(&config)
                .stdout(out.try_clone().unwrap())
                .stderr(out)
                .spawn()
                .expect("start profcol"),
        );
        let agent = Agent { child, log, profiles };
        let t0 = Instant::now();
        while !agent.log_text().contains("profcol started") {
            assert!(t0.elapsed() < Duration::from_secs(60), "not started in 60 s:\n{}", agent.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
        agent
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn reports(&self) -> usize {
        std::fs::read_dir(&self.profiles).map(|d| d.count()).unwrap_or(0)
    }

    /// Waits until `n` report files are written (60 s at most).
    fn wait_for_reports(&self, n: usize) {
        let t0 = Instant::now();
        while self.reports() < n {
            assert!(t0.elapsed() < Duration::from_secs(60), "fewer than {n} reports in 60 s:\n{}", self.log_text());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// SIGTERM; the last report is written on the way out.
    fn stop(mut self) -> PathBuf {
        // SAFETY: kill() with a child's pid and SIGTERM has no memory effects.
        unsafe { libc::kill(self.child.0.id() as i32, libc::SIGTERM) };
        let status = self.child.0.wait().unwrap();
        assert!(status.success(), "profcol: {status}\n{}", self.log_text());
        self.profiles.clone()
    }
}

/// Whether a frame's mapping is anonymous executable memory (JIT code).
fn in_jit_code(mapping: &str) -> bool {
    mapping == "[anon]"
}

/// (JIT-leaf samples, of them named) among `stacks`.
fn jit_leaves<'a>(stacks: impl IntoIterator<Item = &'a Stack>) -> (u64, u64) {
    let mut all = 0;
    let mut named = 0;
    for s in stacks {
        let Some(leaf) = s.frames.first() else { continue };
        if in_jit_code(&leaf.mapping) {
            all += s.count;
            if !leaf.name.is_empty() {
                named += s.count;
            }
        }
    }
    (all, named)
}

fn pct(n: u64, all: u64) -> f64 {
    if all == 0 {
        0.0
    } else {
        100.0 * n as f64 / all as f64
    }
}

/// Waits for `node` to exit and stops `agent`; returns the stacks of
/// node's main thread, checked: at least 300 samples with a JIT leaf, 90%
/// of them named.
fn node_main_thread(node: &mut KillOnDrop, agent: Agent) -> Vec<Stack> {
    let pid = node.0.id();
    let status = node.0.wait().unwrap();
    assert!(status.success(), "node: {status}");
    // Node's last samples go out at the next report or at the stop.
    std::thread::sleep(Duration::from_secs(1));
    let profiles = agent.stop();
    let (mut by_pid, files) = profcol_stacks(&profiles);
    let main: Vec<Stack> = by_pid.remove(&pid).unwrap_or_default().into_iter().filter(|s| s.tid == pid).collect();
    let all: u64 = main.iter().map(|s| s.count).sum();
    let (jit, named) = jit_leaves(main.iter());
    eprintln!("{files} reports; node main thread: {all} samples, {jit} with a JIT leaf, {named} named");
    assert!(jit >= 300, "too few JIT samples to judge: {jit} of {all}");
    assert!(pct(named, jit) >= 90.0, "JIT leaves named: {:.1}% ({named} of {jit})", pct(named, jit));
    main
}

const NODE_WORKLOAD: &str = r#"
function hotLoop(n) { let s = 0; for (let i = 0; i < n; i++) { s = (s + i * i) % 1000003; } return s; }
function warmLoop(n) { let s = 1; for (let i = 0; i < n; i++) { s = (s * 31 + i) % 999983; } return s; }
class Shape {
  constructor(k) { this.k = k; }
  area(n) { let s = 0; for (let i = 0; i < n; i++) { s = (s + this.k * i) % 65521; } return s; }
}
const end = Date.now() + Number(process.argv[2]) * 1000;
const shape = new Shape(7);
let acc = 0;
console.log("ready");
while (Date.now() < end) { acc += hotLoop(2000000); acc += warmLoop(1000000); acc += shape.area(1500000); }
console.log(acc);
"#;

/// The lines of `NODE_WORKLOAD` where each function starts (1-based).
fn line_of(source: &str, needle: &str) -> u64 {
    source.lines().position(|l| l.contains(needle)).expect("in the workload") as u64 + 1
}

/// Per function, the share of samples (%) whose stack holds it, from a
/// `.cpuprofile` (nodes with parents' `children`, `samples` of node ids).
fn cpu_prof_shares(path: &Path, functions: &[&str]) -> (BTreeMap<String, f64>, usize) {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).expect("a .cpuprofile");
    let nodes = v["nodes"].as_array().expect("nodes");
    let mut name = BTreeMap::new();
    let mut parent = BTreeMap::new();
    for n in nodes {
        let id = n["id"].as_u64().unwrap();
        name.insert(id, n["callFrame"]["functionName"].as_str().unwrap_or("").to_owned());
        for c in n["children"].as_array().into_iter().flatten() {
            parent.insert(c.as_u64().unwrap(), id);
        }
    }
    let samples: Vec<u64> = v["samples"].as_array().expect("samples").iter().filter_map(|s| s.as_u64()).collect();
    // Idle time is no CPU sample: profcol's are on-CPU only.
    let busy: Vec<u64> =
        samples.iter().copied().filter(|s| name.get(s).map(String::as_str) != Some("(idle)")).collect();
    let mut shares = BTreeMap::new();
    for f in functions {
        let holding = busy
            .iter()
            .filter(|&&s| {
                let mut at = Some(s);
                while let Some(id) = at {
                    if name.get(&id).map(String::as_str) == Some(*f) {
                        return true;
                    }
                    at = parent.get(&id).copied();
                }
                false
            })
            .count();
        shares.insert(f.to_string(), 100.0 * holding as f64 / busy.len().max(1) as f64);
    }
    (shares, busy.len())
}

#[test]
fn node_frames_match_cpu_prof() {
    let test = "node_frames_match_cpu_prof";
    if !can_run(test, &[("go", &["version"]), ("node", &["--version"])]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("work.js");
    std::fs::write(&script, NODE_WORKLOAD).unwrap();
    let cpu_prof_dir = dir.path().join("cpuprof");
    let mut node = spawn_ready(
        Command::new("node")
            .args(["--perf-basic-prof", "--cpu-prof"])
            .arg(format!("--cpu-prof-dir={}", cpu_prof_dir.display()))
            .arg(&script)
            .arg("16")
            // --perf-basic-prof also writes isolate-*-v8.log in its working directory.
            .current_dir(dir.path()),
    );
    let pid = node.0.id();
    let _map = MapFile(PathBuf::from(format!("/tmp/perf-{pid}.map")));

    let agent = Agent::start(dir.path(), pid, "");
    // node's own profile is of its main thread: so is this comparison.
    let main = node_main_thread(&mut node, agent);
    let all: u64 = main.iter().map(|s| s.count).sum();

    let functions = ["hotLoop", "warmLoop", "area"];
    let cpu_prof = std::fs::read_dir(&cpu_prof_dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "cpuprofile"))
        .expect("node wrote its .cpuprofile");
    let (theirs, their_n) = cpu_prof_shares(&cpu_prof, &functions);
    let mut failures = Vec::new();
    eprintln!("{:<10} {:>9} {:>9}   (profcol {all} samples, --cpu-prof {their_n})", "function", "profcol", "cpu-prof");
    for f in functions {
        let ours =
            pct(main.iter().filter(|s| s.frames.iter().any(|fr| fr.name == f)).map(|s| s.count).sum::<u64>(), all);
        let t = theirs[f];
        eprintln!("{f:<10} {ours:>8.1}% {t:>8.1}%");
        if (ours - t).abs() > 5.0 {
            failures.push(format!("{f}: profcol {ours:.1}%, --cpu-prof {t:.1}%"));
        }
    }
    // Each function's frames say where it is written.
    for (f, needle) in [("hotLoop", "function hotLoop"), ("warmLoop", "function warmLoop"), ("area", "  area(n)")] {
        let want = line_of(NODE_WORKLOAD, needle);
        let frame = main.iter().flat_map(|s| &s.frames).find(|fr| fr.name == f);
        match frame {
            Some(fr) if fr.file == script.to_str().unwrap() && fr.line == want => {}
            other => failures.push(format!(
                "{f}: want {}:{want}, got {:?}",
                script.display(),
                other.map(|fr| (&fr.file, fr.line))
            )),
        }
    }
    // In OTLP, JavaScript frames are `v8js` frames.
    let locations = profcol_testkit::otlp_file::locations(&dir.path().join("otlp.jsonl"));
    let js: Vec<_> = locations.iter().filter(|l| l.lines.iter().any(|(_, file)| file.ends_with("work.js"))).collect();
    let wrong: Vec<_> = js.iter().filter(|l| l.frame_type != "v8js").collect();
    if js.is_empty() || !wrong.is_empty() {
        failures.push(format!("{} JavaScript locations in OTLP, not v8js: {:?}", js.len(), wrong.first()));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

const NODE_JITDUMP_WORKLOAD: &str = r#"
function hotLoop(n) {
  let s = 0;
  for (let i = 0; i < n; i++) {
    s = (s + i * i) % 1000003;
  }
  return s;
}
const end = Date.now() + Number(process.argv[2]) * 1000;
let acc = 0;
console.log("ready");
while (Date.now() < end) { acc += hotLoop(2000000); }
console.log(acc);
"#;

#[test]
fn node_jitdump_frames_carry_lines_inside_functions() {
    let test = "node_jitdump_frames_carry_lines_inside_functions";
    if !can_run(test, &[("go", &["version"]), ("node", &["--version"])]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("work.js");
    std::fs::write(&script, NODE_JITDUMP_WORKLOAD).unwrap();
    // Node writes jit-PID.dump in its working directory.
    let mut node = spawn_ready(Command::new("node").arg("--perf-prof").arg(&script).arg("10").current_dir(dir.path()));
    let pid = node.0.id();
    let map = MapFile(PathBuf::from(format!("/tmp/perf-{pid}.map")));
    assert!(dir.path().join(format!("jit-{pid}.dump")).exists(), "node wrote its jitdump");

    // V8 writes its jitdump through a 4 KiB buffer: the hot function's
    // records, among the last, reach the file as node exits. The one
    // report, built after that, is named from all of it.
    let agent = Agent::start_every(dir.path(), pid, "", "120s");
    let main = node_main_thread(&mut node, agent);
    assert!(!map.0.exists(), "no perf map: named from the jitdump alone");

    let start = line_of(NODE_JITDUMP_WORKLOAD, "function hotLoop");
    let close = start + 6;
    let mut lines: BTreeMap<u64, u64> = BTreeMap::new();
    for s in &main {
        for fr in s.frames.iter().filter(|fr| fr.name == "hotLoop") {
            assert_eq!(fr.file, script.to_str().unwrap(), "hotLoop's file");
            *lines.entry(fr.line).or_default() += s.count;
        }
    }
    eprintln!("hotLoop (lines {start}..={close}): samples by line {lines:?}");
    assert!(lines.keys().all(|l| (start..=close).contains(l)), "lines outside hotLoop: {lines:?}");
    let inside: u64 = lines.iter().filter(|(l, _)| (start + 1..close).contains(*l)).map(|(_, n)| n).sum();
    let total: u64 = lines.values().sum();
    assert!(total >= 100, "too few hotLoop samples: {lines:?}");
    assert!(pct(inside, total) >= 50.0, "most of hotLoop's samples on lines inside its body: {lines:?}");
}

const JAVA_WORKLOAD: &str = r#"
package com.example;
public class Hot {
    static long work(int n) {
        long s = 0;
        for (int i = 0; i < n; i++) { s = (s + (long) i * i) % 1000003L; }
        return s;
    }
    public static void main(String[] a) throws Exception {
        long end = System.currentTimeMillis() + Long.parseLong(a[0]);
        long x = 0;
        System.out.println("ready");
        System.out.flush();
        while (System.currentTimeMillis() < end) x += work(200000);
        System.out.println(x);
    }
}
"#;

const JAVA_METHOD: &str = "com.example.Hot.work";

/// `Hot.java` compiled into `dir/classes`.
fn compile_java(dir: &Path) -> PathBuf {
    let src = dir.join("Hot.java");
    std::fs::write(&src, JAVA_WORKLOAD).unwrap();
    let classes = dir.join("classes");
    let out = Command::new("javac").arg("-d").arg(&classes).arg(&src).output().expect("javac");
    assert!(out.status.success(), "javac: {}", String::from_utf8_lossy(&out.stderr));
    classes
}

/// A JVM running the workload for `seconds`, past its start.
fn start_java(classes: &Path, seconds: u64) -> KillOnDrop {
    spawn_ready(Command::new("java").arg("-cp").arg(classes).arg("com.example.Hot").arg((seconds * 1000).to_string()))
}

/// (JIT-leaf samples, those named `JAVA_METHOD`, those named anything)
/// of `pid` in the pprof files of `profiles` written `reports` (the first
/// is 0).
fn java_leaves(profiles: &Path, pid: u32, reports: impl std::ops::RangeBounds<usize>) -> (u64, u64, u64) {
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(profiles).unwrap().filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    let chosen = tempfile::tempdir().unwrap();
    for (_, f) in files.iter().enumerate().filter(|(i, _)| reports.contains(i)) {
        std::fs::copy(f, chosen.path().join(f.file_name().unwrap())).unwrap();
    }
    let (by_pid, _) = profcol_stacks(chosen.path());
    let stacks: &[Stack] = by_pid.get(&pid).map(Vec::as_slice).unwrap_or(&[]);
    let (jit, named) = jit_leaves(stacks);
    let method = stacks
        .iter()
        .filter(|s| s.frames.first().is_some_and(|f| in_jit_code(&f.mapping) && f.name == JAVA_METHOD))
        .map(|s| s.count)
        .sum();
    (jit, method, named)
}

#[test]
fn java_frames_are_named_once_jcmd_wrote_the_map() {
    let test = "java_frames_are_named_once_jcmd_wrote_the_map";
    if !can_run(test, &[("go", &["version"]), ("javac", &["-version"]), ("jcmd", &["-h"])]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let classes = compile_java(dir.path());
    let mut java = start_java(&classes, 30);
    let pid = java.0.id();
    let map = MapFile(PathBuf::from(format!("/tmp/perf-{pid}.map")));
    let _ = std::fs::remove_file(&map.0);

    let agent = Agent::start(dir.path(), pid, "");
    // Reports before the map: JIT code sampled, nothing to name it with.
    agent.wait_for_reports(3);
    let before = agent.reports();
    let out = Command::new("jcmd").arg(pid.to_string()).arg("Compiler.perfmap").output().expect("jcmd");
    assert!(out.status.success(), "jcmd: {}", String::from_utf8_lossy(&out.stderr));
    assert!(map.0.exists(), "jcmd wrote no map");
    // One report that may hold samples from before the map, then 8 s.
    agent.wait_for_reports(before + 5);
    let _ = java.0.kill();
    let profiles = agent.stop();

    let (jit0, _, named0) = java_leaves(&profiles, pid, ..before);
    let (jit, method, _) = java_leaves(&profiles, pid, before + 1..);
    eprintln!(
        "before the map: {jit0} JIT-leaf samples, {named0} named; after: {jit} JIT-leaf samples, {method} in {JAVA_METHOD}"
    );
    assert!(jit0 > 0, "no JIT samples before the map: the check below proves nothing");
    assert_eq!(named0, 0, "JIT frames named before any map existed");
    assert!(jit >= 200, "too few JIT samples after the map: {jit}");
    assert!(pct(method, jit) >= 90.0, "{JAVA_METHOD} names {:.1}% of JIT leaves ({method} of {jit})", pct(method, jit));
}

#[test]
fn the_receiver_asks_a_jvm_for_its_map_when_configured() {
    let test = "the_receiver_asks_a_jvm_for_its_map_when_configured";
    if !can_run(test, &[("go", &["version"]), ("javac", &["-version"])]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let classes = compile_java(dir.path());
    let mut java = start_java(&classes, 30);
    let pid = java.0.id();
    let map = MapFile(PathBuf::from(format!("/tmp/perf-{pid}.map")));
    let _ = std::fs::remove_file(&map.0);

    let agent = Agent::start(dir.path(), pid, "    jit:\n      jvm_perfmap: attach\n");
    agent.wait_for_reports(6);
    let _ = java.0.kill();
    let log = agent.log_text();
    let profiles = agent.stop();
    assert!(map.0.exists(), "the JVM wrote no map:\n{log}");
    let (jit, method, _) = java_leaves(&profiles, pid, 2..);
    eprintln!("after the attach: {jit} JIT-leaf samples, {method} in {JAVA_METHOD}");
    assert!(jit >= 100, "too few JIT samples: {jit}");
    assert!(pct(method, jit) >= 90.0, "{JAVA_METHOD} names {:.1}% of JIT leaves ({method} of {jit})", pct(method, jit));
}

/// profcol profiling itself with `service.plugins.perf_map: true`: a wasm
/// processor that spins in its `process` call each report (until its
/// `call_timeout`) has that spin named in profcol's own profile, from the
/// map wasmtime writes for the plugin's compiled code. The spin is inlined
/// into the plugin's export, which wasmtime names after the WIT function:
/// `profcol:plugin/process-batch@0.1.0#process`.
#[test]
fn wasm_plugin_functions_are_named_in_profcols_own_profile() {
    let test = "wasm_plugin_functions_are_named_in_profcols_own_profile";
    if !can_run(test, &[("go", &["version"])]) {
        return;
    }
    let plugin = profcol_testkit::plugins::test_plugin("misbehave");
    let dir = tempfile::tempdir().unwrap();
    let profiles = dir.path().join("profiles");
    let config = dir.path().join("profcol.yaml");
    std::fs::write(
        &config,
        format!(
            "receivers:\n  ebpf:\n    sample_frequency: 99\n    report_interval: 1s\n\
             processors:\n  wasm/spin:\n    path: {}\n    config: {{mode: loop}}\n    call_timeout: 400ms\n\
             \x20   max_failures: 1000\n\
             exporters:\n  pprof:\n    directory: {}\n\
             service:\n  plugins:\n    perf_map: true\n    cache_dir: {}\n\
             \x20 telemetry:\n    metrics:\n      address: \"\"\n\
             \x20 pipelines:\n    profiles:\n      receivers: [ebpf]\n      processors: [wasm/spin]\n      exporters: [pprof]\n",
            plugin.display(),
            profiles.display(),
            dir.path().join("cache").display()
        ),
    )
    .unwrap();
    let log = dir.path().join("profcol.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_profcol"))
            .arg("--config")
            .arg(&config)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start profcol"),
    );
    let pid = child.0.id();
    let _map = MapFile(PathBuf::from(format!("/tmp/perf-{pid}.map")));
    let agent = Agent { child, log, profiles };
    agent.wait_for_reports(8);
    let profiles = agent.stop();

    let (by_pid, _) = profcol_stacks(&profiles);
    let own: &[Stack] = by_pid.get(&pid).map(Vec::as_slice).unwrap_or(&[]);
    let (jit, named) = jit_leaves(own);
    let spin: u64 = own
        .iter()
        .filter(|s| {
            s.frames.first().is_some_and(|f| in_jit_code(&f.mapping) && f.name.ends_with("process-batch@0.1.0#process"))
        })
        .map(|s| s.count)
        .sum();
    let names: std::collections::BTreeSet<&str> = own
        .iter()
        .filter_map(|s| s.frames.first())
        .filter(|f| in_jit_code(&f.mapping))
        .map(|f| f.name.as_str())
        .collect();
    eprintln!("profcol's own samples with a JIT leaf: {jit}, named {named}, in the plugin's code {spin}: {names:?}");
    assert!(jit >= 50, "too few samples in the plugin's code: {jit}");
    assert!(pct(named, jit) >= 90.0, "JIT leaves named: {named} of {jit}");
    assert!(pct(spin, jit) >= 80.0, "the spin named as the plugin's function: {spin} of {jit}");
}
