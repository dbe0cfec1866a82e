//! Shared helpers of the ebpf integration tests (root / CAP_BPF needed).
#![allow(dead_code)]

use profcol_api::component::{ComponentId, Consumer, Kind, Next, Receiver};
use profcol_api::model::{any_value, keys, pb};
use profcol_api::telemetry::Telemetry;
use profcol_api::{CreateSettings, Profiles};
use profcol_receivers::ebpf::bpf::privileges::Privileges;
use profcol_receivers::ebpf::{EbpfConfig, EbpfReceiver};
use profcol_testkit::sink::Collector;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;

/// Whether this process may load BPF and sample every CPU. Without the
/// privileges the test is skipped with a message, except under CI=true,
/// where it fails: CI runs as root and must really run these tests.
pub(crate) fn require_bpf(test: &str) -> bool {
    profcol_testkit::tools::require(test, Privileges::current().check())
}

pub(crate) struct Running {
    pub receiver: EbpfReceiver,
    pub sink: Arc<Collector>,
    pub registry: Telemetry,
}

pub(crate) async fn start(config: EbpfConfig) -> Running {
    let registry = Telemetry::new();
    let id: ComponentId = "ebpf".parse().unwrap();
    let telemetry = registry.component(Kind::Receiver, &id);
    let receiver =
        EbpfReceiver::new(CreateSettings { id, telemetry: telemetry.clone(), services: Default::default() }, config);
    let sink = Arc::new(Collector::default());
    let next = Next::new(vec![sink.clone() as Arc<dyn Consumer>], telemetry);
    receiver.start(next).await.expect("ebpf receiver starts");
    Running { receiver, sink, registry }
}

impl Running {
    pub(crate) async fn stop(self) -> (Vec<Profiles>, String) {
        self.receiver.shutdown().await.expect("shutdown");
        let batches = std::mem::take(&mut *self.sink.batches.lock().unwrap());
        (batches, self.registry.render())
    }
}

/// Compiles examples/workloads/<name>.c with frame pointers into `dir`.
pub(crate) fn build_workload(name: &str, dir: &Path) -> PathBuf {
    compile_workload(&format!("{name}.c"), name, dir, &["-O1", "-g", "-fno-omit-frame-pointer", "-fno-inline"])
}

/// Compiles examples/workloads/`file` into `dir`/`out` with `flags`: C
/// with `$CC` (else cc, with a GNU build id), Rust (`.rs`) with `$RUSTC`
/// (else rustc).
pub(crate) fn compile_workload(file: &str, out: &str, dir: &Path, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/workloads").join(file);
    let bin = dir.join(out);
    let (tool, var, extra) =
        if file.ends_with(".rs") { ("rustc", "RUSTC", &[][..]) } else { ("cc", "CC", &["-Wl,--build-id"][..]) };
    let status = Command::new(std::env::var(var).unwrap_or_else(|_| tool.into()))
        .args(flags)
        .args(extra)
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("run {tool}: {e}"));
    assert!(status.success(), "compiling {}", src.display());
    bin
}

/// Runs a workload (ready/go/cpu_ns protocol) of `seconds` of CPU under
/// a receiver with `config` that samples only its pid; returns the
/// batches, the receiver's metrics and the pid.
pub(crate) async fn profile_workload(bin: &Path, seconds: f64, config: EbpfConfig) -> (Vec<Profiles>, String, u32) {
    let mut w = Workload::spawn(bin, seconds);
    let pid = w.pid;
    let running = start(EbpfConfig { pids: vec![pid], ..config }).await;
    w.go();
    tokio::task::spawn_blocking(move || w.wait_cpu_ns()).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (batches, metrics) = running.stop().await;
    (batches, metrics, pid)
}

/// A workload process following the ready/go/cpu_ns protocol.
pub(crate) struct Workload {
    pub child: Child,
    pub pid: u32,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Workload {
    pub(crate) fn spawn(bin: &Path, seconds: f64) -> Self {
        let mut child = Command::new(bin)
            .arg(seconds.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn workload");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let pid = line.trim().strip_prefix("ready ").expect("ready line").parse().unwrap();
        Workload { child, pid, stdin, stdout }
    }

    pub(crate) fn go(&mut self) {
        writeln!(self.stdin, "go").unwrap();
    }

    /// Waits for exit; returns the CPU time it used while running, in ns.
    pub(crate) fn wait_cpu_ns(mut self) -> u64 {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert!(self.child.wait().unwrap().success());
        line.trim().strip_prefix("cpu_ns ").expect("cpu_ns line").parse().unwrap()
    }
}

/// One observed sample of a process, frames resolved from the batch.
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    pub address: u64,
    pub mapping: Option<pb::Mapping>,
    pub mapping_filename: String,
    pub build_id: Option<String>,
    pub frame_type: String,
}

#[derive(Debug, Clone)]
pub(crate) struct Observed {
    pub count: usize,
    pub timestamps: Vec<u64>,
    pub frames: Vec<Frame>,
    pub attrs: Vec<(String, any_value::Value)>,
    pub resource: Vec<(String, any_value::Value)>,
    /// The profile's sample type, e.g. ("samples", "count"), ("calls", "count").
    pub sample_type: (String, String),
    /// The profile's attributes (a probe's symbol and binary).
    pub profile_attrs: Vec<(String, any_value::Value)>,
    /// The profile's sampling period (ns for CPU samples).
    pub period: i64,
}

fn str_of(d: &pb::ProfilesDictionary, i: i32) -> String {
    d.string_table.get(i as usize).cloned().unwrap_or_default()
}

fn attr(d: &pb::ProfilesDictionary, i: i32) -> (String, any_value::Value) {
    let a = &d.attribute_table[i as usize];
    (str_of(d, a.key_strindex), a.value.clone().and_then(|v| v.value).unwrap())
}

/// Every sample of process `pid` across batches.
pub(crate) fn samples_of(batches: &[Profiles], pid: u32) -> Vec<Observed> {
    let mut out = Vec::new();
    for b in batches {
        b.validate().expect("batch is valid");
        let d = b.dictionary().unwrap();
        for rp in &b.0.resource_profiles {
            let res: Vec<(String, any_value::Value)> = rp
                .resource
                .as_ref()
                .unwrap()
                .attributes
                .iter()
                .map(|kv| (kv.key.clone(), kv.value.clone().and_then(|v| v.value).unwrap()))
                .collect();
            if !res.contains(&(keys::PROCESS_PID.into(), any_value::Value::IntValue(pid as i64))) {
                continue;
            }
            for sp in &rp.scope_profiles {
                for p in &sp.profiles {
                    let st = p.sample_type.unwrap_or_default();
                    let sample_type = (str_of(d, st.type_strindex), str_of(d, st.unit_strindex));
                    let profile_attrs: Vec<_> = p.attribute_indices.iter().map(|&i| attr(d, i)).collect();
                    for s in &p.samples {
                        let stack = &d.stack_table[s.stack_index as usize];
                        let frames = stack
                            .location_indices
                            .iter()
                            .map(|&li| {
                                let l = &d.location_table[li as usize];
                                let m =
                                    (l.mapping_index != 0).then(|| d.mapping_table[l.mapping_index as usize].clone());
                                let build_id = m.as_ref().and_then(|m| {
                                    m.attribute_indices
                                        .iter()
                                        .map(|&i| attr(d, i))
                                        .find(|(k, _)| k == keys::BUILD_ID_GNU)
                                        .map(|(_, v)| match v {
                                            any_value::Value::StringValue(s) => s,
                                            _ => String::new(),
                                        })
                                });
                                let frame_type = l
                                    .attribute_indices
                                    .iter()
                                    .map(|&i| attr(d, i))
                                    .find(|(k, _)| k == keys::FRAME_TYPE)
                                    .map(|(_, v)| match v {
                                        any_value::Value::StringValue(s) => s,
                                        _ => String::new(),
                                    })
                                    .unwrap_or_default();
                                Frame {
                                    address: l.address,
                                    mapping_filename: m
                                        .as_ref()
                                        .map(|m| str_of(d, m.filename_strindex))
                                        .unwrap_or_default(),
                                    mapping: m,
                                    build_id,
                                    frame_type,
                                }
                            })
                            .collect();
                        out.push(Observed {
                            // One by one: a time each; counted in the kernel: the count.
                            count: if s.timestamps_unix_nano.is_empty() {
                                s.values.iter().map(|&v| v.max(0) as usize).sum()
                            } else {
                                s.timestamps_unix_nano.len()
                            },
                            timestamps: s.timestamps_unix_nano.clone(),
                            frames,
                            attrs: s.attribute_indices.iter().map(|&i| attr(d, i)).collect(),
                            resource: res.clone(),
                            sample_type: sample_type.clone(),
                            profile_attrs: profile_attrs.clone(),
                            period: p.period,
                        });
                    }
                }
            }
        }
    }
    out
}

/// Symbolizes runtime addresses of one ELF file from its symbol table.
pub(crate) struct Symbolizer {
    segments: Vec<(u64, u64, u64)>, // (file offset, file size, vaddr)
    symbols: Vec<(u64, u64, String)>,
    pub build_id: Option<String>,
}

impl Symbolizer {
    pub(crate) fn new(path: &Path) -> Self {
        use object::{Object, ObjectSegment, ObjectSymbol};
        let data = std::fs::read(path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let segments = file
            .segments()
            .map(|s| {
                let (off, size) = s.file_range();
                (off, size, s.address())
            })
            .collect();
        // .symtab and .dynsym: a stripped library still names its exports.
        let mut symbols: Vec<(u64, u64, String)> = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
            .map(|s| (s.address(), s.size(), s.name().unwrap_or("").to_owned()))
            .collect();
        symbols.sort();
        let build_id = file.build_id().ok().flatten().map(|b| b.iter().map(|x| format!("{x:02x}")).collect());
        Symbolizer { segments, symbols, build_id }
    }

    /// Function holding the runtime `address` of a frame in `mapping`.
    pub(crate) fn function(&self, mapping: &pb::Mapping, address: u64) -> Option<&str> {
        self.function_at(self.vaddr(mapping, address)?)
    }

    /// The file's virtual address of the runtime `address` in `mapping`.
    pub(crate) fn vaddr(&self, mapping: &pb::Mapping, address: u64) -> Option<u64> {
        let file_off = address.checked_sub(mapping.memory_start)? + mapping.file_offset;
        let &(seg_off, _, vaddr) =
            self.segments.iter().find(|&&(off, size, _)| file_off >= off && file_off < off + size)?;
        Some(file_off - seg_off + vaddr)
    }

    /// The file's virtual address of file offset `off`.
    pub(crate) fn vaddr_of_offset(&self, off: u64) -> Option<u64> {
        let &(seg_off, _, vaddr) = self.segments.iter().find(|&&(o, size, _)| off >= o && off < o + size)?;
        Some(off - seg_off + vaddr)
    }

    /// Function holding the file's virtual address `v`.
    pub(crate) fn function_at(&self, v: u64) -> Option<&str> {
        self.symbols.iter().find(|(a, sz, _)| v >= *a && v < a + sz).map(|(_, _, n)| n.as_str())
    }
}

/// `_stext` and `_etext` from /proc/kallsyms.
pub(crate) fn kernel_text() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/kallsyms").unwrap();
    let find = |name: &str| {
        text.lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                let addr = f.next()?;
                let _ty = f.next()?;
                (f.next()? == name).then(|| u64::from_str_radix(addr, 16).ok()).flatten()
            })
            .unwrap_or_else(|| panic!("{name} not in /proc/kallsyms"))
    };
    (find("_stext"), find("_etext"))
}

/// The value of a series in Prometheus text, summed over its labels (0
/// when absent).
pub(crate) fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
