//! The module against real CPythons: every 3.9–3.13 pyenv has installed
//! (`$PYENV_ROOT` or `pyenv root`) and Debian's /usr/bin/python3.11.
//!
//! - `offsets_match_headers`: the tables equal what a C program compiled
//!   against each version's own (internal) headers prints; for 3.13 the
//!   table read from the binary's `_Py_DebugOffsets` does.
//! - `names_and_lines_*`: a real interpreter runs a script with nested
//!   functions, a method, a generator, a lambda and non-ASCII names, prints
//!   its code objects' addresses and CPython's own (offset, line) pairs,
//!   and waits; the process is detected and every pair is named back. The
//!   BPF walk, done here in user space with the same offsets (runtime →
//!   interpreter → thread → frames, C-entry frames skipped), must give the
//!   stack CPython reports for the waiting thread: a method, a running
//!   generator entered through a C call, names and lines.
//!
//! Under CI=true a missing interpreter or C compiler fails; elsewhere the
//! test says why it skips.

use super::detect::{detect, Detection, PythonProcess, Unsupported};
use super::namer::{read_vm, NameError, PyNamer, MAX_STRING};
use super::offsets::{self, PyOffsets, NONE};
use profcol_elf::ElfFile;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Fails under CI, else prints why and returns.
fn missing(what: &str) {
    assert!(!in_ci(), "CI=true and {what}");
    eprintln!("skipped: {what}");
}

fn pyenv_root() -> Option<PathBuf> {
    if let Some(root) = std::env::var_os("PYENV_ROOT") {
        return Some(PathBuf::from(root));
    }
    let out = Command::new("pyenv").arg("root").output().ok()?;
    let root = String::from_utf8(out.stdout).ok()?;
    out.status.success().then(|| PathBuf::from(root.trim()))
}

/// The newest pyenv install of 3.`minor` (a release with the GIL).
fn pyenv_python(minor: u8) -> Option<PathBuf> {
    pyenv_install(3, minor)
}

/// The newest pyenv install of `major.minor`.
fn pyenv_install(major: u8, minor: u8) -> Option<PathBuf> {
    let versions = pyenv_root()?.join("versions");
    let prefix = format!("{major}.{minor}.");
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(versions)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let patch = name.strip_prefix(&prefix)?.parse().ok()?;
            Some((patch, e.path()))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

/// Every field with its name, in the C probe's names.
fn fields(o: &PyOffsets) -> Vec<(&'static str, u16)> {
    vec![
        ("runtime_interpreters_head", o.runtime_interpreters_head),
        ("interp_next", o.interp_next),
        ("interp_threads_head", o.interp_threads_head),
        ("tstate_next", o.tstate_next),
        ("tstate_thread_id", o.tstate_thread_id),
        ("tstate_native_thread_id", o.tstate_native_thread_id),
        ("tstate_frame", o.tstate_frame),
        ("cframe_current_frame", o.cframe_current_frame),
        ("frame_previous", o.frame_previous),
        ("frame_code", o.frame_code),
        ("frame_instr", o.frame_instr),
        ("frame_owner", o.frame_owner),
        ("frame_is_entry", o.frame_is_entry),
        ("code_filename", o.code_filename),
        ("code_name", o.code_name),
        ("code_qualname", o.code_qualname),
        ("code_firstlineno", o.code_firstlineno),
        ("code_linetable", o.code_linetable),
        ("code_adaptive", o.code_adaptive),
        ("unicode_state", o.unicode_state),
        ("unicode_length", o.unicode_length),
        ("ascii_data", o.ascii_data),
        ("compact_data", o.compact_data),
        ("bytes_size", o.bytes_size),
        ("bytes_data", o.bytes_data),
    ]
}

/// Compiles and runs the C probe against `prefix`'s headers: (name, value)
/// lines, -1 for absent.
fn header_offsets(prefix: &Path, minor: u8, out_dir: &Path) -> Vec<(String, i64)> {
    let include = prefix.join(format!("include/python3.{minor}"));
    let src = out_dir.join("offsets_probe.c");
    std::fs::write(&src, include_str!("offsets_probe.c")).unwrap();
    let exe = out_dir.join(format!("probe3{minor}"));
    let cc = Command::new("cc").arg("-DPy_BUILD_CORE").arg("-I").arg(&include).arg("-o").arg(&exe).arg(&src).output();
    let cc = cc.unwrap_or_else(|e| panic!("running cc: {e}"));
    assert!(cc.status.success(), "cc against {}: {}", include.display(), String::from_utf8_lossy(&cc.stderr));
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_owned(), v.parse().unwrap())
        })
        .collect()
}

/// The offsets detection uses for 3.`minor` in this install's binary.
fn table_of(prefix: &Path, minor: u8) -> PyOffsets {
    if minor < 13 {
        return offsets::for_version((3, minor)).unwrap();
    }
    // `_PyRuntime` is in libpython for a shared build, else in the executable.
    let candidates =
        [prefix.join(format!("lib/libpython3.{minor}.so.1.0")), prefix.join(format!("bin/python3.{minor}"))];
    for path in candidates {
        let Ok(file) = std::fs::File::open(&path) else { continue };
        let elf = ElfFile::open(&file).unwrap();
        let (found, _) = elf.find_objects(&["_PyRuntime"]);
        let Some(runtime) = &found[0] else { continue };
        let blob = elf.bytes_at(runtime.address, offsets::DEBUG_OFFSETS_MAX.min(runtime.size as usize)).unwrap();
        let table = offsets::from_debug_offsets(blob).unwrap();
        assert_eq!(table.version_hex >> 16, 0x0300 | u32::from(minor));
        assert_eq!(table.runtime_size, runtime.size, "sizeof(_PyRuntimeState)");
        return table.offsets;
    }
    panic!("no _PyRuntime in {}", prefix.display());
}

#[test]
fn offsets_match_headers() {
    if Command::new("cc").arg("--version").output().is_err() {
        return missing("no C compiler (cc)");
    }
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for minor in 9..=13u8 {
        let Some(prefix) = pyenv_python(minor) else {
            missing(&format!("no pyenv Python 3.{minor}"));
            continue;
        };
        let headers = header_offsets(&prefix, minor, dir.path());
        let get = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
        assert_eq!(get("free_threaded"), Some(0), "{}: a free-threaded build", prefix.display());
        let table = table_of(&prefix, minor);
        let mut wrong = Vec::new();
        for (name, value) in fields(&table) {
            let want = get(name).unwrap_or_else(|| panic!("probe prints no {name}"));
            let want = if want < 0 { NONE } else { u16::try_from(want).unwrap() };
            if value != want {
                wrong.push(format!("{name}: table {value}, headers {want}"));
            }
        }
        assert!(wrong.is_empty(), "Python 3.{minor} ({}):\n{}", prefix.display(), wrong.join("\n"));
        checked += 1;
    }
    eprintln!("{checked} versions checked against their headers");
}

/// The script the interpreter runs: its code objects live in `code`'s
/// constants while it waits on stdin.
const SCRIPT: &str = r#"
import ctypes, dis, json, sys, types

SRC = '''
def outer(x):
    def inner(y):
        total = 0
        for i in range(y):
            total += i
        return (total +
                x)
    return inner

class Klass:
    def method(self, a,
               b):
        c = a + b
        if c > 10:
            c = c - 1
        return c * 2

def gen(n):
    for i in range(n):
        yield i * 2

lam = lambda q: (q +
                 1)

def grüße():
    return "ü"

def 函数():
    return 1

def 𐀀():
    return 2
'''

# A name past the namer's cut, and a line table past its first read.
SRC += "\ndef " + "n" * 1100 + "():\n    return 0\n"
SRC += "\ndef big():\n" + "".join("    v%d = %d\n" % (i, i) for i in range(300))

code = compile(SRC, sys.argv[1], "exec")
ns = {}
exec(code, ns)

def walk(c):
    yield c
    for k in c.co_consts:
        if isinstance(k, types.CodeType):
            yield from walk(k)

def lines_of(c):
    offsets = [i.offset for i in dis.get_instructions(c)]
    out = []
    if hasattr(c, "co_lines"):
        ranges = [r for r in c.co_lines() if r[2] is not None]
        for off in offsets:
            for s, e, l in ranges:
                if s <= off < e:
                    out.append((off, l))
                    break
    else:
        starts = list(dis.findlinestarts(c))
        for off in offsets:
            line = None
            for s, l in starts:
                if s <= off:
                    line = l
            if line is not None:
                out.append((off, line))
    return out

api = ctypes.pythonapi
report = {
    "version": list(sys.version_info[:2]),
    "runtime": ctypes.addressof(ctypes.c_char.in_dll(api, "_PyRuntime")),
    "eval": ctypes.cast(api._PyEval_EvalFrameDefault, ctypes.c_void_p).value,
    "not_code": id(SRC),
    "codes": [
        {
            "id": id(c),
            "name": getattr(c, "co_qualname", c.co_name),
            "file": c.co_filename,
            "first": c.co_firstlineno,
            "lines": lines_of(c),
        }
        for c in walk(code)
    ],
}
import threading

def stack_here():
    f, out = sys._getframe(1), []
    while f is not None:
        out.append((getattr(f.f_code, "co_qualname", f.f_code.co_name), f.f_lineno))
        f = f.f_back
    return out

report["thread"] = threading.get_ident()
report["native_thread"] = threading.get_native_id()

def wait():
    # One line: the frame is at this line while it blocks.
    print(json.dumps(dict(report, stack=stack_here())), flush=True); sys.stdin.read()

# A method, and a running generator (its frame lives in the generator)
# entered through a C call (next), between the module and wait().
class Runner:
    def run(self):
        return next(self.steps())

    def steps(self):
        yield wait()

Runner().run()
"#;

/// Kills the interpreter when a check fails.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn names_and_lines(python: &Path, version: (u8, u8)) {
    let started = std::time::Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("probe.py");
    std::fs::write(&script, SCRIPT).unwrap();
    // A file name with Latin-1 and Cyrillic characters (a kind-2 string).
    let file = dir.path().join("naïve_файл.py").to_string_lossy().into_owned();
    let mut child = Running(
        Command::new(python)
            .arg(&script)
            .arg(&file)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", python.display())),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(!line.is_empty(), "{} printed nothing (see its stderr)", python.display());
    let report: serde_json::Value = serde_json::from_str(&line).unwrap();
    let pid = child.0.id();

    let process: PythonProcess = match detect(pid).unwrap() {
        Detection::Python(p) => p,
        other => panic!("{}: {other:?}", python.display()),
    };
    assert_eq!(process.version, version);
    assert_eq!(report["version"], serde_json::json!([version.0, version.1]));
    assert_eq!(process.runtime_addr, report["runtime"].as_u64().unwrap(), "_PyRuntime");
    let eval = report["eval"].as_u64().unwrap();
    assert!(
        process.eval_ranges.iter().any(|&(lo, hi)| lo <= eval && eval < hi),
        "_PyEval_EvalFrameDefault at {eval:#x}, ranges {:x?}",
        process.eval_ranges
    );
    assert_ne!(process.code_type_addr, 0, "PyCode_Type");

    let mut namer = PyNamer::new(pid, &process);
    let codes = report["codes"].as_array().unwrap();
    let mut names = Vec::new();
    let mut pairs = 0;
    for c in codes {
        let id = c["id"].as_u64().unwrap();
        let want_name = c["name"].as_str().unwrap();
        let first = c["first"].as_u64().unwrap() as u32;
        // The first naming reads the code object; its co_code_adaptive
        // address makes the 3.11+ instruction pointers.
        let f = namer.frame(id, if version >= (3, 11) { 0 } else { u64::from(u32::MAX) }).unwrap();
        // Names are cut at MAX_STRING bytes.
        let want_name = &want_name[..want_name.len().min(MAX_STRING)];
        assert_eq!(&*f.name, want_name);
        assert_eq!(&*f.file, c["file"].as_str().unwrap());
        let info = namer.cached(id).unwrap().clone();
        assert_eq!(info.first_line, first, "{want_name}");
        assert_eq!(f.line, first, "{want_name}: a frame not started is at its first line");
        for pair in c["lines"].as_array().unwrap() {
            let offset = pair[0].as_u64().unwrap();
            let want = pair[1].as_u64().unwrap() as u32;
            let instr = match version {
                (3, 9) => offset,
                (3, 10) => offset / 2,
                _ => info.code_adaptive_addr + offset,
            };
            let got = namer.frame(id, instr).unwrap();
            assert_eq!(got.line, want, "{want_name} at byte {offset}");
            pairs += 1;
        }
        names.push(want_name.to_owned());
    }
    for want in ["outer", "gen", "<lambda>", "grüße", "函数", "𐀀", "<module>", "big", &"n".repeat(MAX_STRING)] {
        assert!(names.iter().any(|n| n == want), "{want} not among {names:?}");
    }
    let qualified = if version >= (3, 11) { ["outer.<locals>.inner", "Klass.method"] } else { ["inner", "method"] };
    for want in qualified {
        assert!(names.iter().any(|n| n == want), "{want} not among {names:?}");
    }
    assert!(pairs > 50, "only {pairs} (offset, line) pairs");
    assert_eq!(namer.counts.reads, codes.len() as u64);
    assert_eq!(namer.counts.hits, pairs);
    // The header, then the three objects at once; one more read each for
    // the long name's characters and big()'s line table.
    assert_eq!(namer.counts.vm_reads, 2 * codes.len() as u64 + 2, "{:?}", namer.counts);

    walk_matches_cpython(pid, &process, &report, &mut namer);

    // A str is not a code object; an unmapped address is a read error.
    let not_code = report["not_code"].as_u64().unwrap();
    assert!(matches!(namer.frame(not_code, 0), Err(NameError::NotCode)));
    assert!(matches!(namer.frame(8, 0), Err(NameError::Read(_) | NameError::Short)));
    assert_eq!((namer.counts.invalid, namer.counts.read_errors), (1, 1), "{:?}", namer.counts);

    child.0.stdin.take().unwrap().write_all(b"").unwrap();
    eprintln!("{}: {} code objects, {pairs} lines named in {:?}", python.display(), codes.len(), started.elapsed());
}

/// Reads a `u64` of the process.
fn read_u64(pid: u32, addr: u64) -> u64 {
    let mut b = [0u8; 8];
    let n = read_vm(pid as i32, &mut [(addr, &mut b)]).unwrap_or_else(|e| panic!("reading {addr:#x}: {e}"));
    assert_eq!(n, 8, "reading {addr:#x}");
    u64::from_le_bytes(b)
}

/// The walk the BPF program makes, done here with the same offsets: from
/// `_PyRuntime` to the waiting thread's frames, each named; it must give
/// the stack CPython itself reports (names and lines, innermost first).
fn walk_matches_cpython(pid: u32, p: &PythonProcess, report: &serde_json::Value, namer: &mut PyNamer) {
    let o = &p.offsets;
    let at = |base: u64, off: u16| {
        assert_ne!(off, NONE);
        read_u64(pid, base + u64::from(off))
    };
    let interp = at(p.runtime_addr, o.runtime_interpreters_head);
    assert_eq!(at(interp, o.interp_next), 0, "one interpreter");
    let thread = report["thread"].as_u64().unwrap();
    let mut tstate = at(interp, o.interp_threads_head);
    while tstate != 0 && at(tstate, o.tstate_thread_id) != thread {
        tstate = at(tstate, o.tstate_next);
    }
    assert_ne!(tstate, 0, "no thread state with thread_id {thread:#x}");
    if o.tstate_native_thread_id != NONE {
        assert_eq!(at(tstate, o.tstate_native_thread_id), report["native_thread"].as_u64().unwrap());
    }
    let mut frame = at(tstate, o.tstate_frame);
    if o.cframe_current_frame != NONE {
        frame = at(frame, o.cframe_current_frame);
    }
    let mut stack = Vec::new();
    let mut shims = 0; // eval calls' entry frames
    while frame != 0 && stack.len() < 64 {
        let owner = if o.frame_owner == NONE { 0 } else { at(frame, o.frame_owner) as u8 };
        if Some(owner) == offsets::cstack_owner(p.version) {
            shims += 1;
        } else {
            // 3.11 marks the first frame of each eval call instead.
            if o.frame_is_entry != NONE && at(frame, o.frame_is_entry) & 0xff != 0 {
                shims += 1;
            }
            let f = namer.frame(at(frame, o.frame_code), at(frame, o.frame_instr)).unwrap();
            stack.push(serde_json::json!([&*f.name, f.line]));
        }
        frame = at(frame, o.frame_previous);
    }
    eprintln!("walked: {stack:?}, {shims} entry frames");
    assert_eq!(serde_json::Value::from(stack), report["stack"], "walked stack vs CPython's");
    if offsets::cstack_owner(p.version).is_some() || o.frame_is_entry != NONE {
        // The module's eval call and next()'s.
        assert_eq!(shims, 2, "3.11+: one entry frame per eval call");
    }
}

fn names_and_lines_pyenv(minor: u8) {
    let Some(prefix) = pyenv_python(minor) else {
        return missing(&format!("no pyenv Python 3.{minor}"));
    };
    names_and_lines(&prefix.join(format!("bin/python3.{minor}")), (3, minor));
}

#[test]
fn names_and_lines_3_9() {
    names_and_lines_pyenv(9);
}

#[test]
fn names_and_lines_3_10() {
    names_and_lines_pyenv(10);
}

#[test]
fn names_and_lines_3_11() {
    names_and_lines_pyenv(11);
}

#[test]
fn names_and_lines_3_12() {
    names_and_lines_pyenv(12);
}

#[test]
fn names_and_lines_3_13() {
    names_and_lines_pyenv(13);
}

/// Debian's static, stripped interpreter: `_PyRuntime` and
/// `_PyEval_EvalFrameDefault` from `.dynsym` only.
#[test]
fn names_and_lines_debian_python3_11() {
    let python = Path::new("/usr/bin/python3.11");
    if !python.exists() {
        return missing("no /usr/bin/python3.11");
    }
    names_and_lines(python, (3, 11));
}

/// Interpreters older than 3.9 are detected as Python and refused with
/// their version (a reason the receiver counts). Extra versions: skipped
/// where pyenv has none, under CI too.
#[test]
fn older_interpreters_are_refused() {
    let mut checked = 0;
    for (major, minor) in [(3u8, 8u8), (2, 7)] {
        let Some(prefix) = pyenv_install(major, minor) else {
            eprintln!("skipped: no pyenv Python {major}.{minor}");
            continue;
        };
        let python = prefix.join(format!("bin/python{major}.{minor}"));
        let mut child = Running(
            Command::new(&python)
                .args(["-c", "import sys; sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("starting {}: {e}", python.display())),
        );
        let mut line = String::new();
        BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        match detect(child.0.id()).unwrap() {
            Detection::Unsupported { reason: Unsupported::TooOld(a, b), .. } => assert_eq!((a, b), (major, minor)),
            other => panic!("{}: {other:?}", python.display()),
        }
        checked += 1;
    }
    eprintln!("{checked} older interpreters refused");
}

/// A second process of the same interpreter is found from the file read
/// for the first (one cache entry), at its own load address.
#[test]
fn interpreter_files_are_read_once() {
    let Some(prefix) = pyenv_python(12) else { return missing("no pyenv 3.12") };
    let python = prefix.join("bin/python3.12");
    let start = || {
        Running(
            Command::new(&python)
                .args(["-c", "import ctypes, sys; print(ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, '_PyRuntime')), flush=True); sys.stdin.read()"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    };
    let (mut a, mut b) = (start(), start());
    let runtime_of = |c: &mut Running| {
        let mut line = String::new();
        BufReader::new(c.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
        line.trim().parse::<u64>().unwrap()
    };
    let (ra, rb) = (runtime_of(&mut a), runtime_of(&mut b));
    assert_ne!(ra, rb, "two processes, two load addresses (ASLR)");
    let mut d = super::detect::Detector::default();
    for (c, want) in [(&a, ra), (&b, rb)] {
        match d.detect(c.0.id()).unwrap() {
            Detection::Python(p) => assert_eq!(p.runtime_addr, want),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(d.cached_files(), 1, "the interpreter file read once");
}
