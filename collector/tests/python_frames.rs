//! CPython frames in profcol's profiles, held against py-spy's.
//!
//! One workload program (nested functions of known relative cost, a
//! generator, a method, a lambda, json.dumps and zlib.crc32, a second
//! thread) runs under every CPython 3.9–3.13 pyenv has
//! (`$(pyenv root)/versions/`) and under Debian's /usr/bin/python3.11, two
//! at a time (one per CPU). One profcol (ebpf receiver with a pid filter,
//! pprof and OTLP JSON file exporters) samples them while a `py-spy record
//! --nonblocking` samples each, both at 99 Hz, on-CPU only (py-spy leaves idle threads out
//! unless `--idle`; before 3.11 it cannot tell them apart without stopping
//! the process, and counts the GIL's holder instead, `--gil`). Profcol's
//! pprof files are read with Go's pprof reader (`go tool pprof -raw`). Per
//! interpreter, with a table of the shares printed:
//!
//! - each function's share of the samples (self: innermost Python frame;
//!   total: anywhere in the stack) is py-spy's within 5 points, for every
//!   function with at least 3% in either;
//! - at least 95% of profcol's samples have a Python call path (names,
//!   outer to inner) py-spy saw too;
//! - at least 95% of them have an innermost Python frame whose file:line is
//!   one py-spy saw as innermost;
//! - the C extension runs leafward of its Python caller: `_json`'s frames
//!   below `iterencode`, libz's below `checksum_zlib` (in at least a
//!   quarter of those functions' self samples), no Python frame below
//!   either (main → Python → C → kernel; 2% allowed);
//! - at least 80% of the process's samples hold a Python frame at all;
//! - Python called back by C reads Python → C → Python in one stack: a
//!   `json.dumps(..., default=to_plain)` callback sits leafward of `_json`'s
//!   frames, which sit leafward of `iterencode`.
//!
//! And in the OTLP output, `profile.frame.type` is `cpython` on exactly
//! the locations of Python frames. A second test runs ten Python processes
//! of 150 ms each under the embedded default's counting mode and finds
//! their function named.
//!
//! A Python frame in pprof is a function whose file is a Python source
//! (`co_filename`: `*.py`, or `<frozen ...>`-style); its name is
//! `co_qualname` on 3.11+ and `co_name` before, as py-spy names it.
//!
//! Needs root (eBPF and py-spy's reads of other processes), Go and py-spy
//! (.ci/python.sh puts it under the workspace's target/py-spy, or one on
//! PATH); without them it is skipped with a message, except under CI=true.
//! About two minutes; `--nocapture` shows the tables of a passing run.
//!
//!     sudo -E cargo test -p profcol --test python_frames -- --nocapture

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use profcol_testkit::pprof_raw::{parse_raw, profcol_stacks, Frame, Stack};
use profcol_testkit::tools::{in_ci, require, tool_available, KillOnDrop};

/// How long py-spy records (profcol samples the same window, give or take
/// its first report).
const RECORD_SECONDS: u64 = 30;

/// How many workloads run at once. Each keeps about one CPU busy; more than
/// the machine's two CPUs leave them runnable but waiting, which py-spy
/// counts (a thread in state R) and on-CPU sampling does not, and that
/// skews the shares by up to several points.
const AT_ONCE: usize = 2;

const WORKLOAD: &str = r#"
import json, operator, sys, threading, time, zlib

DEADLINE = time.monotonic() + float(sys.argv[1])
PAYLOAD = {"k%d" % i: [i, str(i) * 3, {"x": i / 7.0, "y": [True, None]}] for i in range(1500)}
BLOB = bytes(range(256)) * 16


def c_leaf():
    s = 0
    for i in range(45000):
        s ^= i
    return s


def b_mid():
    s = 0
    for i in range(30000):
        s ^= i
    return s + c_leaf()


def a_outer():
    s = 0
    for i in range(15000):
        s ^= i
    return s + b_mid()


def gen_values(n):
    for i in range(n):
        yield i * 3


class Worker:
    def method(self):
        s = 0
        for i in range(10000):
            s += i * i
        return s + sum(gen_values(50000))


square_sum = lambda n: sum(map(operator.mul, range(n), range(n)))


def encode_json():
    return len(json.dumps(PAYLOAD))


class Point:
    def __init__(self, i):
        self.i = i


POINTS = [Point(i) for i in range(300)]


# Called back by _json's C encoder for each Point: Python -> C -> Python.
def to_plain(p):
    s = 0
    for i in range(150):
        s += i * p.i
    return s


def encode_with_callback():
    return len(json.dumps(POINTS, default=to_plain))


# libz's crc32 of under 5 KiB keeps the GIL: the thread on CPU is the GIL's
# holder (py-spy --gil), and the threads never run at once, when py-spy,
# which counts runnable threads as running, would weigh the call more than
# on-CPU samples do.
def checksum_zlib():
    c = 0
    for _ in range(1500):
        c = zlib.crc32(BLOB, c)
    return c


def main_loop():
    w = Worker()
    while time.monotonic() < DEADLINE:
        a_outer()
        w.method()
        square_sum(40000)
        encode_json()
        encode_with_callback()
        checksum_zlib()


def side_thread():
    while time.monotonic() < DEADLINE:
        s = 0
        for i in range(20000):
            s += i ^ 5


t = threading.Thread(target=side_thread, name="side")
t.start()
print("ready", flush=True)
main_loop()
t.join()
"#;

/// Functions of the workload py-spy must see in every interpreter.
const WORKLOAD_FUNCTIONS: &[&str] = &[
    "a_outer",
    "b_mid",
    "c_leaf",
    "gen_values",
    "<lambda>",
    "encode_json",
    "to_plain",
    "checksum_zlib",
    "side_thread",
];

/// One interpreter under test.
struct Python {
    /// "3.12.1", or "debian 3.11" for /usr/bin/python3.11.
    label: String,
    /// The minor version (3.X).
    minor: u32,
    binary: PathBuf,
}

/// The interpreters: pyenv's 3.9–3.13 (plain `3.X.Y` names) and Debian's
/// python3.11. Under CI both sources must be there.
fn pythons() -> Vec<Python> {
    let mut found = Vec::new();
    let root = std::env::var_os("PYENV_ROOT").map(PathBuf::from).or_else(|| {
        let out = Command::new("pyenv").arg("root").output().ok().filter(|o| o.status.success())?;
        Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    });
    match root {
        Some(root) => {
            let mut versions: Vec<(u32, u32, String)> = std::fs::read_dir(root.join("versions"))
                .map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect::<Vec<_>>())
                .unwrap_or_default()
                .into_iter()
                .filter_map(|name| {
                    let v: Vec<u32> = name.split('.').map(|p| p.parse().ok()).collect::<Option<_>>()?;
                    (v.len() == 3 && v[0] == 3 && (9..=13).contains(&v[1])).then(|| (v[1], v[2], name))
                })
                .collect();
            versions.sort();
            for (minor, _, name) in versions {
                let binary = root.join("versions").join(&name).join("bin/python3");
                if binary.exists() {
                    found.push(Python { label: name, minor, binary });
                }
            }
        }
        None if in_ci() => panic!("CI=true but pyenv is not found (PYENV_ROOT or `pyenv root`)"),
        None => eprintln!("note: no pyenv (PYENV_ROOT or `pyenv root`): only Debian's python3.11 is tested"),
    }
    let debian = PathBuf::from("/usr/bin/python3.11");
    if debian.exists() {
        found.push(Python { label: "debian 3.11".into(), minor: 11, binary: debian });
    } else if in_ci() {
        panic!("CI=true but /usr/bin/python3.11 is missing (.ci/python.sh installs it)");
    } else {
        eprintln!("note: no /usr/bin/python3.11 (apt-get install python3.11): Debian's build is not tested");
    }
    found
}

/// py-spy as .ci/python.sh installs it (the workspace's target/py-spy), or
/// the one on PATH.
fn py_spy() -> Option<PathBuf> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let local = workspace.join("target/py-spy/bin/py-spy");
    if local.exists() {
        return Some(local);
    }
    tool_available("py-spy", &["--version"]).then(|| PathBuf::from("py-spy"))
}

/// Whether `file` is a Python code object's `co_filename`: a Python source,
/// or a `<frozen ...>`-style pseudo file.
fn python_file(file: &str) -> bool {
    file.ends_with(".py") || (file.starts_with('<') && file.ends_with('>'))
}

/// Python's view of a pprof frame and stack.
trait PyFrame {
    fn is_python(&self) -> bool;
}

trait PyStack {
    fn python(&self) -> impl Iterator<Item = (usize, &Frame)>;
    fn python_path(&self) -> Vec<String>;
    fn display(&self) -> String;
}

impl PyFrame for Frame {
    /// Whether this frame is a Python code object's: its file is a Python
    /// source (or a `<frozen ...>`-style pseudo file).
    fn is_python(&self) -> bool {
        python_file(&self.file)
    }
}

impl PyStack for Stack {
    /// Indices of the Python frames, leaf first.
    fn python(&self) -> impl Iterator<Item = (usize, &Frame)> {
        self.frames.iter().enumerate().filter(|(_, f)| f.is_python())
    }

    /// Python function names, outer to inner.
    fn python_path(&self) -> Vec<String> {
        let mut p: Vec<String> = self.python().map(|(_, f)| f.name.clone()).collect();
        p.reverse();
        p
    }

    /// Its frames, root first.
    fn display(&self) -> String {
        let mut s = String::new();
        for f in self.frames.iter().rev() {
            if f.is_python() {
                s += &format!(" → [py] {} ({}:{})", f.name, f.file, f.line);
            } else {
                s += &format!(" → {} [{}]", if f.name.is_empty() { "?" } else { &f.name }, f.mapping_base());
            }
        }
        s
    }
}

/// py-spy's `--format raw` output: "FRAME;FRAME;... COUNT", outer frame
/// first, each frame "NAME (FILE:LINE)". Returned leaf first.
fn parse_py_spy(text: &str) -> Result<Vec<Stack>, String> {
    let mut stacks = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (frames, count) = line.rsplit_once(' ').ok_or_else(|| format!("no count: {line:?}"))?;
        let count = count.parse().map_err(|_| format!("bad count: {line:?}"))?;
        let mut parsed = Vec::new();
        // py-spy writes a sample it could not walk (its `Errors`) as a
        // stack without frames: no Python frame, like a native-only one.
        for f in frames.split(';').filter(|f| !f.is_empty()) {
            let (name, place) = f
                .strip_suffix(')')
                .and_then(|f| f.rsplit_once(" ("))
                .ok_or_else(|| format!("frame {f:?} is not `NAME (FILE:LINE)` in {line:?}"))?;
            let (file, line_no) = place.rsplit_once(':').ok_or_else(|| format!("no line in {f:?}"))?;
            let line_no = line_no.parse().map_err(|_| format!("bad line in {f:?}"))?;
            parsed.push(Frame {
                name: name.to_owned(),
                file: file.to_owned(),
                line: line_no,
                mapping: String::new(),
                file_offset: None,
            });
        }
        parsed.reverse();
        stacks.push(Stack { count, tid: 0, frames: parsed, labels: Default::default() });
    }
    Ok(stacks)
}

/// Per function: (self, total) samples, and the samples counted (those
/// with at least one Python frame).
fn shares(stacks: &[Stack]) -> (BTreeMap<String, (u64, u64)>, u64) {
    let mut by_fn: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut all = 0;
    for s in stacks {
        let path = s.python_path();
        let Some(leaf) = path.last() else { continue };
        all += s.count;
        by_fn.entry(leaf.clone()).or_default().0 += s.count;
        for name in path.iter().collect::<BTreeSet<_>>() {
            by_fn.entry(name.clone()).or_default().1 += s.count;
        }
    }
    (by_fn, all)
}

fn pct(n: u64, all: u64) -> f64 {
    if all == 0 {
        0.0
    } else {
        100.0 * n as f64 / all as f64
    }
}

/// The heaviest `n` stacks by their names, for messages.
fn heaviest(stacks: &[Stack], n: usize) -> String {
    let mut by_names: HashMap<String, u64> = HashMap::new();
    for s in stacks {
        *by_names.entry(s.display()).or_default() += s.count;
    }
    let mut order: Vec<(String, u64)> = by_names.into_iter().collect();
    order.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    order.iter().take(n).map(|(s, c)| format!("  {c} ×{s}")).collect::<Vec<_>>().join("\n")
}

/// The C extension's frames sit leafward of its Python caller: at least a
/// quarter of the samples whose innermost Python frame is `caller` have a
/// frame of a mapping whose file name starts with `library` (the rest are
/// the caller's own bytecode and the module's glue), and at most 2% of the
/// samples with such a frame have another Python frame than `caller` as
/// the first one rootward of it (Python the extension calls back sits
/// leafward of it: see [`check_callback`]).
fn check_extension(stacks: &[Stack], caller: &str, library: &str, failures: &mut Vec<String>, label: &str) {
    let (mut in_caller, mut with_ext, mut any_ext, mut misplaced) = (Vec::new(), 0, 0, Vec::new());
    for s in stacks {
        let ext = s.frames.iter().rposition(|f| !f.is_python() && f.mapping_base().starts_with(library));
        let innermost = s.python().next();
        if let (Some(e), Some(_)) = (ext, innermost) {
            any_ext += s.count;
            let above = s.frames[e..].iter().find(|f| f.is_python());
            if above.is_none_or(|f| f.name != caller) {
                misplaced.push(s);
            }
        }
        if innermost.is_some_and(|(_, f)| f.name == caller) {
            in_caller.push(s);
            with_ext += if ext.is_some() { s.count } else { 0 };
        }
    }
    let under_caller: u64 = in_caller.iter().map(|s| s.count).sum();
    let misplaced_n: u64 = misplaced.iter().map(|s| s.count).sum();
    eprintln!(
        "  {with_ext} of {under_caller} samples in {caller} have a {library}* frame leafward of it; \
         {misplaced_n} of {any_ext} with one elsewhere"
    );
    if under_caller == 0 || with_ext * 4 < under_caller {
        let mut by_names: HashMap<String, u64> = HashMap::new();
        for s in &in_caller {
            *by_names.entry(s.display()).or_default() += s.count;
        }
        let mut order: Vec<(String, u64)> = by_names.into_iter().collect();
        order.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        let shown: Vec<String> = order.iter().take(5).map(|(s, c)| format!("  {c} ×{s}")).collect();
        failures.push(format!(
            "{label}: {with_ext} of {under_caller} samples whose innermost Python frame is {caller} have a \
             {library}* frame leafward of it (a quarter expected); their heaviest stacks:\n{}",
            shown.join("\n")
        ));
    }
    if misplaced_n * 50 > any_ext {
        let shown: Vec<String> = misplaced.iter().take(5).map(|s| format!("  {} ×{}", s.count, s.display())).collect();
        failures.push(format!(
            "{label}: {misplaced_n} of {any_ext} samples with a {library}* frame do not have it directly leafward \
             of {caller} (2% allowed):\n{}",
            shown.join("\n")
        ));
    }
}

/// Python called back by a C extension reads Python → C → Python in one
/// stack: at least 90% of the samples whose innermost Python frame is
/// `callback` have, rootward of it, a frame of `library` and then `caller`
/// as the next Python frame.
fn check_callback(
    stacks: &[Stack],
    callback: &str,
    library: &str,
    caller: &str,
    failures: &mut Vec<String>,
    label: &str,
) {
    let (mut all, mut mixed, mut other) = (0, 0, Vec::new());
    for s in stacks {
        let Some((p, f)) = s.python().next() else { continue };
        if f.name != callback {
            continue;
        }
        all += s.count;
        let rest = &s.frames[p + 1..];
        let ext = rest.iter().position(|f| f.is_python() || f.mapping_base().starts_with(library));
        let ok = ext.is_some_and(|e| {
            !rest[e].is_python() && rest[e..].iter().find(|f| f.is_python()).is_some_and(|f| f.name == caller)
        });
        if ok {
            mixed += s.count;
        } else {
            other.push(s);
        }
    }
    eprintln!("  {mixed} of {all} samples in {callback} read {caller} → {library}* → {callback}");
    if all == 0 || mixed * 10 < all * 9 {
        let shown: Vec<String> = other.iter().take(5).map(|s| format!("  {} ×{}", s.count, s.display())).collect();
        failures.push(format!(
            "{label}: {mixed} of {all} samples in {callback} read {caller} → {library}* → {callback} (90% \
             expected):\n{}",
            shown.join("\n")
        ));
    }
}

/// Checks one interpreter's profcol stacks against py-spy's; prints its table.
fn compare(label: &str, pid: u32, profcol: &[Stack], spy: &[Stack], failures: &mut Vec<String>) {
    let all: u64 = profcol.iter().map(|s| s.count).sum();
    let (p_fn, p_all) = shares(profcol);
    let (s_fn, s_all) = shares(spy);
    eprintln!("== {label} (pid {pid}): profcol {all} samples, {p_all} with Python frames; py-spy {s_all}");

    // Shares: every function with >= 3% (self or total) in either.
    let names: BTreeSet<&String> = p_fn.keys().chain(s_fn.keys()).collect();
    let mut rows: Vec<(&String, [f64; 4])> = names
        .into_iter()
        .map(|n| {
            let (ps, pt) = p_fn.get(n).copied().unwrap_or_default();
            let (ss, st) = s_fn.get(n).copied().unwrap_or_default();
            (n, [pct(ps, p_all), pct(pt, p_all), pct(ss, s_all), pct(st, s_all)])
        })
        .collect();
    rows.sort_by(|a, b| b.1[3].total_cmp(&a.1[3]).then(b.1[1].total_cmp(&a.1[1])));
    eprintln!(
        "  {:<28} {:>13} {:>13} {:>13} {:>13}",
        "function", "profcol self", "profcol total", "py-spy self", "py-spy total"
    );
    for (n, [ps, pt, ss, st]) in &rows {
        if [ps, pt, ss, st].iter().all(|&&v| v < 1.0) {
            continue;
        }
        let off = |a: f64, b: f64| p_all > 0 && (a >= 3.0 || b >= 3.0) && (a - b).abs() > 5.0;
        let flag = |a, b| if off(a, b) { "!" } else { " " };
        eprintln!("  {n:<28} {ps:>12.1}%{} {pt:>12.1}%{} {ss:>12.1}% {st:>12.1}%", flag(*ps, *ss), flag(*pt, *st));
        for (what, a, b) in [("self", ps, ss), ("total", pt, st)] {
            if off(*a, *b) {
                failures.push(format!("{label}: {n} {what} share: profcol {a:.1}%, py-spy {b:.1}% (5 points allowed)"));
            }
        }
    }
    if p_all == 0 {
        failures.push(format!(
            "no cpython frames in profcol's profile for {label} (pid {pid}: {all} samples); heaviest stacks:\n{}",
            heaviest(profcol, 5)
        ));
        return;
    }
    if p_all * 100 < all * 80 {
        failures.push(format!(
            "{label}: only {p_all} of profcol's {all} samples hold a Python frame (80% expected); heaviest \
             stacks:\n{}",
            heaviest(profcol, 5)
        ));
    }

    // Call paths (names, outer to inner) py-spy saw too.
    let spy_paths: BTreeSet<Vec<String>> = spy.iter().map(Stack::python_path).collect();
    let mut unseen: BTreeMap<Vec<String>, u64> = BTreeMap::new();
    for s in profcol {
        let path = s.python_path();
        if !path.is_empty() && !spy_paths.contains(&path) {
            *unseen.entry(path).or_default() += s.count;
        }
    }
    let unseen_n: u64 = unseen.values().sum();
    eprintln!("  call paths py-spy saw too: {:.1}% of samples", 100.0 - pct(unseen_n, p_all));
    if unseen_n * 100 > p_all * 5 {
        let mut worst: Vec<_> = unseen.into_iter().collect();
        worst.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        let shown: Vec<String> = worst.iter().take(8).map(|(p, n)| format!("  {n} × {}", p.join(" → "))).collect();
        failures.push(format!(
            "{label}: {unseen_n} of {p_all} samples have a Python call path py-spy never saw (5% allowed):\n{}",
            shown.join("\n")
        ));
    }

    // Innermost Python frame's file:line among py-spy's.
    let spy_leaves: BTreeSet<(&str, u64)> =
        spy.iter().filter_map(|s| s.python().next()).map(|(_, f)| (f.file.as_str(), f.line)).collect();
    let mut wrong: BTreeMap<(String, String, u64), u64> = BTreeMap::new();
    for s in profcol {
        if let Some((_, f)) = s.python().next() {
            if !spy_leaves.contains(&(f.file.as_str(), f.line)) {
                *wrong.entry((f.name.clone(), f.file.clone(), f.line)).or_default() += s.count;
            }
        }
    }
    let wrong_n: u64 = wrong.values().sum();
    eprintln!("  innermost file:line py-spy saw too: {:.1}% of samples", 100.0 - pct(wrong_n, p_all));
    if wrong_n * 100 > p_all * 5 {
        let shown: Vec<String> = wrong.iter().take(8).map(|((n, f, l), c)| format!("  {c} × {n} {f}:{l}")).collect();
        failures.push(format!(
            "{label}: {wrong_n} of {p_all} samples have an innermost Python file:line py-spy never reported \
             (5% allowed):\n{}",
            shown.join("\n")
        ));
    }

    // main → Python → C → kernel: the C extensions below their callers.
    let json_caller = if s_fn.contains_key("JSONEncoder.iterencode") { "JSONEncoder.iterencode" } else { "iterencode" };
    check_extension(profcol, json_caller, "_json.", failures, label);
    check_callback(profcol, "to_plain", "_json.", json_caller, failures, label);
    check_extension(profcol, "checksum_zlib", "libz.so", failures, label);
}

/// The locations of profcol's OTLP JSON (the `file` exporter's lines):
/// how many are Python frames (a Python file), and those whose
/// `profile.frame.type` disagrees: `cpython` exactly on Python frames.
fn frame_types(path: &Path) -> (u64, u64, Vec<String>) {
    let (mut python, mut wrong, mut examples) = (0, 0, Vec::new());
    for loc in profcol_testkit::otlp_file::locations(path) {
        let is_python = loc.lines.iter().any(|(_, file)| python_file(file));
        python += u64::from(is_python);
        if is_python != (loc.frame_type == "cpython") {
            wrong += 1;
            if examples.len() < 8 {
                examples.push(format!("  frame type {:?}: {:?}", loc.frame_type, loc.lines));
            }
        }
    }
    (python, wrong, examples)
}

/// A running workload: its interpreter and process.
struct Workload {
    python: Python,
    child: Child,
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn cpython_frames_match_py_spy() {
    let test = "cpython_frames_match_py_spy";
    if !require(test, profcol_receivers::ebpf::bpf::privileges::Privileges::current().check()) {
        return;
    }
    if !tool_available("go", &["version"]) {
        return;
    }
    let Some(py_spy) = py_spy() else { return };
    let mut pythons = pythons();
    if !require(test, if pythons.is_empty() { Err("no CPython 3.9–3.13 found") } else { Ok(()) }) {
        return;
    }

    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("workload.py");
    std::fs::write(&script, WORKLOAD).unwrap();
    let mut failures = Vec::new();
    while !pythons.is_empty() {
        let batch: Vec<Python> = pythons.drain(..pythons.len().min(AT_ONCE)).collect();
        let run = dir.path().join(format!("run-{}", batch[0].label.replace(' ', "-")));
        std::fs::create_dir(&run).unwrap();
        record_side_by_side(batch, &script, &py_spy, &run, &mut failures);
    }
    assert!(failures.is_empty(), "profcol's Python frames differ from py-spy's:\n{}", failures.join("\n"));
}

/// Runs `batch`'s workloads under one profcol and one py-spy each, for the
/// same window, and compares them; adds what differs to `failures` and then
/// prints profcol's log.
fn record_side_by_side(batch: Vec<Python>, script: &Path, py_spy: &Path, dir: &Path, failures: &mut Vec<String>) {
    let profiles = dir.join("profiles");

    // Every workload up and past its setup before anything samples.
    let run_for = (RECORD_SECONDS + 60).to_string();
    let mut workloads: Vec<Workload> = Vec::new();
    for python in batch {
        let mut child = Command::new(&python.binary)
            .arg(script)
            .arg(&run_for)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", python.binary.display()));
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        assert_eq!(first.trim(), "ready", "{} did not start the workload", python.binary.display());
        workloads.push(Workload { python, child });
    }

    let pids: Vec<String> = workloads.iter().map(|w| w.child.id().to_string()).collect();
    let config = dir.join("profcol.yaml");
    let otlp = dir.join("otlp.jsonl");
    std::fs::write(
        &config,
        format!(
            "receivers:\n  ebpf:\n    sample_frequency: 99\n    report_interval: 2s\n    count_in_kernel: false\n\
             \x20   pids: [{}]\n\
             processors:\n  kernel_symbols:\n  user_symbols:\n\
             exporters:\n  pprof:\n    directory: {}\n  file:\n    path: {}\n\
             service:\n  telemetry:\n    metrics:\n      address: \"\"\n\
             \x20 pipelines:\n    profiles:\n      receivers: [ebpf]\n      processors: [kernel_symbols, user_symbols]\n\
             \x20     exporters: [pprof, file]\n",
            pids.join(", "),
            profiles.display(),
            otlp.display()
        ),
    )
    .unwrap();
    let log_path = dir.join("profcol.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let t0 = Instant::now();
    let mut agent = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_profcol"))
            .arg("--config")
            .arg(&config)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start profcol"),
    );
    let log_text = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let has_profile = || {
        std::fs::read_dir(&profiles)
            .map(|d| d.filter_map(Result::ok).any(|e| e.file_name().to_string_lossy().ends_with(".pb.gz")))
            .unwrap_or(false)
    };
    // Sampling once its first report is written.
    while !has_profile() {
        assert!(agent.0.try_wait().unwrap().is_none(), "profcol exited:\n{}", log_text());
        assert!(t0.elapsed() < Duration::from_secs(60), "no profile in 60 s:\n{}", log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("profcol sampling after {:.1} s", t0.elapsed().as_secs_f64());

    // py-spy on every workload at once, for the same window.
    let spies: Vec<(PathBuf, Child)> = workloads
        .iter()
        .map(|w| {
            let out = dir.join(format!("py-spy-{}.txt", w.child.id()));
            // Before 3.11 py-spy learns a thread's OS id (which tells it
            // whether the thread runs) only by stopping the process; with
            // --nonblocking it counts every thread, the one waiting for the
            // GIL too. There it counts the GIL's holder (--gil): the thread
            // on CPU, as the workload's C calls keep the GIL.
            let gil: &[&str] = if w.python.minor >= 11 { &[] } else { &["--gil"] };
            let child = Command::new(py_spy)
                .args(["record", "--rate", "99", "--format", "raw", "--full-filenames", "--nonblocking"])
                .args(gil)
                .args(["--duration", &RECORD_SECONDS.to_string(), "--pid", &w.child.id().to_string(), "-o"])
                .arg(&out)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start py-spy");
            (out, child)
        })
        .collect();
    let mut spy_stacks = Vec::new();
    let mut spy_failures = Vec::new();
    for ((out, child), w) in spies.into_iter().zip(&workloads) {
        let result = child.wait_with_output().unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&result.stdout), String::from_utf8_lossy(&result.stderr));
        let summary = said.lines().find(|l| l.contains("Samples:")).unwrap_or("").trim().to_owned();
        eprintln!("py-spy {} (pid {}): {summary}", w.python.label, w.child.id());
        let parsed = std::fs::read_to_string(&out).map_err(|e| e.to_string()).and_then(|t| parse_py_spy(&t));
        match parsed {
            Ok(stacks) if result.status.success() => {
                let (by_fn, all) = shares(&stacks);
                let missing: Vec<&&str> = WORKLOAD_FUNCTIONS.iter().filter(|f| !by_fn.contains_key(**f)).collect();
                if all < 300 || !missing.is_empty() {
                    spy_failures.push(format!(
                        "py-spy on {}: {all} samples, workload functions missing: {missing:?}\n{said}",
                        w.python.label
                    ));
                }
                spy_stacks.push(stacks);
            }
            other => {
                let error = other.err().unwrap_or_default();
                spy_failures.push(format!("py-spy on {}: {:?} {error}\n{said}", w.python.label, result.status));
                spy_stacks.push(Vec::new());
            }
        }
    }

    // SAFETY: kill has no memory effects; the pid is our child's.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    let status = agent.0.wait().unwrap();
    let pids: Vec<u32> = workloads.iter().map(|w| w.child.id()).collect();
    let labels: Vec<String> = workloads.iter().map(|w| w.python.label.clone()).collect();
    drop(workloads);
    if !spy_failures.is_empty() {
        failures.push(format!("py-spy did not record every workload:\n{}", spy_failures.join("\n")));
        return;
    }
    assert!(status.success(), "profcol at SIGTERM: {status:?}\n{}", log_text());

    let (mut by_pid, files) = profcol_stacks(&profiles);
    eprintln!("{files} pprof files; run took {:.0} s", t0.elapsed().as_secs_f64());
    let before = failures.len();
    for ((label, pid), spy) in labels.iter().zip(&pids).zip(&spy_stacks) {
        let profcol = by_pid.remove(pid).unwrap_or_default();
        compare(label, *pid, &profcol, spy, failures);
    }
    let (python, wrong, examples) = frame_types(&otlp);
    eprintln!("OTLP: {python} Python locations, {wrong} with a frame type that disagrees");
    if python == 0 {
        failures.push("profcol's OTLP output has no location of a Python function".into());
    }
    if wrong > 0 {
        failures.push(format!(
            "profcol's OTLP output: {wrong} locations are `profile.frame.type: cpython` without a Python file, or \
             the other way round:\n{}",
            examples.join("\n")
        ));
    }
    // The log goes to the test's output here, the failures into the final
    // panic: CI keeps the end of a long output, and that end then says
    // what failed.
    if failures.len() > before {
        eprintln!("profcol's log for {}:\n{}", labels.join(", "), log_text());
    }
}

/// The `-raw` reader on text as Go's pprof prints it: a location without a
/// mapping (address 0), an inlined caller's line, a pseudo file with a
/// space, a function name with spaces, a system name after the start
/// line, a column (newer Go).
#[test]
fn go_pprof_raw_text_is_read() {
    let text = "PeriodType: cpu nanoseconds\nPeriod: 10101010\nSamples:\nsamples/count cpu/nanoseconds\n\
                \x20         3   30303030: 1 2 3 4 \n\
                \x20               comm:[python3]\n\
                \x20               pid:[42] tid:[43]\n\
                Locations\n\
                \x20    1: 0x7f00 M=2 crc32_z /src/crc32.c:700 s=0\n\
                \x20    2: 0x0 checksum_zlib /tmp/w.py:57 s=53\n\
                \x20    3: 0x0 M=1 <module> <frozen runpy>:88:4 s=1(_run_code)\n\
                \x20    4: 0x1234 M=1 inner a.c:5 s=0\n\
                \x20            outer a.c:9 s=0\n\
                \x20            <R as T>::next /src/r.rs:12 s=0\n\
                Mappings\n\
                1: 0x1000/0x2000/0x0 /usr/bin/python3.12  [FN]\n\
                2: 0x7f00/0x8000/0x0 /lib/libz.so.1.2.13 abcd [FN]\n";
    let samples = parse_raw(text);
    assert_eq!(samples.len(), 1);
    let (pid, stack) = &samples[0];
    assert_eq!((*pid, stack.count, stack.tid), (42, 3, 43));
    let got: Vec<(&str, &str, u64, &str, bool)> = stack
        .frames
        .iter()
        .map(|f| (f.name.as_str(), f.file.as_str(), f.line, f.mapping_base(), f.is_python()))
        .collect();
    assert_eq!(
        got,
        [
            ("crc32_z", "/src/crc32.c", 700, "libz.so.1.2.13", false),
            ("checksum_zlib", "/tmp/w.py", 57, "", true),
            ("<module>", "<frozen runpy>", 88, "python3.12", true),
            ("inner", "a.c", 5, "python3.12", false),
            ("outer", "a.c", 9, "python3.12", false),
            ("<R as T>::next", "/src/r.rs", 12, "python3.12", false),
        ]
    );
    assert_eq!(stack.python_path(), ["<module>", "checksum_zlib"]);
}

const SHORT_LIVED: &str = r#"
import time
def short_lived_work():
    end = time.perf_counter() + 0.15
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n
short_lived_work()
"#;

/// Processes that exec Python and exit within 200 ms are named: in the
/// embedded default's mode (counting in the kernel, records read at the
/// report unless something wakes the reader), ten `sh -c 'exec python
/// short.py'` runs of 150 ms of Python each, one every 300 ms; at least
/// eight of them have samples in `short_lived_work`, named.
#[test]
fn short_lived_python_processes_are_named() {
    let test = "short_lived_python_processes_are_named";
    if !require(test, profcol_receivers::ebpf::bpf::privileges::Privileges::current().check()) {
        return;
    }
    if !tool_available("go", &["version"]) {
        return;
    }
    let pythons = pythons();
    let Some(python) = pythons.iter().max_by_key(|p| p.minor) else {
        assert!(!in_ci(), "no CPython 3.9–3.13 found (CI=true)");
        eprintln!("note: {test}: no CPython 3.9–3.13 found; skipped");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("short.py");
    std::fs::write(&script, SHORT_LIVED).unwrap();
    let profiles = dir.path().join("profiles");
    let config = dir.path().join("profcol.yaml");
    std::fs::write(
        &config,
        format!(
            "receivers:\n  ebpf:\n    sample_frequency: 99\n    report_interval: 4s\n    count_in_kernel: true\n\
             exporters:\n  pprof:\n    directory: {}\n\
             service:\n  telemetry:\n    metrics:\n      address: \"\"\n\
             \x20 pipelines:\n    profiles:\n      receivers: [ebpf]\n      exporters: [pprof]\n",
            profiles.display()
        ),
    )
    .unwrap();
    let log_path = dir.path().join("profcol.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut agent = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_profcol"))
            .arg("--config")
            .arg(&config)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start profcol"),
    );
    let log_text = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let t0 = Instant::now();
    while !std::fs::read_dir(&profiles).is_ok_and(|mut d| d.next().is_some()) {
        assert!(agent.0.try_wait().unwrap().is_none(), "profcol exited:\n{}", log_text());
        assert!(t0.elapsed() < Duration::from_secs(60), "no profile in 60 s:\n{}", log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut pids = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        let mut sh = Command::new("sh")
            .arg("-c")
            .arg(format!("exec '{}' '{}'", python.binary.display(), script.display()))
            .spawn()
            .expect("sh");
        pids.push(sh.id());
        assert!(sh.wait().unwrap().success());
        let took = started.elapsed();
        assert!(took < Duration::from_millis(1500), "a short-lived run took {took:?}");
        std::thread::sleep(Duration::from_millis(300));
    }
    // The report after the last run, then a clean stop writes the rest.
    std::thread::sleep(Duration::from_secs(5));
    // SAFETY: kill() with a child's pid and SIGTERM has no memory effects.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    let status = agent.0.wait().unwrap();
    assert!(status.success(), "profcol: {status}\n{}", log_text());

    let (by_pid, _) = profcol_stacks(&profiles);
    let mut named = Vec::new();
    let mut report = Vec::new();
    for pid in &pids {
        let stacks = by_pid.get(pid).map(Vec::as_slice).unwrap_or(&[]);
        let all: u64 = stacks.iter().map(|s| s.count).sum();
        let in_work: u64 = stacks
            .iter()
            .filter(|s| s.python().any(|(_, f)| f.name == "short_lived_work" && f.file.ends_with("short.py")))
            .map(|s| s.count)
            .sum();
        report.push(format!("pid {pid}: {in_work} of {all} samples in short_lived_work"));
        if in_work > 0 {
            named.push(pid);
        }
    }
    eprintln!("{} ({}):\n  {}", test, python.label, report.join("\n  "));
    assert!(named.len() >= 8, "{} of 10 short-lived Python processes named:\n  {}", named.len(), report.join("\n  "));
}
