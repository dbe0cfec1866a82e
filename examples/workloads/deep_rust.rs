// Test workload for user-stack unwinding, in Rust: spins in
// deep_rust_leaf <- deep_rust_mid <- deep_rust_top <- main. The test builds
// it as a release binary (opt-level 2, no frame pointers: rustc's default
// on x86-64) and expects whole stacks down to libc's start routine.
//
// Protocol (as deep.c): prints "ready <pid>", waits for a line on stdin,
// spins argv[1] seconds of CPU time (default 3), prints
// "cpu_ns <process CPU time in ns>" and exits.
use std::hint::black_box;
use std::io::BufRead;

/// CPU time this process has run, from /proc/self/schedstat.
fn cpu_ns() -> u64 {
    let s = std::fs::read_to_string("/proc/self/schedstat").unwrap_or_default();
    s.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0)
}

#[inline(never)]
fn deep_rust_leaf(iters: u64) -> u64 {
    let mut x = black_box(1u64);
    for _ in 0..iters {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    }
    x
}

#[inline(never)]
fn deep_rust_mid(deadline: u64) -> u64 {
    let mut scratch = [0u64; 32];
    let mut i = 0;
    while cpu_ns() < deadline {
        scratch[i % 32] = deep_rust_leaf(black_box(2_000_000));
        i += 1;
    }
    black_box(scratch.iter().sum())
}

#[inline(never)]
fn deep_rust_top(seconds: f64) -> u64 {
    let r = deep_rust_mid(cpu_ns() + (seconds * 1e9) as u64);
    black_box(r) + 1
}

fn main() {
    let seconds: f64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(3.0);
    println!("ready {}", std::process::id());
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).unwrap_or(0) == 0 {
        std::process::exit(1);
    }
    black_box(deep_rust_top(seconds));
    println!("cpu_ns {}", cpu_ns());
}
