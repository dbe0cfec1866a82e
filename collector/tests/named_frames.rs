//! The embedded default, run as the README says (no `--config`), names the
//! native frames users look for: the leaf function of at least 95% of the
//! samples of a C program built `-O2 -g`, of the same program stripped with
//! its debug file under `/usr/lib/debug/.build-id/`, of a Go binary and of a
//! Rust release binary, in every profile it writes — the one of its first
//! report and the last one, written at SIGTERM — as binutils'
//! `addr2line -f -C` names the sampled addresses, read back with Go's pprof
//! reader (`go tool pprof -raw`).
//!
//! Root is needed (eBPF, and the debug file goes under /usr/lib/debug);
//! without it the test is skipped with a message, except under CI=true.
//! It runs as long as the default's report interval (a minute) and a bit.
//!
//!     sudo -E cargo test -p profcol --test named_frames

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use profcol_testkit::pprof_raw::{read_raw, Stack};
use profcol_testkit::tools::{require, tool_available};

const C_PROGRAM: &str = r#"
#include <stdint.h>
volatile uint64_t sink;
static inline __attribute__((always_inline)) uint64_t mix(uint64_t x) {
    x ^= x >> 13;
    x *= 0x9E3779B97F4A7C15ULL + VARIANT;
    return x ^ (x >> 7);
}
__attribute__((noinline)) uint64_t named_c_mixing(uint64_t n) {
    uint64_t s = sink;
    for (uint64_t i = 0; i < n; i++)
        s += mix(i + s);
    return s;
}
__attribute__((noinline)) uint64_t named_c_shifting(uint64_t n) {
    uint64_t s = sink;
    for (uint64_t i = 0; i < n; i++)
        s += (s << 3) ^ i;
    return s;
}
int main(void) {
    for (;;) {
        sink += named_c_mixing(3000000);
        sink += named_c_shifting(1000000);
    }
}
"#;

const RUST_PROGRAM: &str = r#"
use std::hint::black_box;
#[inline(never)]
fn named_rust_mixing(n: u64) -> u64 {
    let mut s = black_box(1u64);
    for i in 0..n {
        s = s.wrapping_add((i ^ s).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (s >> 7));
    }
    s
}
#[inline(never)]
fn named_rust_shifting(n: u64) -> u64 {
    let mut s = black_box(1u64);
    for i in 0..n {
        s = s.wrapping_add((s << 3) ^ i);
    }
    s
}
fn main() {
    let mut s = 0u64;
    loop {
        s = s.wrapping_add(named_rust_mixing(black_box(3_000_000)));
        s = s.wrapping_add(named_rust_shifting(black_box(1_000_000)));
        black_box(s);
    }
}
"#;

const GO_PROGRAM: &str = r#"
package main

var sink uint64

//go:noinline
func namedGoMixing(n uint64) uint64 {
	s := sink
	for i := uint64(0); i < n; i++ {
		s += (i ^ s) * 0x9E3779B97F4A7C15 ^ (s >> 7)
	}
	return s
}

//go:noinline
func namedGoShifting(n uint64) uint64 {
	s := sink
	for i := uint64(0); i < n; i++ {
		s += (s << 3) ^ i
	}
	return s
}

func main() {
	for {
		sink += namedGoMixing(3000000)
		sink += namedGoShifting(1000000)
	}
}
"#;

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The C program built `-O2 -g`; `variant` changes its code, so each
/// build has a build id of its own.
fn build_c(dir: &Path, name: &str, variant: u32) -> PathBuf {
    let src = dir.join("named.c");
    std::fs::write(&src, C_PROGRAM).unwrap();
    let out = dir.join(name);
    run(Command::new("gcc").args(["-O2", "-g"]).arg(format!("-DVARIANT={variant}")).arg("-o").arg(&out).arg(&src));
    out
}

fn build_rust(dir: &Path) -> PathBuf {
    let src = dir.join("named_rust.rs");
    std::fs::write(&src, RUST_PROGRAM).unwrap();
    let out = dir.join("named_rust");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    // From the workspace, so rustup picks the project's toolchain.
    run(Command::new(rustc)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["--edition", "2021", "-C", "opt-level=3", "-C", "debuginfo=2", "-o"])
        .arg(&out)
        .arg(&src));
    out
}

fn build_go(dir: &Path) -> PathBuf {
    let src = dir.join("named_go.go");
    std::fs::write(&src, GO_PROGRAM).unwrap();
    let out = dir.join("named_go");
    let cache = dir.join("gocache");
    run(Command::new("go")
        .current_dir(dir)
        .env("GOCACHE", &cache)
        .env("GOPATH", dir.join("gopath"))
        .env("HOME", dir)
        .env("GOFLAGS", "-buildvcs=false")
        .args(["build", "-o"])
        .arg(&out)
        .arg(&src));
    out
}

/// The GNU build id of `bin` (hex), as `readelf -n` prints it.
fn build_id(bin: &Path) -> String {
    let out = Command::new("readelf").arg("-n").arg(bin).output().expect("readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_owned))
        .unwrap_or_else(|| panic!("no build id in {}:\n{text}", bin.display()))
}

/// A debug file installed where the embedded default looks for it
/// (`/usr/lib/debug/.build-id/xx/rest.debug`), removed on drop.
struct InstalledDebugFile(PathBuf);

impl InstalledDebugFile {
    fn install(bin: &Path, build_id: &str) -> Self {
        let dir = Path::new("/usr/lib/debug/.build-id").join(&build_id[..2]);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}.debug", &build_id[2..]));
        run(Command::new("objcopy").arg("--only-keep-debug").arg(bin).arg(&path));
        InstalledDebugFile(path)
    }
}

impl Drop for InstalledDebugFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `PT_LOAD` segments of `bin` as (file offset, virtual address, file size),
/// from `readelf -lW`.
fn load_segments(bin: &Path) -> Vec<(u64, u64, u64)> {
    let out = Command::new("readelf").arg("-lW").arg(bin).output().expect("readelf");
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with("LOAD "))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (hex(f[1]), hex(f[2]), hex(f[4]))
        })
        .collect()
}

/// `addr2line -f -C -e FILE` of each of `vaddrs`: the function holding
/// each address, innermost inlined one first as binutils reports it.
fn addr2line_functions(file: &Path, vaddrs: &[u64]) -> Vec<String> {
    let mut names = Vec::with_capacity(vaddrs.len());
    for chunk in vaddrs.chunks(500) {
        let out = Command::new("addr2line")
            .args(["-f", "-C", "-e"])
            .arg(file)
            .args(chunk.iter().map(|a| format!("{a:#x}")))
            .output()
            .expect("addr2line");
        assert!(out.status.success(), "addr2line: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        // Two lines per address: function, file:line.
        names.extend(text.lines().step_by(2).map(str::to_owned));
    }
    assert_eq!(names.len(), vaddrs.len());
    names
}

/// One workload: the binary it runs, the file addr2line reads, its process.
struct Workload {
    name: &'static str,
    binary: PathBuf,
    debug: PathBuf,
    child: Child,
}

/// Named and all samples of `w` in `samples` (one profile's, read by Go's
/// pprof): a sample counts when its leaf (its first user frame) is in `w`'s
/// binary, and is named when the processor's function there is the one
/// `addr2line -f -C` gives for that address.
fn named_share(samples: &[(u32, Stack)], w: &Workload) -> (u64, u64, Vec<String>) {
    let pid = w.child.id();
    let segments = load_segments(&w.binary);
    let binary_name = w.binary.file_name().unwrap().to_string_lossy().into_owned();
    let mut leaves = Vec::new();
    for (_, s) in samples.iter().filter(|(p, _)| *p == pid) {
        // The innermost function of the leaf's location comes first.
        let Some(leaf) =
            s.frames.iter().find(|f| f.file_offset.is_some() && (!f.mapping.starts_with('[') || f.mapping == "[vdso]"))
        else {
            continue;
        };
        if !leaf.mapping.ends_with(&format!("/{binary_name}")) {
            continue;
        }
        let file_offset = leaf.file_offset.unwrap();
        let vaddr = segments
            .iter()
            .find(|&&(off, _, size)| file_offset >= off && file_offset - off < size)
            .map(|&(off, va, _)| file_offset - off + va)
            .unwrap_or_else(|| panic!("{}: file offset {file_offset:#x} in no segment", w.name));
        let function = Some(leaf.name.clone()).filter(|n| !n.is_empty() && n != "??");
        leaves.push((vaddr, function, s.count));
    }
    let truth = addr2line_functions(&w.debug, &leaves.iter().map(|l| l.0).collect::<Vec<_>>());
    let (mut named, mut all, mut wrong) = (0, 0, Vec::new());
    for ((vaddr, got, count), want) in leaves.iter().zip(&truth) {
        all += count;
        if got.as_deref() == Some(want.as_str()) {
            named += count;
        } else if wrong.len() < 10 {
            wrong.push(format!("{vaddr:#x}: {got:?}, addr2line says {want:?}"));
        }
    }
    (named, all, wrong)
}

/// The `user_symbols` series of the embedded default's /metrics
/// (127.0.0.1:8888).
fn user_symbols_series() -> String {
    use std::io::{Read, Write};
    let Ok(mut conn) = std::net::TcpStream::connect("127.0.0.1:8888") else {
        return "(no /metrics on 127.0.0.1:8888)".into();
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    let mut body = String::new();
    let _ = conn.read_to_string(&mut body);
    body.lines().filter(|l| l.starts_with("profcol_processor_user_symbols")).collect::<Vec<_>>().join("\n")
}

fn profiles_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(dir).map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    files.retain(|p| p.to_string_lossy().ends_with(".pb.gz"));
    files.sort();
    files
}

#[test]
fn the_embedded_default_names_the_leaf_functions_of_c_go_and_rust_programs() {
    let test = "the_embedded_default_names_the_leaf_functions_of_c_go_and_rust_programs";
    if !require(test, profcol_receivers::ebpf::bpf::privileges::Privileges::current().check()) {
        return;
    }
    for (tool, args) in [
        ("gcc", &["--version"][..]),
        ("go", &["version"][..]),
        ("addr2line", &["--version"][..]),
        ("objcopy", &["--version"][..]),
        ("readelf", &["--version"][..]),
    ] {
        if !require(test, tool_available(tool, args).then_some(()).ok_or(format!("{tool} is needed"))) {
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let build = dir.path().join("build");
    let run_dir = dir.path().join("run");
    std::fs::create_dir_all(&build).unwrap();
    std::fs::create_dir_all(&run_dir).unwrap();

    let c_full = build_c(&build, "named_c_full", 1);
    let c_built = build_c(&build, "named_c_stripped", 2);
    let c_stripped = run_dir.join("named_c_stripped");
    run(Command::new("strip").arg("--strip-all").arg("-o").arg(&c_stripped).arg(&c_built));
    let _debug_file = InstalledDebugFile::install(&c_built, &build_id(&c_built));
    let rust = build_rust(&build);
    let go = build_go(&build);

    let spawn = |name: &'static str, binary: PathBuf, debug: PathBuf| Workload {
        name,
        child: Command::new(&binary).stdout(Stdio::null()).spawn().expect("start a workload"),
        binary,
        debug,
    };
    let mut workloads = vec![
        spawn("C -O2 -g", c_full.clone(), c_full),
        spawn("C stripped, debug file by build id", c_stripped, c_built),
        spawn("Rust release", rust.clone(), rust),
        spawn("Go", go.clone(), go),
    ];

    // As the README runs it: no --config, from a directory of its own
    // (the default writes ./profiles).
    let log = std::fs::File::create(dir.path().join("profcol.log")).unwrap();
    let mut agent = Command::new(env!("CARGO_BIN_EXE_profcol"))
        .current_dir(&run_dir)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start profcol");
    let profiles = run_dir.join("profiles");
    let log_text = || std::fs::read_to_string(dir.path().join("profcol.log")).unwrap_or_default();
    // The first report comes a report interval (a minute) after start; a
    // few seconds more, then SIGTERM writes the last one.
    let t0 = Instant::now();
    while profiles_in(&profiles).is_empty() {
        assert!(agent.try_wait().unwrap().is_none(), "profcol exited:\n{}", log_text());
        assert!(t0.elapsed() < Duration::from_secs(150), "no profile in 150 s:\n{}", log_text());
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_secs(8));
    // What the processor counted (named, pending, no symbols...), for a
    // failure message.
    let counted = user_symbols_series();
    // SAFETY: kill has no memory effects; the pid is our child's.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let status = agent.wait().unwrap();
    for w in &mut workloads {
        let _ = w.child.kill();
        let _ = w.child.wait();
    }
    assert!(status.success(), "profcol at SIGTERM: {status:?}\n{}", log_text());

    let files = profiles_in(&profiles);
    assert!(files.len() >= 2, "a profile at the first report and one at SIGTERM: {files:?}\n{}", log_text());
    for file in &files {
        let samples = read_raw(file);
        for w in &workloads {
            let (named, all, wrong) = named_share(&samples, w);
            eprintln!("{}: {}: {named} of {all} samples named", file.display(), w.name);
            assert!(all >= 10, "{}: {all} samples with a leaf in its binary in {}", w.name, file.display());
            assert!(
                named * 100 >= all * 95,
                "{}: leaf function named as addr2line names it in {named} of {all} samples of {}; e.g. {wrong:#?}\n\
                 before SIGTERM:\n{counted}\n{}",
                w.name,
                file.display(),
                log_text()
            );
        }
    }
}
