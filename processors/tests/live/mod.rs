//! Shared by the kernel_symbols tests that need root: the real ebpf
//! receiver feeding the real kernel_symbols processor, and test BPF
//! programs loaded with the bpf syscall.
#![allow(dead_code)]

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use profcol_api::component::{ComponentId, ConsumeError, Consumer, Kind, Next, Processor, Receiver};
use profcol_api::model::{any_value::Value, keys, pb, str_at};
use profcol_api::telemetry::Telemetry;
use profcol_api::{CreateSettings, Profiles};
use profcol_ebpf::sys::{self, bpf_prog_type};
use profcol_processors::kernel_symbols::{Config, KernelSymbols};
use profcol_receivers::ebpf::{EbpfConfig, EbpfReceiver};
use profcol_testkit::sink::Collector;

/// Whether the test can run; panics under CI when it cannot.
pub(crate) fn require_root(test: &str) -> bool {
    profcol_testkit::tools::require_root(test, "kallsyms addresses, bpf, perf events")
}

pub(crate) fn missing(what: &str, e: impl std::fmt::Display) -> ! {
    panic!("{what}: {e}; the test needs it (root with CAP_SYS_ADMIN, bpf JIT enabled)")
}

/// Runs each batch through the processor into the sink, as a pipeline does.
struct Symbolize {
    processor: Arc<KernelSymbols>,
    sink: Arc<Collector>,
}

#[async_trait::async_trait]
impl Consumer for Symbolize {
    async fn consume(&self, batch: Profiles) -> Result<(), ConsumeError> {
        let out = self.processor.process(batch).await.expect("kernel_symbols processes the batch");
        match out.forwarded() {
            Some(b) => self.sink.consume(b).await,
            None => Ok(()),
        }
    }
}

/// ebpf receiver → kernel_symbols → sink.
pub(crate) struct Pipeline {
    pub receiver: EbpfReceiver,
    pub processor: Arc<KernelSymbols>,
    pub sink: Arc<Collector>,
    pub registry: Telemetry,
}

impl Pipeline {
    /// Starts the processor (module uevents off: these tests load no modules), then the receiver.
    pub(crate) async fn start(receiver: EbpfConfig) -> Pipeline {
        let registry = Telemetry::new();
        let pid: ComponentId = "kernel_symbols".parse().unwrap();
        let processor = Arc::new(KernelSymbols::with_telemetry(
            Config { uevents: false, ..Default::default() },
            &registry.component(Kind::Processor, &pid),
        ));
        processor.start().await.expect("kernel_symbols starts");
        let id: ComponentId = "ebpf".parse().unwrap();
        let telemetry = registry.component(Kind::Receiver, &id);
        let rx = EbpfReceiver::new(
            CreateSettings { id, telemetry: telemetry.clone(), services: Default::default() },
            receiver,
        );
        let sink = Arc::new(Collector::default());
        let consumer = Arc::new(Symbolize { processor: processor.clone(), sink: sink.clone() });
        rx.start(Next::new(vec![consumer as Arc<dyn Consumer>], telemetry)).await.expect("ebpf receiver starts");
        Pipeline { receiver: rx, processor, sink, registry }
    }

    /// Stops both (the receiver flushes its last batch) and returns every batch.
    pub(crate) async fn stop(self) -> (Vec<Profiles>, String) {
        self.receiver.shutdown().await.expect("receiver shutdown");
        self.processor.shutdown().await.expect("processor shutdown");
        let batches = std::mem::take(&mut *self.sink.batches.lock().unwrap());
        (batches, self.registry.render())
    }
}

/// One kernel frame after symbolization.
#[derive(Debug, Clone)]
pub(crate) struct KFrame {
    pub address: u64,
    pub mapping: String,
    /// Function name and system name; `None` when unnamed.
    pub function: Option<(String, String)>,
}

/// One Sample of a process: its thread, times and kernel frames (leaf first).
#[derive(Debug, Clone)]
pub(crate) struct KSample {
    pub tid: i64,
    pub exe: String,
    pub timestamps: Vec<u64>,
    pub kernel: Vec<KFrame>,
}

/// Every sample of `pid` in `batches`, with its kernel frames.
pub(crate) fn kernel_samples(batches: &[Profiles], pid: u32) -> Vec<KSample> {
    let mut out = Vec::new();
    for b in batches {
        b.validate().expect("batch is valid");
        let d = b.dictionary().unwrap();
        let s = |i: i32| str_at(&d.string_table, i).to_owned();
        for rp in &b.0.resource_profiles {
            let res = &rp.resource.as_ref().unwrap().attributes;
            let attr = |k: &str| res.iter().find(|kv| kv.key == k).and_then(|kv| kv.value.clone()?.value);
            if attr(keys::PROCESS_PID) != Some(Value::IntValue(i64::from(pid))) {
                continue;
            }
            let exe = match attr(keys::PROCESS_EXECUTABLE_NAME) {
                Some(Value::StringValue(e)) => e,
                _ => String::new(),
            };
            for p in rp.scope_profiles.iter().flat_map(|sp| &sp.profiles) {
                for smp in &p.samples {
                    let tid = smp
                        .attribute_indices
                        .iter()
                        .map(|&i| &d.attribute_table[i as usize])
                        .find(|kv| s(kv.key_strindex) == keys::THREAD_ID)
                        .and_then(|kv| match kv.value.clone()?.value? {
                            Value::IntValue(t) => Some(t),
                            _ => None,
                        })
                        .unwrap_or(-1);
                    let kernel = d.stack_table[smp.stack_index as usize]
                        .location_indices
                        .iter()
                        .map(|&li| &d.location_table[li as usize])
                        .filter(|l| {
                            l.attribute_indices.iter().any(|&a| {
                                let kv = &d.attribute_table[a as usize];
                                s(kv.key_strindex) == keys::FRAME_TYPE
                                    && kv.value.clone().and_then(|v| v.value)
                                        == Some(Value::StringValue("kernel".into()))
                            })
                        })
                        .map(|l: &pb::Location| KFrame {
                            address: l.address,
                            mapping: s(d.mapping_table[l.mapping_index as usize].filename_strindex),
                            function: l.lines.first().map(|ln| {
                                let f = &d.function_table[ln.function_index as usize];
                                (s(f.name_strindex), s(f.system_name_strindex))
                            }),
                        })
                        .collect();
                    out.push(KSample { tid, exe: exe.clone(), timestamps: smp.timestamps_unix_nano.clone(), kernel });
                }
            }
        }
    }
    out
}

/// A socket filter that counts `loops` down and returns 0: enough work per
/// run to be sampled inside it under BPF_PROG_TEST_RUN. No BTF, so its
/// kernel name is `bpf_prog_<tag>_<name>`; `loops` changes the tag.
pub(crate) fn load_spin_prog(name: &str, loops: u32) -> OwnedFd {
    let insn = |op: u64, regs: u64, off: i16, imm: i32| {
        op | regs << 8 | u64::from(off as u16) << 16 | u64::from(imm as u32) << 32
    };
    let insns = [
        insn(0xb7, 0, 0, 0),            // r0 = 0
        insn(0xb7, 1, 0, loops as i32), // r1 = loops
        insn(0x17, 1, 0, 1),            // r1 -= 1
        insn(0x55, 1, -2, 0),           // if r1 != 0 goto -2
        insn(0x95, 0, 0, 0),            // exit
    ];
    sys::prog_load(&sys::ProgLoad {
        prog_type: bpf_prog_type::BPF_PROG_TYPE_SOCKET_FILTER,
        insns: &insns,
        name,
        btf_fd: None,
        func_info: &[],
        line_info: &[],
    })
    .unwrap_or_else(|e| missing("BPF_PROG_LOAD", e))
}

/// The kernel's name and JIT range of a loaded program: `bpf_prog_<tag>_<name>`.
pub(crate) fn prog_symbol(fd: &OwnedFd) -> (String, u64, u64) {
    let info = sys::prog_info(fd.as_fd()).unwrap_or_else(|e| missing("BPF_OBJ_GET_INFO_BY_FD", e));
    let funcs =
        profcol_processors::kernel_symbols::bpf::prog_funcs(info.id).unwrap_or_else(|e| missing("prog info", e));
    let f = &funcs[0];
    (f.name.to_string(), f.start, f.start + u64::from(f.len))
}

/// Runs the program over a minimal packet until `until`.
pub(crate) fn spin_until(fd: &OwnedFd, until: std::time::Instant) {
    let packet = [0u8; 64];
    while std::time::Instant::now() < until {
        sys::prog_test_run(fd.as_fd(), &packet, 200).unwrap_or_else(|e| missing("BPF_PROG_TEST_RUN", e));
    }
}

/// Pins the calling thread to one CPU.
pub(crate) fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0, "pin to CPU {cpu}");
    }
}

/// Unix ns on the clock samples and symbol records share.
pub(crate) fn now_unix_ns() -> u64 {
    profcol_ebpf::clock::KtimeToUnix::process().now_unix_ns()
}
