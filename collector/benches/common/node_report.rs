//! One report of the node agent's shape, for the benches that run its
//! stages (`node_pipeline` for time, `report_heap` for memory): `STACKS`
//! distinct stacks of 20 kernel and 15 user frames over `PROCESSES`
//! processes, counted in the kernel, and this machine's kernel symbols.

use profcol_api::Profiles;
use profcol_processors::kernel_symbols::{Store, StoreConfig};
use profcol_receivers::ebpf::process::service_name::ServiceNamer;
use profcol_receivers::ebpf::process::ProcessInfo;
use profcol_receivers::ebpf::stacks::aggregate::{Interval, SampleAttrs};
use std::sync::Arc;
use std::time::Duration;

#[path = "../../../receivers/benches/common/report.rs"]
mod report;
use report::{dash_and_libc, dash_sample, user_stack, Rng};

pub(crate) const STACKS: usize = 1000;
/// Processes the stacks are spread over.
pub(crate) const PROCESSES: usize = 10;

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

/// What a report is made of, made once: the stacks, their processes and
/// mappings, and the kernel symbol store.
pub(crate) struct Inputs {
    stacks: Vec<(Vec<u64>, Vec<u64>)>,
    infos: Vec<Arc<ProcessInfo>>,
    maps: Arc<profcol_receivers::ebpf::process::MappingSet>,
    namer: ServiceNamer,
    attrs: SampleAttrs,
    pub store: Store,
}

impl Inputs {
    pub(crate) fn new() -> Self {
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
        let attrs = SampleAttrs { thread_id: true, thread_name: true, cpu: false };
        let namer = ServiceNamer::new(Vec::new());
        Inputs { stacks, infos, maps, namer, attrs, store }
    }

    /// The receiver's batch of one report interval.
    pub(crate) fn batch(&self) -> Profiles {
        let mut iv = Interval::new(1, self.attrs);
        for (i, (k, u)) in self.stacks.iter().enumerate() {
            let info = &self.infos[i % PROCESSES];
            iv.add_counted(&dash_sample(info.pid, k, u), Some((info, &self.maps)), 1 + i as u64 % 3);
        }
        iv.build("host", 10_101_010, 5_000_000_000, &[], &self.namer, Default::default())
    }
}
