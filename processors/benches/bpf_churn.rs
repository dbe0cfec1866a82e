//! Memory of the kernel symbol store under sustained BPF churn, against the
//! same store idle (the baseline, measured first in the same run).
//!
//! Real programs are loaded and freed at `CHURN_RATE` per second (default
//! 200) on CPU 0 for `CHURN_SECS` (default 600) while the store follows
//! PERF_RECORD_KSYMBOL records, as the processor does. Every minute it
//! prints the BPF history (live and retired spans, bytes), the generations
//! kept and the heap held (counting allocator), and at the end checks them
//! against the stated bound: retired spans ≤ min(rate × retain, 65,536),
//! generations unchanged by BPF records. Needs root.
//!
//!     sudo -E cargo bench -p profcol-processors --bench bpf_churn

#[path = "../tests/live/mod.rs"]
mod live;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use profcol_processors::kernel_symbols::bpf::history::MAX_RETIRED;
use profcol_processors::kernel_symbols::reload::{self, ReloadConfig};
use profcol_processors::kernel_symbols::{perf_ksymbol, Store, StoreConfig};

#[global_allocator]
static A: profcol_testkit::alloc::Counting = profcol_testkit::alloc::Counting;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Reading {
    live: usize,
    retired: usize,
    history_bytes: usize,
    generations: usize,
    heap: isize,
    backlog: usize,
    dropped: u64,
}

fn read(store: &Store) -> Reading {
    let h = store.bpf();
    Reading {
        live: h.live_len(),
        retired: h.retired_len(),
        history_bytes: h.heap_bytes(),
        generations: store.generations().len(),
        heap: profcol_testkit::alloc::live(),
        backlog: store.counters.bpf_backlog.load(Relaxed),
        dropped: store.counters.bpf_records_dropped.load(Relaxed),
    }
}

fn print(label: &str, r: &Reading, base: &Reading) {
    println!(
        "{label:>10}: spans live {:>4} retired {:>6} | history {:>9} B | generations {:>2} | heap {:>11} B (+{} B over idle) | backlog {} dropped {}",
        r.live,
        r.retired,
        r.history_bytes,
        r.generations,
        r.heap,
        r.heap - base.heap,
        r.backlog,
        r.dropped
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // cargo test --benches lists benches
    }
    if !live::require_root("bpf_churn bench") {
        return;
    }
    let secs = env("CHURN_SECS", 600);
    let rate = env("CHURN_RATE", 200);
    let retain = Duration::from_secs(60);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let store = Arc::new(Store::open(StoreConfig { retain, ..Default::default() }).expect("store opens"));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let rings = perf_ksymbol::spawn(perf_ksymbol::Sink::new(tx, &store)).expect("the PERF_RECORD_KSYMBOL listener");
        let task = reload::spawn(store.clone(), ReloadConfig::default(), rx);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let base = read(&store);
        print("idle", &base, &base);

        let stop = Arc::new(AtomicBool::new(false));
        let loads = Arc::new(AtomicU64::new(0));
        let churn = {
            let (stop, loads) = (stop.clone(), loads.clone());
            std::thread::spawn(move || {
                live::pin_to_cpu(0);
                let period = Duration::from_nanos(1_000_000_000 / rate);
                let mut held = std::collections::VecDeque::new();
                let mut next = Instant::now();
                let mut n = 0u32;
                while !stop.load(Relaxed) {
                    held.push_back(live::load_spin_prog("churn", 1 + n % 1000));
                    n += 1;
                    loads.fetch_add(1, Relaxed);
                    if held.len() > 3 {
                        held.pop_front();
                    }
                    next += period;
                    if let Some(d) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(d);
                    }
                }
            })
        };
        let started = Instant::now();
        let mut worst = read(&store);
        let mut minute = 1;
        while started.elapsed() < Duration::from_secs(secs) {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let r = read(&store);
            worst.live = worst.live.max(r.live);
            worst.retired = worst.retired.max(r.retired);
            worst.heap = worst.heap.max(r.heap);
            worst.history_bytes = worst.history_bytes.max(r.history_bytes);
            worst.generations = worst.generations.max(r.generations);
            worst.backlog = worst.backlog.max(r.backlog);
            worst.dropped = r.dropped;
            if started.elapsed() >= Duration::from_secs(60 * minute) || started.elapsed() >= Duration::from_secs(secs) {
                print(&format!("{:.0} s", started.elapsed().as_secs_f64()), &r, &base);
                minute += 1;
            }
        }
        stop.store(true, Relaxed);
        churn.join().unwrap();
        let total = loads.load(Relaxed);
        let achieved = total as f64 / started.elapsed().as_secs_f64();
        print("worst", &worst, &base);
        let bound = ((achieved * retain.as_secs_f64() * 1.1) as usize + 200).min(MAX_RETIRED);
        println!(
            "churn: {total} programs in {:.0} s ({achieved:.0}/s); bound: retired spans <= {bound} (rate x retain, +10%), generations <= {}",
            started.elapsed().as_secs_f64(),
            base.generations
        );
        assert!(worst.retired <= bound, "retired spans {} over the bound {bound}", worst.retired);
        assert!(worst.generations <= base.generations, "BPF churn added generations");
        for r in rings {
            r.abort();
        }
        task.abort();
    });
}
