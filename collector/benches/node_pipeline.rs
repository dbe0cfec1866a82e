//! The node agent's work per report, stage by stage, on one report of its
//! shape: the receiver's batch (`STACKS` distinct stacks of 20 kernel and
//! 15 user frames, counted in the kernel), the kernel_symbols processor
//! on this machine's /proc/kallsyms, and the pprof exporter's conversion
//! and encoding (gzip and the file write excluded).
//!
//!     sudo cargo bench -p profcol --bench node_pipeline     # root: kallsyms addresses
//!
//! Prints one `STAGE name us/report` line per stage: the median and the
//! fastest of `ROUNDS` (the fastest is the steadier on a shared machine).

use profcol_exporters::group::GroupBy;
use profcol_exporters::pprof::convert::to_pprof;
use profcol_processors::kernel_symbols::symbolize::symbolize;
use profcol_processors::kernel_symbols::{Store, StoreConfig};
use profcol_receivers::ebpf::aggregate::{Interval, SampleAttrs};
use profcol_receivers::ebpf::process::ProcessInfo;
use profcol_receivers::ebpf::service_name::ServiceNamer;
use prost::Message;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../../receivers/benches/common/report.rs"]
mod report;
use report::{dash_and_libc, dash_sample, user_stack, Rng};

const STACKS: usize = 1000;
const ROUNDS: usize = 100;
/// Processes the stacks are spread over.
const PROCESSES: usize = 10;

/// Text symbols' addresses from /proc/kallsyms (zeros without root).
fn kernel_functions() -> Vec<u64> {
    let text = std::fs::read_to_string("/proc/kallsyms").expect("/proc/kallsyms");
    let funcs: Vec<u64> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let addr = u64::from_str_radix(f.next()?, 16).ok()?;
            let kind = f.next()?;
            let name = f.next()?;
            (matches!(kind, "t" | "T") && !name.starts_with("__pfx_") && !l.contains('[') && addr != 0).then_some(addr)
        })
        .collect();
    assert!(funcs.len() > 1000, "no kernel addresses: run as root");
    funcs
}

/// "median (fastest)" of the rounds, in µs.
fn median(mut v: Vec<Duration>) -> String {
    v.sort();
    format!("{:.0} ({:.0})", v[v.len() / 2].as_secs_f64() * 1e6, v[0].as_secs_f64() * 1e6)
}

fn main() {
    let funcs = kernel_functions();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Callers from a pool of 300 kernel functions, leaves all different.
    let pool: Vec<u64> = (0..300).map(|_| funcs[rng.next() as usize % funcs.len()] + 8).collect();
    let maps = dash_and_libc();
    let infos: Vec<Arc<ProcessInfo>> = (0..PROCESSES)
        .map(|p| Arc::new(ProcessInfo { pid: 100 + p as u32, exe_name: "dash".into(), ..Default::default() }))
        .collect();
    let stacks: Vec<(Vec<u64>, Vec<u64>)> = (0..STACKS)
        .map(|i| {
            let leaf = funcs[rng.next() as usize % funcs.len()] + 4 + (i as u64 % 16);
            let k = std::iter::once(leaf).chain((1..20).map(|_| pool[rng.next() as usize % pool.len()])).collect();
            (k, user_stack(&mut rng, i as u64))
        })
        .collect();
    let store = Store::open(StoreConfig {
        kallsyms: "/proc/kallsyms".into(),
        sysfs: "/sys".into(),
        bpf_syscall: false,
        retain: Duration::from_secs(60),
    })
    .expect("kernel symbol store");
    let gens = store.generations().load();
    let attrs = SampleAttrs { thread_id: true, thread_name: true, cpu: false };
    let namer = ServiceNamer::new(Vec::new());
    let (mut receiver, mut kernel_symbols, mut pprof) = (Vec::new(), Vec::new(), Vec::new());
    let mut bytes = 0;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let mut iv = Interval::new(1, attrs);
        for (i, (k, u)) in stacks.iter().enumerate() {
            let info = &infos[i % PROCESSES];
            iv.add_counted(&dash_sample(info.pid, k, u), Some((info, &maps)), 1 + i as u64 % 3);
        }
        let batch = iv.build("host", 10_101_010, 5_000_000_000, &[], &namer);
        receiver.push(t.elapsed());
        let t = Instant::now();
        let (batch, outcome) = symbolize(batch, &gens);
        kernel_symbols.push(t.elapsed());
        assert!(outcome.resolved > 0, "kernel frames named");
        let t = Instant::now();
        let reports = to_pprof(&batch, GroupBy::None);
        bytes = reports.iter().map(|g| g.profile.encode_to_vec().len()).sum::<usize>();
        pprof.push(t.elapsed());
        drop((batch, reports));
    }
    println!("STAGE receiver {} us/report ({STACKS} stacks)", median(receiver));
    println!("STAGE kernel_symbols {} us/report", median(kernel_symbols));
    println!("STAGE pprof {} us/report ({bytes} bytes encoded)", median(pprof));
}
