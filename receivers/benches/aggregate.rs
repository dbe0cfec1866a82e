//! The receiver's per-report work on the sampler thread: pairing counted
//! stacks with their records, aggregating them into an interval and
//! building the batch. One report of a node agent's shape: `STACKS`
//! distinct stacks (each a record and a count, as with `count_in_kernel`)
//! of 20 kernel and 15 user frames, leaf addresses all different and the
//! callers drawn from small pools, so locations repeat across stacks as
//! they do in a real report. Every report's stacks are new ones (new count
//! keys and slots: the most a report can cost), and those of earlier
//! reports leave the kernel's map when idle and free their slots, as they
//! would.
//!
//!     cargo bench -p profcol-receivers --bench aggregate
//!
//! Prints `REPORT us/report` and `PER-STACK ns`, the median of `ROUNDS`.

use profcol_receivers::ebpf::process::service_name::ServiceNamer;
use profcol_receivers::ebpf::process::ProcessInfo;
use profcol_receivers::ebpf::stacks::aggregate::{Interval, SampleAttrs};
use profcol_receivers::ebpf::stacks::counted::{CountStore, CountedStacks};
use std::sync::Arc;
use std::time::Instant;

#[path = "common/report.rs"]
mod report;
use report::{dash_and_libc, dash_sample, user_stack, Rng};

const STACKS: u64 = 1000;
const ROUNDS: usize = 200;

fn main() {
    let maps = dash_and_libc();
    let info = Arc::new(ProcessInfo { pid: 42, ..Default::default() });
    let process = Some((info, maps));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let stacks: Vec<(Vec<u64>, Vec<u64>)> = (0..STACKS)
        .map(|i| {
            let k = (0..20)
                .map(|d| 0xffff_ffff_8100_0000 + if d == 0 { i * 4 } else { (rng.next() % 64) * 64 + d * 0x1000 })
                .collect();
            (k, user_stack(&mut rng, i))
        })
        .collect();
    let attrs = SampleAttrs { thread_id: true, thread_name: true, cpu: false };
    let namer = ServiceNamer::new(Vec::new());
    let mut counted = CountedStacks::new(1 << 20);
    let mut store = Slots::default();
    let mut times = Vec::with_capacity(ROUNDS);
    let mut check = 0u64;
    let mut next = Interval::new(0, attrs);
    for round in 0..ROUNDS as u64 {
        let keys = round * STACKS + 1..=(round + 1) * STACKS;
        // The kernel's side of the report: each new stack takes a slot.
        let slots: Vec<u32> = keys.clone().map(|k| store.take(1 + k % 3)).collect();
        let t = Instant::now();
        let mut iv = std::mem::replace(&mut next, Interval::new(0, attrs));
        for ((key, slot), (k, u)) in keys.zip(slots).zip(&stacks) {
            counted.record(key, slot, &dash_sample(42, k, u), process.clone());
        }
        let settled = counted.settle(&mut iv, &mut store, |_, _| {});
        // The next report's interval is sized like this one, as the sampler's.
        next = Interval::sized_like(0, attrs, &iv);
        let batch = iv.build("host", 10_101_010, 5_000_000_000, &[], &namer, Default::default());
        check += settled.samples + batch.profiles().count() as u64;
        drop(batch);
        times.push(t.elapsed());
    }
    times.sort();
    let median = times[ROUNDS / 2];
    assert!(check > 0);
    println!("REPORT {:.1} us/report ({STACKS} stacks, median of {ROUNDS})", median.as_secs_f64() * 1e6);
    println!("PER-STACK {:.0} ns", median.as_secs_f64() * 1e9 / STACKS as f64);
}

/// The count slots in memory, as the BPF program hands them out.
#[derive(Default)]
struct Slots {
    counts: Vec<u64>,
    free: Vec<u32>,
}

impl Slots {
    fn take(&mut self, count: u64) -> u32 {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.counts.push(0);
            self.counts.len() as u32 - 1
        });
        self.counts[slot as usize] = count;
        slot
    }
}

impl CountStore for Slots {
    fn count(&self, slot: u32) -> u64 {
        self.counts.get(slot as usize).copied().unwrap_or(0)
    }
    fn handed_out(&self) -> u32 {
        self.counts.len() as u32
    }
    fn remove_key(&mut self, _: u64) -> std::io::Result<()> {
        Ok(())
    }
    fn free_slot(&mut self, slot: u32) -> std::io::Result<()> {
        self.counts[slot as usize] = 0;
        self.free.push(slot);
        Ok(())
    }
    fn keys(&mut self, _: &mut Vec<(u64, u32)>) -> std::io::Result<()> {
        Ok(())
    }
}
