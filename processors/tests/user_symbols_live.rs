//! user_symbols behind the real ebpf receiver (root): a C program compiled
//! here with `-g`, and two stripped variants whose debug files are found by
//! build id (a `.build-id` tree) and by `.gnu_debuglink`, are sampled; the
//! processes exit and their binaries are deleted before the batches reach
//! the processor, which names them through the files the receiver pinned.
//! A fourth copy runs from a tmpfs mounted in its own mount namespace
//! (`unshare -m`), at a path that does not exist on the host.
//! Every frame must agree with binutils' `addr2line -f -i -C`.
//! Beside it: a Go binary stripped with `-s -w` (named from its pclntab,
//! against `go tool addr2line`) and a C++ one (`g++ -g -O2`: templates,
//! namespaces, an inlined member; demangled as `addr2line -C` does).
//!
//!     sudo -E cargo test -p profcol-processors --test user_symbols_live

mod live;
mod user_symbols_common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use live::require_root;
use profcol_api::component::{ComponentId, Consumer, Kind, Next, Processor, Receiver};
use profcol_api::services::HostServices;
use profcol_api::telemetry::Telemetry;
use profcol_api::CreateSettings;
use profcol_processors::user_symbols::{Config, UserSymbols};
use profcol_receivers::ebpf::{EbpfConfig, EbpfReceiver};
use profcol_testkit::sink::Collector;
use user_symbols_common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exited_processes_are_named_as_addr2line_names_them() {
    if !require_root("exited_processes_are_named_as_addr2line_names_them")
        || !tools_available()
        || !profcol_testkit::tools::tool_available("unshare", &["--version"])
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (keep, run, debug_root) = (dir.path().join("keep"), dir.path().join("run"), dir.path().join("debug"));
    for d in [&keep, &run, &debug_root] {
        std::fs::create_dir_all(d).unwrap();
    }
    // full: -g, run as is. by_id: stripped, its debug file under
    // debug/.build-id. by_link: stripped with a .gnu_debuglink to a debug
    // file beside it.
    let full = compile(&keep, "full", 1);
    std::fs::copy(&full, run.join("full")).unwrap();
    let by_id = compile(&keep, "by_id", 2);
    debug_file(&by_id, &keep.join("by_id.debug"));
    install_by_build_id(&debug_root, &build_id(&by_id), &keep.join("by_id.debug"));
    stripped(&by_id, &run.join("by_id"));
    let by_link = compile(&keep, "by_link", 3);
    debug_file(&by_link, &run.join("by_link.debug"));
    stripped(&by_link, &run.join("by_link"));
    add_debuglink(&run.join("by_link"), &run.join("by_link.debug"));

    // ns: runs from a tmpfs mounted in a mount namespace of its own, at a
    // path that is an empty directory on the host.
    let ns = compile(&keep, "ns", 4);
    let ns_dir = dir.path().join("nsroot");
    std::fs::create_dir_all(&ns_dir).unwrap();

    let names = ["full", "by_id", "by_link", "ns"];
    let cmds = names
        .iter()
        .map(|&n| {
            let cmd = if n == "ns" {
                let script = format!(
                    "mount -t tmpfs tmpfs {d} && cp {src} {d}/ns && exec {d}/ns 1.5",
                    d = ns_dir.display(),
                    src = ns.display()
                );
                let mut c = Command::new("unshare");
                c.args(["-m", "--propagation", "private", "sh", "-c", &script]);
                c
            } else {
                workload(&run.join(n))
            };
            (n, cmd)
        })
        .collect();
    // Gone: the processes, and the binaries they ran (only the pins hold them).
    let delete: Vec<_> = ["full", "by_id", "by_link"].iter().map(|n| run.join(n)).collect();
    let delete: Vec<&std::path::Path> = delete.iter().map(|p| p.as_path()).collect();
    let cfg = Config { debug_dirs: vec![debug_root.clone()], max_wait: Duration::from_secs(20), ..Default::default() };
    let (out, metrics) = sample_exited(cmds, &delete, cfg).await;
    assert!(!ns_dir.join("ns").exists(), "the namespaced binary is not on the host");

    for (n, reference) in [("full", &full), ("by_id", &by_id), ("by_link", &by_link), ("ns", &ns)] {
        let frames = native_frames(&out, &[&format!("/run/{n}"), &format!("/nsroot/{n}")]);
        let (agree, total, diffs) = agreement(reference, &frames);
        let unnamed: u64 = frames.iter().filter(|f| f.frames.is_empty()).map(|f| f.weight).sum();
        eprintln!("{n}: {agree} of {total} frames agree with addr2line, {unnamed} unnamed");
        assert!(total >= 100, "{n}: only {total} frames sampled\n{metrics}");
        assert!(agree * 100 >= total * 99, "{n}: {agree} of {total} agree; first differences:\n{}", diffs.join("\n"));
        assert_eq!(unnamed, 0, "{n}: unnamed frames");
        let named = |f: &str| frames.iter().any(|x| x.frames.iter().any(|(name, _, _)| name == f));
        for f in FUNCTIONS {
            let seen: std::collections::BTreeSet<_> =
                frames.iter().flat_map(|x| x.frames.iter().map(|f| &f.0)).collect();
            assert!(named(f), "{n}: {f} never named; named: {seen:?}");
        }
        let inlined = frames
            .iter()
            .any(|x| x.frames.len() >= 2 && x.frames[0].0 == "mix" && x.frames.last().unwrap().0 == "leaf_work");
        assert!(inlined, "{n}: no frame shows mix inlined into leaf_work");
        assert!(frames.iter().all(|f| f.frames.iter().all(|(_, file, line)| file == &format!("{n}.c") || *line == 0)));
    }
    assert!(
        metrics.lines().any(|l| l.starts_with("profcol_processor_user_symbols_frames_total")
            && l.contains("outcome=\"named\"")
            && !l.ends_with(" 0")),
        "named frames counted:\n{metrics}"
    );
}

/// Runs `cmds` (each waits for a line on stdin, then burns CPU and exits)
/// under the ebpf receiver at 499 Hz; once all have exited, their
/// binaries are deleted (`delete`) and the batches go through a
/// `user_symbols` processor with `cfg`. Returns its output and metrics.
async fn sample_exited(
    mut cmds: Vec<(&str, Command)>,
    delete: &[&std::path::Path],
    cfg: Config,
) -> (Vec<profcol_api::Profiles>, String) {
    let mut children: Vec<_> = cmds
        .iter_mut()
        .map(|(n, c)| c.stdin(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("run {n}: {e}")))
        .collect();
    let pids: Vec<u32> = children.iter().map(|c| c.id()).collect();
    let services = HostServices::default();
    let registry = Telemetry::new();
    let id: ComponentId = "ebpf".parse().unwrap();
    let telemetry = registry.component(Kind::Receiver, &id);
    let receiver = EbpfReceiver::new(
        CreateSettings { id, telemetry: telemetry.clone(), services: services.clone() },
        EbpfConfig {
            sample_frequency: 499,
            report_interval: Duration::from_millis(300),
            pids: pids.clone(),
            ..Default::default()
        },
    );
    let sink = Arc::new(Collector::default());
    receiver.start(Next::new(vec![sink.clone() as Arc<dyn Consumer>], telemetry)).await.expect("ebpf receiver starts");
    for c in &mut children {
        writeln!(c.stdin.take().unwrap(), "go").unwrap();
    }
    for (c, (n, _)) in children.iter_mut().zip(&cmds) {
        let status = c.wait().unwrap();
        assert!(status.success(), "{n}: {status}");
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    receiver.shutdown().await.expect("receiver shutdown");
    for pid in &pids {
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "pid {pid} still exists");
    }
    for f in delete {
        std::fs::remove_file(f).unwrap();
    }
    assert!(services.file_pins.len() >= pids.len(), "the receiver pinned the binaries");
    let pid: ComponentId = "user_symbols".parse().unwrap();
    let processor =
        UserSymbols::with_telemetry(cfg, services.file_pins.clone(), &registry.component(Kind::Processor, &pid));
    processor.start().await.unwrap();
    let batches = std::mem::take(&mut *sink.batches.lock().unwrap());
    let mut out = Vec::new();
    for b in batches {
        out.push(processor.process(b).await.unwrap().forwarded().expect("forwarded"));
    }
    (out, registry.render())
}

fn workload(path: &std::path::Path) -> Command {
    let mut c = Command::new(path);
    c.arg("1.5");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripped_go_binary_is_named_as_go_tool_addr2line_names_it() {
    if !require_root("a_stripped_go_binary_is_named_as_go_tool_addr2line_names_it") || !go_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (keep, run) = (dir.path().join("keep"), dir.path().join("run"));
    for d in [&keep, &run] {
        std::fs::create_dir_all(d).unwrap();
    }
    let bin = go_build(&keep, "gochain", "-s -w");
    std::fs::copy(&bin, run.join("gochain")).unwrap();
    let cfg = Config { max_wait: Duration::from_secs(20), ..Default::default() };
    let (out, metrics) =
        sample_exited(vec![("gochain", workload(&run.join("gochain")))], &[&run.join("gochain")], cfg).await;

    let frames = native_frames(&out, &["/run/gochain"]);
    let elf = profcol_elf::ElfFile::open(&std::fs::File::open(&bin).unwrap()).unwrap();
    let vaddrs: Vec<u64> = frames.iter().map(|f| elf.vaddr_of_file_offset(f.lookup_offset).unwrap()).collect();
    let want = go_addr2line(&bin, &vaddrs);
    let base = |p: &str| p.rsplit('/').next().unwrap_or(p).to_owned();
    let (mut agree, mut total, mut diffs) = (0, 0, Vec::new());
    for ((f, (func, file, line)), v) in frames.iter().zip(&want).zip(&vaddrs) {
        total += f.weight;
        let want: Vec<Frame> = if func.is_empty() { vec![] } else { vec![(func.clone(), base(file), *line)] };
        if f.frames == want {
            agree += f.weight;
        } else if diffs.len() < 10 {
            diffs.push(format!("{v:#x}: ours {:?}, go tool addr2line {want:?}", f.frames));
        }
    }
    eprintln!("go: {agree} of {total} frames agree with go tool addr2line");
    assert!(total >= 100, "only {total} frames sampled\n{metrics}");
    assert!(agree * 100 >= total * 99, "{agree} of {total} agree; first differences:\n{}", diffs.join("\n"));
    let seen: std::collections::BTreeSet<_> =
        frames.iter().flat_map(|x| x.frames.iter().map(|f| f.0.clone())).collect();
    for f in ["main.main", "main.outerLoop", "main.middle", "main.(*acc).leafWork"] {
        assert!(seen.contains(f), "{f} never named; named: {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpp_binary_is_named_demangled_as_addr2line_names_it() {
    if !require_root("a_cpp_binary_is_named_demangled_as_addr2line_names_it")
        || !tools_available()
        || !profcol_testkit::tools::tool_available("g++", &["--version"])
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (keep, run) = (dir.path().join("keep"), dir.path().join("run"));
    for d in [&keep, &run] {
        std::fs::create_dir_all(d).unwrap();
    }
    let bin = compile_cpp(&keep, "cppchain");
    std::fs::copy(&bin, run.join("cppchain")).unwrap();
    let cfg = Config { max_wait: Duration::from_secs(20), ..Default::default() };
    let (out, metrics) =
        sample_exited(vec![("cppchain", workload(&run.join("cppchain")))], &[&run.join("cppchain")], cfg).await;
    let frames = native_frames(&out, &["/run/cppchain"]);
    let (agree, total, diffs) = agreement(&bin, &frames);
    eprintln!("c++: {agree} of {total} frames agree with addr2line");
    assert!(total >= 100, "only {total} frames sampled\n{metrics}");
    assert!(agree * 100 >= total * 99, "{agree} of {total} agree; first differences:\n{}", diffs.join("\n"));
    let seen: std::collections::BTreeSet<_> =
        frames.iter().flat_map(|x| x.frames.iter().map(|f| f.0.clone())).collect();
    for f in [
        "main",
        "work::outer_loop(double)",
        "work::Acc<unsigned long>::middle(unsigned long)",
        "unsigned long work::Acc<unsigned long>::leaf<work::Mixer>(unsigned long)",
        "work::Mixer::mix(unsigned long)",
    ] {
        assert!(seen.contains(f), "{f} never named; named: {seen:?}");
    }
    let inlined = frames.iter().any(|x| {
        x.frames.len() >= 2
            && x.frames[0].0.starts_with("work::Mixer::mix")
            && x.frames.last().unwrap().0.contains("::leaf<")
    });
    assert!(inlined, "no frame shows Mixer::mix inlined into Acc::leaf");
}
