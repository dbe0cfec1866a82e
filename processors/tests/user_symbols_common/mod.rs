//! Shared by the user_symbols tests: a C workload compiled here with `-g`
//! (and stripped copies whose debug files live in a `.build-id` tree or
//! next to them through `.gnu_debuglink`), binutils' `addr2line` as the
//! reference, and the native frames of a batch as the processor left them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use profcol_api::model::{any_value::Value, keys, pb, str_at, AttrValue, ProfileMeta, ProfilesBuilder, Resource};
use profcol_api::Profiles;
use profcol_testkit::tools::tool_available;

/// A CPU-bound call chain: `main` → `outer_loop` → `middle` → `leaf_work`
/// with `mix` inlined into it. Frame pointers everywhere (the kernel walks
/// user stacks by them; gcc gives a leaf function none, so `leaf_work`
/// calls `tick` now and then); no tail calls (`sink += r` after each call).
/// `VARIANT` changes the code, so each variant has its own build id.
pub(crate) const WORKLOAD: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifndef VARIANT
#define VARIANT 0
#endif
volatile unsigned long sink;
static inline __attribute__((always_inline)) unsigned long mix(unsigned long x) {
    x ^= x >> 13;
    x *= 0x9E3779B97F4A7C15UL + VARIANT;
    return x ^ (x >> 7);
}
__attribute__((noinline)) void tick(void) { __asm__ volatile(""); }
__attribute__((noinline)) unsigned long leaf_work(unsigned long n) {
    unsigned long s = 0;
    for (unsigned long i = 0; i < n; i++) {
        s += mix(i + s);
        if ((i & 1023) == 0)
            tick();
    }
    sink = s;
    return s;
}
__attribute__((noinline)) unsigned long middle(unsigned long n) {
    unsigned long r = leaf_work(n);
    sink += r;
    return r + 1;
}
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) unsigned long outer_loop(double seconds) {
    double end = now() + seconds;
    unsigned long r = 0;
    while (now() < end)
        r += middle(100000);
    sink += r;
    return r;
}
int main(int argc, char **argv) {
    char line[16];
    double seconds = argc > 1 ? atof(argv[1]) : 1.5;
    if (!fgets(line, sizeof line, stdin))
        return 1;
    outer_loop(seconds);
    return 0;
}
"#;

/// The workload's own functions.
pub(crate) const FUNCTIONS: [&str; 5] = ["main", "outer_loop", "middle", "leaf_work", "mix"];

/// Whether gcc and binutils are here (fails under CI=true when not).
pub(crate) fn tools_available() -> bool {
    tool_available("gcc", &["--version"])
        && tool_available("addr2line", &["--version"])
        && tool_available("objcopy", &["--version"])
        && tool_available("strip", &["--version"])
}

/// Compiles the workload with `-g` into `dir/name` (variant `variant`).
pub(crate) fn compile(dir: &Path, name: &str, variant: u32) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, WORKLOAD).unwrap();
    let out = dir.join(name);
    let status = Command::new("gcc")
        .args(["-g", "-O2", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-Wl,--build-id"])
        .arg(format!("-DVARIANT={variant}"))
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("run gcc");
    assert!(status.success(), "gcc {name}");
    out
}

fn run(cmd: &str, args: &[&std::ffi::OsStr]) {
    let status = Command::new(cmd).args(args).status().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(status.success(), "{cmd} {args:?}");
}

/// The separate debug file of `bin` (objcopy --only-keep-debug).
pub(crate) fn debug_file(bin: &Path, out: &Path) {
    run("objcopy", &["--only-keep-debug".as_ref(), bin.as_os_str(), out.as_os_str()]);
}

/// A stripped copy of `bin` at `out`.
pub(crate) fn stripped(bin: &Path, out: &Path) {
    run("strip", &["-o".as_ref(), out.as_os_str(), bin.as_os_str()]);
}

/// Adds a `.gnu_debuglink` to `debug` into the stripped `bin`, in place.
pub(crate) fn add_debuglink(bin: &Path, debug: &Path) {
    let link = format!("--add-gnu-debuglink={}", debug.display());
    let tmp = bin.with_extension("linking");
    run("objcopy", &[link.as_ref(), bin.as_os_str(), tmp.as_os_str()]);
    std::fs::rename(&tmp, bin).unwrap();
}

/// The GNU build id of `bin`, hex.
pub(crate) fn build_id(bin: &Path) -> String {
    let elf = profcol_elf::ElfFile::open(&std::fs::File::open(bin).unwrap()).unwrap();
    profcol_elf::notes::hex(elf.gnu_build_id().expect("gcc writes a build id"))
}

/// Puts `debug` under `root/.build-id/xx/rest.debug` for `build_id`.
pub(crate) fn install_by_build_id(root: &Path, build_id: &str, debug: &Path) {
    let dir = root.join(".build-id").join(&build_id[..2]);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(debug, dir.join(format!("{}.debug", &build_id[2..]))).unwrap();
}

/// (function, source file base name, line), innermost first.
pub(crate) type Frame = (String, String, u32);

fn base(p: &str) -> String {
    p.rsplit('/').next().unwrap_or(p).to_owned()
}

/// binutils `addr2line -a -f -i -C -e FILE` for each of `vaddrs`.
pub(crate) fn addr2line(file: &Path, vaddrs: &[u64]) -> Vec<Vec<Frame>> {
    let mut out = Vec::with_capacity(vaddrs.len());
    for chunk in vaddrs.chunks(500) {
        let o = Command::new("addr2line")
            .args(["-a", "-f", "-i", "-C", "-e"])
            .arg(file)
            .args(chunk.iter().map(|a| format!("{a:#x}")))
            .output()
            .expect("run addr2line");
        assert!(o.status.success(), "addr2line: {}", String::from_utf8_lossy(&o.stderr));
        let text = String::from_utf8(o.stdout).unwrap();
        let mut lines = text.lines().peekable();
        while let Some(addr) = lines.next() {
            assert!(addr.starts_with("0x"), "addr2line -a output: {addr}");
            let mut frames = Vec::new();
            while lines.peek().is_some_and(|l| !l.starts_with("0x")) {
                let func = lines.next().unwrap().to_owned();
                let loc = lines.next().unwrap_or("??:0");
                let (file, line) = loc.rsplit_once(':').unwrap_or((loc, "0"));
                let line = line.split_whitespace().next().unwrap_or("0").parse().unwrap_or(0);
                // binutils says "??" where it knows nothing; the processor leaves it empty.
                let unknown = |s: String| if s == "??" { String::new() } else { s };
                frames.push((unknown(func), unknown(base(file)), line));
            }
            out.push(frames);
        }
    }
    assert_eq!(out.len(), vaddrs.len());
    out
}

/// A native frame of the batch, as the processor left it.
#[derive(Debug, Clone)]
pub(crate) struct NativeFrame {
    pub mapping: String,
    pub build_id: Option<String>,
    /// The offset the processor looks up (−1 for return addresses).
    pub lookup_offset: u64,
    pub frames: Vec<Frame>,
    /// Observations of the sample this frame is in.
    pub weight: u64,
}

/// Every native user frame of `batches` whose mapping file name ends with
/// one of `suffixes` (each sampled frame once, weighted).
pub(crate) fn native_frames(batches: &[Profiles], suffixes: &[&str]) -> Vec<NativeFrame> {
    let mut out = Vec::new();
    for b in batches {
        b.validate().expect("batch is valid");
        let Some(d) = b.dictionary() else { continue };
        let s = |i: i32| str_at(&d.string_table, i).to_owned();
        let frame_type = |l: &profcol_api::model::pb::Location| {
            l.attribute_indices.iter().find_map(|&a| {
                let kv = &d.attribute_table[a as usize];
                if s(kv.key_strindex) != keys::FRAME_TYPE {
                    return None;
                }
                match kv.value.clone()?.value? {
                    Value::StringValue(v) => Some(v),
                    _ => None,
                }
            })
        };
        for p in b.0.resource_profiles.iter().flat_map(|r| &r.scope_profiles).flat_map(|s| &s.profiles) {
            for smp in &p.samples {
                let weight = smp.timestamps_unix_nano.len().max(1) as u64;
                let mut first_user = true;
                for &li in &d.stack_table[smp.stack_index as usize].location_indices {
                    let l = &d.location_table[li as usize];
                    if frame_type(l).as_deref() == Some("kernel") {
                        continue;
                    }
                    let exact = first_user;
                    first_user = false;
                    let m = &d.mapping_table[l.mapping_index as usize];
                    let mapping = s(m.filename_strindex);
                    if !suffixes.iter().any(|x| mapping.ends_with(x)) {
                        continue;
                    }
                    let build_id = m.attribute_indices.iter().find_map(|&a| {
                        let kv = &d.attribute_table[a as usize];
                        (s(kv.key_strindex) == keys::BUILD_ID_GNU).then(|| match kv.value.clone()?.value? {
                            Value::StringValue(v) => Some(v),
                            _ => None,
                        })?
                    });
                    let frames = l
                        .lines
                        .iter()
                        .map(|ln| {
                            let f = &d.function_table[ln.function_index as usize];
                            (s(f.name_strindex), base(&s(f.filename_strindex)), ln.line as u32)
                        })
                        .collect();
                    let lookup_offset = profcol_processors::user_symbols::symbolize::lookup_offset(
                        l.address,
                        m.memory_start,
                        m.file_offset,
                        exact,
                    );
                    out.push(NativeFrame { mapping, build_id, lookup_offset, frames, weight });
                }
            }
        }
    }
    out
}

/// How the processor's names compare with binutils' on `frames` of the
/// binary `reference` (unstripped, or its debug file): (agreeing weight,
/// total weight, first disagreements).
pub(crate) fn agreement(reference: &Path, frames: &[NativeFrame]) -> (u64, u64, Vec<String>) {
    let elf = profcol_elf::ElfFile::open(&std::fs::File::open(reference).unwrap()).unwrap();
    let vaddrs: Vec<u64> = frames
        .iter()
        .map(|f| elf.vaddr_of_file_offset(f.lookup_offset).expect("offset inside a PT_LOAD segment"))
        .collect();
    let want = addr2line(reference, &vaddrs);
    let (mut agree, mut total, mut diffs) = (0, 0, Vec::new());
    for ((f, w), vaddr) in frames.iter().zip(&want).zip(&vaddrs) {
        total += f.weight;
        if &f.frames == w {
            agree += f.weight;
        } else if diffs.len() < 10 {
            diffs.push(format!("{vaddr:#x}: ours {:?}, addr2line {:?}", f.frames, w));
        }
    }
    (agree, total, diffs)
}

/// A batch of one sample whose user stack is `offsets` (leaf first) in a
/// mapping of `path` with `build_id` loaded at 0x10000 (offset 0), under a
/// kernel frame and beside an already named frame.
pub(crate) fn batch(path: &Path, build_id: &str, vaddrs: &[u64], elf: &profcol_elf::ElfFile) -> Profiles {
    let mut b = ProfilesBuilder::new();
    let r = b.resource(Resource::default());
    let p = b.profile(r, &ProfileMeta::cpu(10_000_000, 1, 1));
    let native = b.attribute(keys::FRAME_TYPE, AttrValue::Str("native"));
    let kernel = b.attribute(keys::FRAME_TYPE, AttrValue::Str("kernel"));
    let bid = b.attribute(keys::BUILD_ID_GNU, AttrValue::Str(build_id));
    let filename_strindex = b.string(&path.to_string_lossy());
    let base = 0x10000;
    let m = b.mapping(pb::Mapping {
        memory_start: base,
        memory_limit: base + 0x100000,
        file_offset: 0,
        filename_strindex,
        attribute_indices: vec![bid],
    });
    let kname = b.string(keys::KERNEL_MAPPING);
    let km = b.mapping(pb::Mapping { filename_strindex: kname, ..Default::default() });
    let mut locs = vec![b.location(pb::Location {
        mapping_index: km,
        address: 0xffffffff81000000,
        lines: vec![],
        attribute_indices: vec![kernel],
    })];
    for &v in vaddrs {
        let off = elf.file_offset(v).unwrap();
        locs.push(b.location(pb::Location {
            mapping_index: m,
            address: base + off,
            lines: vec![],
            attribute_indices: vec![native],
        }));
    }
    // An interpreter frame someone already named.
    let f = b.function("py_func", "py_func", "x.py", 0);
    locs.push(b.location(pb::Location {
        mapping_index: 0,
        address: 0,
        lines: vec![pb::Line { function_index: f, line: 7, column: 0 }],
        attribute_indices: vec![],
    }));
    let stack_index = b.stack(&locs);
    b.sample(p, pb::Sample { stack_index, values: vec![2], ..Default::default() });
    b.build()
}

/// The frames of the first sample, leaf first: (function names, line).
pub(crate) fn frames(p: &Profiles) -> Vec<Vec<(String, i64)>> {
    let d = p.dictionary().unwrap();
    let s = &p.0.resource_profiles[0].scope_profiles[0].profiles[0].samples[0];
    d.stack_table[s.stack_index as usize]
        .location_indices
        .iter()
        .map(|&l| {
            d.location_table[l as usize]
                .lines
                .iter()
                .map(|ln| {
                    let f = &d.function_table[ln.function_index as usize];
                    (d.string_table[f.name_strindex as usize].clone(), ln.line)
                })
                .collect()
        })
        .collect()
}

pub(crate) fn symbol(elf: &profcol_elf::ElfFile, name: &str) -> (u64, u64) {
    elf.function_symbols().iter().find(|s| s.2 == name).map(|s| (s.0, u64::from(s.1))).unwrap()
}

/// The Go workload (examples/workloads/chain.go).
pub(crate) const GO_PROGRAM: &str = include_str!("../../../examples/workloads/chain.go");

/// Whether a Go toolchain is here (fails under CI=true when not:
/// .ci/user_symbols.sh installs golang-go).
pub(crate) fn go_available() -> bool {
    tool_available("go", &["version"])
}

/// `go build -ldflags LDFLAGS` of the Go workload into `dir/name`.
pub(crate) fn go_build(dir: &Path, name: &str, ldflags: &str) -> PathBuf {
    go_build_with(dir, name, &["-ldflags", ldflags])
}

/// `go build ARGS` of the Go workload into `dir/name`.
pub(crate) fn go_build_with(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.go"));
    std::fs::write(&src, GO_PROGRAM).unwrap();
    let out = dir.join(name);
    let o = Command::new("go")
        .arg("build")
        .args(args)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .env("GO111MODULE", "off")
        .env("GOTOOLCHAIN", "local")
        .env("GOCACHE", std::env::temp_dir().join("profcol-go-cache"))
        .output()
        .expect("run go build");
    assert!(o.status.success(), "go build {name}: {}", String::from_utf8_lossy(&o.stderr));
    out
}

/// `go tool addr2line FILE` for each of `vaddrs`: (function, file, line)
/// as it prints them, full file path; `?` and `-1` (nothing known, or
/// padding after a function) become "" and 0.
pub(crate) fn go_addr2line(file: &Path, vaddrs: &[u64]) -> Vec<(String, String, u32)> {
    use std::io::Write;
    let mut child = Command::new("go")
        .args(["tool", "addr2line"])
        .arg(file)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run go tool addr2line");
    let input: String = vaddrs.iter().map(|a| format!("{a:#x}\n")).collect();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()).unwrap());
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(out.status.success(), "go tool addr2line");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), vaddrs.len() * 2, "two lines per address");
    let known = |s: &str| if s == "?" { String::new() } else { s.to_owned() };
    lines
        .chunks(2)
        .map(|c| {
            let (file, line) = c[1].rsplit_once(':').unwrap_or((c[1], "0"));
            (known(c[0]), known(file), line.parse::<u32>().unwrap_or(0))
        })
        .collect()
}

/// `bin` made into what Fedora ships: stripped of everything, with a
/// `.gnu_debugdata` section holding, xz-compressed, a debug-info-less ELF
/// whose `.symtab` keeps the function symbols `.dynsym` lacks (as
/// find-debuginfo does it: objcopy --only-keep-debug, objcopy -S
/// --keep-symbols, xz, strip, objcopy --add-section).
pub(crate) fn fedora_minidebuginfo(bin: &Path, out: &Path) {
    let work = out.with_extension("mdi");
    std::fs::create_dir_all(&work).unwrap();
    let elf = profcol_elf::ElfFile::open(&std::fs::File::open(bin).unwrap()).unwrap();
    let dynamic: std::collections::BTreeSet<String> = {
        let dynonly = work.join("dynonly");
        stripped(bin, &dynonly);
        let e = profcol_elf::ElfFile::open(&std::fs::File::open(&dynonly).unwrap()).unwrap();
        e.function_symbols().iter().map(|s| s.2).collect()
    };
    let keep: String =
        elf.function_symbols().iter().filter(|s| !dynamic.contains(&s.2)).map(|s| format!("{}\n", s.2)).collect();
    std::fs::write(work.join("keep_symbols"), keep).unwrap();
    let debug = work.join("debug");
    let mini = work.join("mini_debuginfo");
    run("objcopy", &["--only-keep-debug".as_ref(), bin.as_os_str(), debug.as_os_str()]);
    let keep_arg = format!("--keep-symbols={}", work.join("keep_symbols").display());
    run(
        "objcopy",
        &[
            "-S".as_ref(),
            "--remove-section".as_ref(),
            ".gdb_index".as_ref(),
            "--remove-section".as_ref(),
            ".comment".as_ref(),
            keep_arg.as_ref(),
            debug.as_os_str(),
            mini.as_os_str(),
        ],
    );
    run("xz", &["-f".as_ref(), mini.as_os_str()]);
    stripped(bin, &work.join("stripped"));
    let add = format!(".gnu_debugdata={}.xz", mini.display());
    run("objcopy", &["--add-section".as_ref(), add.as_ref(), work.join("stripped").as_os_str(), out.as_os_str()]);
}

/// The C++ workload (examples/workloads/chain.cpp).
pub(crate) const CPP_PROGRAM: &str = include_str!("../../../examples/workloads/chain.cpp");

/// Compiles the C++ workload with `g++ -g -O2` (frame pointers) into `dir/name`.
pub(crate) fn compile_cpp(dir: &Path, name: &str) -> PathBuf {
    let src = dir.join(format!("{name}.cpp"));
    std::fs::write(&src, CPP_PROGRAM).unwrap();
    let out = dir.join(name);
    let status = Command::new("g++")
        .args(["-g", "-O2", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-Wl,--build-id", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("run g++");
    assert!(status.success(), "g++ {name}");
    out
}
