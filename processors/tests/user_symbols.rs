//! user_symbols on batches built here (no root): what is named, what passes
//! untouched, how long a batch waits, the negative cache and the byte bound.
//!
//!     cargo test -p profcol-processors --test user_symbols

mod user_symbols_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use profcol_api::component::{ComponentId, Kind, Processor};
use profcol_api::services::FilePins;
use profcol_api::telemetry::Telemetry;
use profcol_processors::user_symbols::cache::{Cache, State};
use profcol_processors::user_symbols::config::DebuginfodConfig;
use profcol_processors::user_symbols::table::{SearchPaths, Want};
use profcol_processors::user_symbols::{Config, UserSymbols};
use user_symbols_common::*;

#[tokio::test]
async fn names_native_frames_leaves_others_and_waits_at_most_max_wait() {
    if !tools_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = compile(dir.path(), "w", 0);
    let elf = profcol_elf::ElfFile::open(&std::fs::File::open(&bin).unwrap()).unwrap();
    let id = build_id(&bin);
    let (leaf, _) = symbol(&elf, "leaf_work");
    let (middle, msize) = symbol(&elf, "middle");
    // Leaf at leaf_work's first byte; a return address right after
    // middle's call (looked up at −1: inside middle, at the call's line).
    let ret = {
        let code = std::fs::read(&bin).unwrap();
        let off = elf.file_offset(middle).unwrap() as usize;
        let call = code[off..off + msize as usize].iter().position(|&b| b == 0xe8).expect("a call in middle");
        middle + call as u64 + 5
    };
    let input = batch(&bin, &id, &[leaf, ret], &elf);

    // Holds the one loader thread: a binary not on this host is asked of
    // debuginfod, and this server takes the request and answers only when
    // told, so the table below stays queued behind it however fast this
    // machine loads it (max_wait 0 must not name it).
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", server.local_addr().unwrap());
    let (asked, was_asked) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut conn, _) = server.accept().unwrap();
        let _ = conn.read(&mut [0u8; 4096]);
        asked.send(()).unwrap();
        let _ = released.recv();
        let _ = conn.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    });
    let registry = Telemetry::new();
    let cid: ComponentId = "user_symbols".parse().unwrap();
    let p = UserSymbols::with_telemetry(
        Config {
            max_wait: Duration::ZERO,
            debuginfod: DebuginfodConfig { urls: vec![url], timeout: Duration::from_secs(60), ..Default::default() },
            ..Default::default()
        },
        Arc::new(FilePins::default()),
        &registry.component(Kind::Processor, &cid),
    );
    p.start().await.unwrap();
    let held = batch(&dir.path().join("not-on-this-host"), "00aa00aa", &[leaf], &elf);
    let _ = p.symbolize(held).await;
    // max_wait 0: the first batch does not wait for the load.
    let t = Instant::now();
    let first = p.process(input.clone()).await.unwrap().forwarded().unwrap();
    assert!(t.elapsed() < Duration::from_millis(100), "a batch waited {:?}", t.elapsed());
    let f = frames(&first);
    assert!(f[1].is_empty() && f[2].is_empty(), "pending frames stay unnamed: {f:?}");
    assert_eq!(f[3], vec![("py_func".to_owned(), 7)], "named frames pass untouched");
    let metrics = registry.render();
    assert!(
        metrics.contains("outcome=\"unnamed_pending\",processor=\"user_symbols\"} 4"),
        "2 frames × 2 observations pending:\n{metrics}"
    );

    // Let the loader go: the server answers 404. (A loader that never
    // asked fails here instead of hanging.)
    was_asked.recv_timeout(Duration::from_secs(10)).expect("the loader asked the server");
    release.send(()).unwrap();
    holder.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !matches!(p.table_cache().peek(&id), Some(State::Ready(_))) {
        assert!(Instant::now() < deadline, "table never loaded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = p.process(input).await.unwrap().forwarded().unwrap();
    second.validate().unwrap();
    let f = frames(&second);
    assert!(f[0].is_empty(), "kernel frame untouched");
    let want = addr2line(&bin, &[leaf, ret - 1]);
    let names = |v: &[(String, i64)]| v.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(&f[1]), want[0].iter().map(|x| x.0.clone()).collect::<Vec<_>>());
    assert_eq!(f[1].last().unwrap().0, "leaf_work");
    assert_eq!(names(&f[2]), vec!["middle".to_owned()]);
    assert_eq!(f[2][0].1, i64::from(want[1][0].2), "return address named at the call's line");
    assert_eq!(f[3], vec![("py_func".to_owned(), 7)]);
    let metrics = registry.render();
    assert!(metrics.contains("outcome=\"named\",processor=\"user_symbols\"} 4"), "{metrics}");
    assert!(metrics.contains("profcol_processor_user_symbols_tables_loaded_total"), "{metrics}");
}

/// A mapping's path may name anything on this host (at a gateway it comes
/// from another one): a FIFO there, which nobody writes, is passed over,
/// not opened and waited on, and the next binary is loaded.
#[tokio::test]
async fn a_mapping_path_that_is_a_fifo_does_not_hold_the_loader() {
    if !tools_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = compile(dir.path(), "w", 0);
    let elf = profcol_elf::ElfFile::open(&std::fs::File::open(&bin).unwrap()).unwrap();
    let id = build_id(&bin);
    let (leaf, _) = symbol(&elf, "leaf_work");
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: c is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let p = UserSymbols::new(Config { max_wait: Duration::from_secs(5), ..Default::default() }, Default::default());
    let (_, held) = p.symbolize(batch(&fifo, "00aa00aa", &[leaf], &elf)).await;
    assert_eq!(held.named, 0);
    let (out, o) = p.symbolize(batch(&bin, &id, &[leaf], &elf)).await;
    assert!(o.named > 0 && o.pending == 0, "named after the FIFO: {o:?}");
    assert_eq!(frames(&out)[1].last().unwrap().0, "leaf_work");
}

#[tokio::test]
async fn a_missing_binary_is_looked_for_once_per_negative_ttl() {
    if !tools_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = compile(dir.path(), "gone", 0);
    let elf = profcol_elf::ElfFile::open(&std::fs::File::open(&bin).unwrap()).unwrap();
    let id = build_id(&bin);
    let (leaf, _) = symbol(&elf, "leaf_work");
    let input = batch(&bin, &id, &[leaf], &elf);
    drop(elf);
    std::fs::remove_file(&bin).unwrap();
    let registry = Telemetry::new();
    let cid: ComponentId = "user_symbols".parse().unwrap();
    let p = UserSymbols::with_telemetry(
        Config { max_wait: Duration::from_secs(5), ..Default::default() },
        Arc::new(FilePins::default()),
        &registry.component(Kind::Processor, &cid),
    );
    for _ in 0..20 {
        let out = p.process(input.clone()).await.unwrap().forwarded().unwrap();
        assert!(frames(&out)[1].is_empty());
    }
    let metrics = registry.render();
    assert!(metrics.contains("outcome=\"unnamed_no_file\",processor=\"user_symbols\"} 40"), "{metrics}");
    assert!(
        metrics.contains("profcol_processor_user_symbols_tables_missing_total{processor=\"user_symbols\"} 1"),
        "looked for once:\n{metrics}"
    );
}

#[tokio::test]
async fn the_cache_stays_within_its_bytes_least_recently_used_first() {
    if !tools_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, wants) = three_binaries(dir.path(), "b");
    let search = SearchPaths::default();
    // Room for about two tables.
    let one = {
        let c = Cache::start(u64::MAX, Duration::from_secs(60), search.clone(), Arc::new(FilePins::default()));
        let t = wait_ready(&c, &wants[0]).await;
        t.heap_bytes() as u64
    };
    let c = Cache::start(one * 2 + one / 2, Duration::from_secs(60), search, Arc::new(FilePins::default()));
    wait_ready(&c, &wants[0]).await;
    wait_ready(&c, &wants[1]).await;
    c.request(&wants[0]); // b0 used more recently than b1
    wait_ready(&c, &wants[2]).await;
    assert!(c.bytes() as u64 <= one * 2 + one / 2, "{} bytes held", c.bytes());
    assert!(matches!(c.peek(&wants[0].key), Some(State::Ready(_))), "recently used kept");
    assert!(c.peek(&wants[1].key).is_none(), "least recently used evicted");
    assert_eq!(c.counters.evictions.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[tokio::test]
async fn debug_sections_read_in_place_do_not_count_toward_max_bytes() {
    if !tools_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (bins, wants) = three_binaries(dir.path(), "m");
    // Half the binaries' DWARF, as binutils sizes it: too little for the
    // three tables if their debug sections (file pages) counted.
    let dwarf: u64 = bins.iter().map(|b| debug_section_bytes(b)).sum();
    let max = dwarf / 2;
    let c = Cache::start(max, Duration::from_secs(60), SearchPaths::default(), Arc::new(FilePins::default()));
    for w in &wants {
        wait_ready(&c, w).await;
    }
    c.settle();
    let evictions = c.counters.evictions.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(evictions, 0, "max_bytes {max}: heap {} mapped {}", c.bytes(), c.mapped_bytes());
    assert!(wants.iter().all(|w| matches!(c.peek(&w.key), Some(State::Ready(_)))));
    assert!((c.bytes() as u64) < max, "heap {}", c.bytes());
    assert!(c.mapped_bytes() as u64 > max, "the DWARF read in place is shown: {} of {dwarf}", c.mapped_bytes());
}

/// Bytes of a file's `.debug_*` sections, from `readelf -SW`.
fn debug_section_bytes(bin: &std::path::Path) -> u64 {
    let out = std::process::Command::new("readelf").arg("-SW").arg(bin).output().expect("run readelf (binutils)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            let i = t.iter().position(|w| w.starts_with(".debug_"))?;
            u64::from_str_radix(t.get(i + 4)?, 16).ok()
        })
        .sum()
}

/// Three variants of the workload built with `-g` in `dir`, and what a
/// batch asks of each (by build id).
fn three_binaries(dir: &std::path::Path, prefix: &str) -> (Vec<std::path::PathBuf>, Vec<Want>) {
    let bins: Vec<_> = (0..3).map(|i| compile(dir, &format!("{prefix}{i}"), i)).collect();
    let wants = bins
        .iter()
        .map(|b| Want { key: Arc::from(build_id(b)), is_build_id: true, path: Arc::from(&*b.to_string_lossy()) })
        .collect();
    (bins, wants)
}

async fn wait_ready(c: &Cache, w: &Want) -> Arc<profcol_processors::user_symbols::table::BinaryTable> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let State::Ready(t) = c.request(w) {
            return t;
        }
        assert!(Instant::now() < deadline, "{} never loaded", w.path);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A Rust program: `mix` inlined into `leaf_work`, the standard library's
/// range iterator inlined too; mangled (legacy) names.
const RUST_PROGRAM: &str = r#"
use std::hint::black_box;
#[inline(always)]
fn mix(x: u64) -> u64 { let y = x ^ (x >> 13); y.wrapping_mul(0x9E3779B97F4A7C15) ^ (y >> 7) }
#[inline(never)]
fn leaf_work(n: u64) -> u64 { let mut s = 0u64; for i in 0..n { s = s.wrapping_add(mix(i + s)); } black_box(s) }
#[inline(never)]
fn middle(n: u64) -> u64 { let r = leaf_work(n); black_box(r) + 1 }
fn main() { let n: u64 = std::env::args().count() as u64 * 1000; println!("{}", middle(black_box(n))); }
"#;

#[test]
fn a_rust_binary_with_inlined_functions_is_named_as_addr2line_names_it() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    if !tools_available() || !profcol_testkit::tools::tool_available(&rustc, &["--version"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("r.rs");
    std::fs::write(&src, RUST_PROGRAM).unwrap();
    let bin = dir.path().join("r");
    let ok = std::process::Command::new(&rustc)
        .args(["-C", "opt-level=2", "-g", "-C", "force-frame-pointers=yes", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .unwrap()
        .success();
    assert!(ok, "rustc");
    let elf = profcol_elf::ElfFile::open(&std::fs::File::open(&bin).unwrap()).unwrap();
    let want = Want { key: Arc::from(build_id(&bin)), is_build_id: true, path: Arc::from(&*bin.to_string_lossy()) };
    let table = profcol_processors::user_symbols::table::BinaryTable::load(&want, None, &SearchPaths::default())
        .expect("table");
    let mut vaddrs = Vec::new();
    for (start, size, name) in elf.function_symbols().iter() {
        if name.contains("leaf_work") || name.contains("middle") {
            vaddrs.extend(start..start + u64::from(size));
        }
    }
    assert!(vaddrs.len() > 20, "both functions found");
    let reference = addr2line(&bin, &vaddrs);
    let base = |p: &str| p.rsplit('/').next().unwrap_or(p).to_owned();
    let mut inlined_std = false;
    for (v, want) in vaddrs.iter().zip(&reference) {
        let got: Vec<Frame> = table
            .resolve(elf.file_offset(*v).unwrap())
            .iter()
            .map(|f| (f.name.to_string(), base(&f.file), f.line))
            .collect();
        assert_eq!(&got, want, "at {v:#x}");
        inlined_std |= got.len() > 1 && got.last().unwrap().0 == "r::leaf_work" && got[0].0.contains("core::");
        if let Some(outer) = got.last() {
            assert!(outer.0 == "r::leaf_work" || outer.0 == "r::middle", "demangled: {}", outer.0);
        }
    }
    assert!(inlined_std, "the range iterator shows inlined into r::leaf_work");
}

fn table_for(bin: &std::path::Path, search: &SearchPaths) -> profcol_processors::user_symbols::table::BinaryTable {
    let file = std::fs::File::open(bin).unwrap();
    let elf = profcol_elf::ElfFile::open(&file).unwrap();
    let (key, is_build_id) = match elf.gnu_build_id() {
        Some(id) => (profcol_elf::notes::hex(id), true),
        None => (profcol_elf::file_id(&file).unwrap(), false),
    };
    let want = Want { key: Arc::from(key), is_build_id, path: Arc::from(&*bin.to_string_lossy()) };
    profcol_processors::user_symbols::table::BinaryTable::load(&want, None, search).expect("table")
}

#[test]
fn a_stripped_go_binary_is_named_from_its_pclntab_as_go_tool_addr2line_names_it() {
    if !go_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = go_build(dir.path(), "chain", "-s -w");
    let elf = profcol_elf::ElfFile::open(&std::fs::File::open(&bin).unwrap()).unwrap();
    assert!(!elf.has_symtab() && !elf.has_debug_info(), "-s -w leaves neither .symtab nor DWARF");
    assert!(elf.gnu_build_id().is_none() && elf.go_build_id().is_some(), "keyed by file id");
    let go = elf.go_pclntab(64 << 20).expect(".gopclntab");
    let funcs: Vec<(u64, String)> = go.functions().map(|(a, n)| (a, n.to_owned())).collect();
    for f in ["main.main", "main.outerLoop", "main.middle", "main.(*acc).leafWork", "runtime.main"] {
        assert!(funcs.iter().any(|(_, n)| n == f), "{f} in the function table");
    }
    // Every third byte of the text, through the processor's table (by file
    // offset, keyed by file id): what `go tool addr2line` says.
    let table = table_for(&bin, &SearchPaths::default());
    let (first, last) = (funcs[0].0, funcs.last().unwrap().0 + 64);
    let vaddrs: Vec<u64> = (first..last).step_by(3).collect();
    let want = go_addr2line(&bin, &vaddrs);
    let mut diffs = Vec::new();
    for (v, want) in vaddrs.iter().zip(&want) {
        let got = table.resolve(elf.file_offset(*v).unwrap());
        let got =
            got.first().map_or((String::new(), String::new(), 0), |f| (f.name.to_string(), f.file.to_string(), f.line));
        let want = if want.0.is_empty() { (String::new(), String::new(), 0) } else { want.clone() };
        if got != want && diffs.len() < 10 {
            diffs.push(format!("{v:#x}: ours {got:?}, go tool addr2line {want:?}"));
        }
    }
    assert!(diffs.is_empty(), "of {} addresses, differences:\n{}", vaddrs.len(), diffs.join("\n"));
    // mix is inlined: its line shows inside leafWork, under leafWork's name.
    let leaf = funcs.iter().find(|(_, n)| n == "main.(*acc).leafWork").unwrap().0;
    let mix_line = GO_PROGRAM.lines().position(|l| l.contains("x *= 0x9E3779B97F4A7C15")).unwrap() as u32 + 1;
    assert!(
        (leaf..leaf + 256)
            .any(|v| go.lookup(v).is_some_and(|f| f.line == mix_line && f.function.ends_with("leafWork"))),
        "mix's line {mix_line} appears inside leafWork"
    );

    // Without section headers the table is found by its magic.
    let mut bytes = std::fs::read(&bin).unwrap();
    bytes[0x28..0x30].fill(0); // e_shoff
    bytes[0x3c..0x40].fill(0); // e_shnum, e_shstrndx
    let headless = profcol_elf::ElfFile::from_vec(bytes).unwrap();
    assert_eq!(headless.section_size(".gopclntab"), None);
    let found = headless.go_pclntab(64 << 20).expect("pclntab found by its magic");
    assert_eq!(found.len(), go.len());
    for v in vaddrs.iter().step_by(101) {
        assert_eq!(found.lookup(*v), go.lookup(*v), "at {v:#x}");
    }
    // A PIE build: the table sits in .data.rel.ro.gopclntab, its
    // textStart relocated at load. `go tool addr2line` (1.19) names
    // nothing in a PIE: every function `go tool nm` lists in the
    // unstripped build must be found at its entry in the stripped one.
    let pie = go_build_with(dir.path(), "chain_pie", &["-buildmode=pie", "-ldflags", "-s -w"]);
    let pie_full = go_build_with(dir.path(), "chain_pie_full", &["-buildmode=pie"]);
    let pie_go = profcol_elf::ElfFile::open(&std::fs::File::open(&pie).unwrap())
        .unwrap()
        .go_pclntab(64 << 20)
        .expect("a PIE's pclntab");
    let nm = std::process::Command::new("go").args(["tool", "nm"]).arg(&pie_full).output().expect("go tool nm");
    let mut checked = 0;
    for l in String::from_utf8(nm.stdout).unwrap().lines() {
        let Some((addr, name)) = l.trim_start().split_once(" T ") else { continue };
        let addr = u64::from_str_radix(addr, 16).unwrap();
        let name = name.trim_end_matches(".abi0"); // the ABI wrapper suffix is .symtab's only
        let got = pie_go.lookup(addr).map(|f| (f.function, f.entry)).unwrap_or_else(|| panic!("PIE: {name}"));
        assert_eq!(got.1, addr, "PIE: {name}");
        // pclntab shortens array types in generated names (`[...]`).
        if !name.contains('[') {
            assert_eq!(got.0, name, "PIE at {addr:#x}");
        }
        checked += 1;
    }
    assert!(checked > 1000, "{checked} functions of the PIE checked");

    // With go_pclntab off, a stripped Go binary has nothing to name it.
    let off = SearchPaths { go_pclntab: false, ..SearchPaths::default() };
    let file = std::fs::File::open(&bin).unwrap();
    let want = Want {
        key: Arc::from(profcol_elf::file_id(&file).unwrap()),
        is_build_id: false,
        path: Arc::from(&*bin.to_string_lossy()),
    };
    assert_eq!(
        profcol_processors::user_symbols::table::BinaryTable::load(&want, None, &off).err(),
        Some(profcol_processors::user_symbols::table::Missing::NoSymbols)
    );
}

#[test]
fn minidebuginfo_names_the_static_functions_of_a_fedora_style_binary() {
    if !tools_available() || !profcol_testkit::tools::tool_available("xz", &["--version"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = compile(dir.path(), "fedora", 5);
    let shipped = dir.path().join("fedora.shipped");
    fedora_minidebuginfo(&bin, &shipped);
    let elf = profcol_elf::ElfFile::open(&std::fs::File::open(&shipped).unwrap()).unwrap();
    assert!(!elf.has_symtab() && !elf.has_debug_info() && elf.section_size(".gnu_debugdata").is_some());
    let full = profcol_elf::ElfFile::open(&std::fs::File::open(&bin).unwrap()).unwrap();
    let search = SearchPaths { lines: false, ..SearchPaths::default() };
    let with = table_for(&shipped, &search);
    for f in ["outer_loop", "middle", "leaf_work", "tick", "main"] {
        let (start, size) = symbol(&full, f);
        for v in [start, start + size / 2, start + size - 1] {
            let off = full.file_offset(v).unwrap();
            let got: Vec<String> = with.resolve(off).iter().map(|x| x.name.to_string()).collect();
            assert_eq!(got, vec![f.to_owned()], "{f} at {v:#x}");
        }
    }
    // Without it, the executable's .dynsym names none of its functions.
    let want = Want {
        key: Arc::from(profcol_elf::notes::hex(elf.gnu_build_id().unwrap())),
        is_build_id: true,
        path: Arc::from(&*shipped.to_string_lossy()),
    };
    let off = SearchPaths { minidebuginfo: false, ..search };
    assert_eq!(
        profcol_processors::user_symbols::table::BinaryTable::load(&want, None, &off).err(),
        Some(profcol_processors::user_symbols::table::Missing::NoSymbols)
    );
}
