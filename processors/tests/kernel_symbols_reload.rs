//! The reload task under a synthetic uevent storm, fed through the same
//! channel the netlink listener feeds, and its backoff after failures.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use profcol_processors::kernel_symbols::generations::now_ns;
use profcol_processors::kernel_symbols::reload::{self, ReloadConfig, Trigger};
use profcol_processors::kernel_symbols::{Store, StoreConfig};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kernel_symbols")
}

fn store(kallsyms: PathBuf) -> Arc<Store> {
    Arc::new(
        Store::open(StoreConfig {
            kallsyms,
            sysfs: fixtures().join("sysfs"),
            bpf_syscall: false,
            ..Default::default()
        })
        .unwrap(),
    )
}

/// Sends `per_sec` module uevents per second for `secs` seconds.
async fn storm(tx: &tokio::sync::mpsc::UnboundedSender<Trigger>, per_sec: u64, secs: u64) {
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < Duration::from_secs(secs) {
        let due = (start.elapsed().as_secs_f64() * per_sec as f64) as u64;
        while sent < due {
            tx.send(Trigger::ModuleUevent { at_ns: now_ns() }).unwrap();
            sent += 1;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(sent >= per_sec * secs * 9 / 10, "sent {sent}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_of_uevents_is_rate_limited() {
    let s = store(fixtures().join("quirks.kallsyms"));
    let min_interval = Duration::from_secs(1);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = reload::spawn(
        s.clone(),
        ReloadConfig { debounce: Duration::from_millis(100), min_interval, max_backoff: Duration::from_secs(5) },
        rx,
    );
    let reads0 = s.counters.full_reads.load(Relaxed);
    storm(&tx, 1000, 10).await;
    // Let the last debounce window and a pending read run.
    tokio::time::sleep(min_interval + Duration::from_millis(300)).await;
    let reads = s.counters.full_reads.load(Relaxed) - reads0;
    let bound = (10.0 / min_interval.as_secs_f64()).ceil() as u64 + 1;
    assert!(reads <= bound, "{reads} full kallsyms reads for a 10 s storm, bound {bound}");
    assert!(reads >= 5, "reloads still happen during a storm: {reads}");
    // Metadata is refreshed per debounce window, not per event.
    let meta = s.counters.metadata_refreshes.load(Relaxed);
    assert!((20..=120).contains(&meta), "{meta} metadata refreshes");
    drop(tx);
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_reads_back_off() {
    let dir = tempfile::tempdir().unwrap();
    let k = dir.path().join("kallsyms");
    std::fs::copy(fixtures().join("quirks.kallsyms"), &k).unwrap();
    let s = store(k.clone());
    std::fs::remove_file(&k).unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let cfg = ReloadConfig {
        debounce: Duration::from_millis(10),
        min_interval: Duration::from_millis(100),
        max_backoff: Duration::from_millis(400),
    };
    let task = reload::spawn(s.clone(), cfg, rx);
    let reads0 = s.counters.full_reads.load(Relaxed);
    storm(&tx, 200, 3).await;
    let failed = s.counters.full_reads.load(Relaxed) - reads0;
    // First read at ~0.1 s, then retries after 0.1, 0.2, 0.4, 0.4, ... s:
    // about 8 in 3 s; without backoff it would be ~30.
    assert!((4..=11).contains(&failed), "{failed} reads");
    assert_eq!(s.counters.read_failures.load(Relaxed), failed);
    // The old generation keeps serving lookups.
    assert!(s.generations().current().snapshot.find("vfs_read").is_some());
    // Once the file is back, the next retry succeeds and backoff resets.
    std::fs::copy(fixtures().join("quirks.kallsyms"), &k).unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    let failures = s.counters.read_failures.load(Relaxed);
    assert!(s.counters.full_reads.load(Relaxed) - reads0 > failures, "a read succeeded after recovery");
    drop(tx);
    task.await.unwrap();
}
