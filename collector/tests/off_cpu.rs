//! Off-CPU time (`off_cpu:`) held against what a program measures of its
//! own waits.
//!
//! A C program (built `-O2 -g`) runs threads with known waits, each timing
//! its own with CLOCK_MONOTONIC around the call that blocks:
//!
//! - C sleeps 20 ms per iteration in `c_sleeps` (nanosleep);
//! - A blocks reading a pipe in `a_reads`, which B writes in `b_writes`
//!   after sleeping 30 ms in `b_sleeps`;
//! - D blocks in `d_locks` on a mutex that E holds for 15 ms in
//!   `e_holds_lock` (sleeping while it holds it);
//! - S1 and S2 spin, both pinned to the last CPU: each is runnable but
//!   waiting about half of the time.
//!
//! profcol (ebpf receiver with `off_cpu: {threshold: 1ms}` and a pid
//! filter) writes pprof files, read with Go's pprof reader (`go tool pprof
//! -raw`). The off-CPU reports (`*-off_cpu.pb.gz`, `off_cpu/nanoseconds`):
//!
//! - C's, A's and D's off-CPU time in stacks holding their function is
//!   within 5% of what each measured (waits of at least 1 ms);
//! - S1's and S2's off-CPU time is 35–65% of their run time;
//! - wakers (the `*-wakeup.pb.gz` reports, linked by the `wakeup` label):
//!   at least 95% of A's time in `a_reads` was ended by B in `b_writes`,
//!   of D's in `d_locks` by E in `e_holds_lock` (its unlock: the kernel's
//!   `futex_wake` under it), and of C's
//!   in `c_sleeps` by an interrupt (a timer: `hrtimer_wakeup`, no thread,
//!   no user frame), and `/metrics` counts at least 95% of the sleeping
//!   waits' wakeups as linked;
//! - `/metrics` counts the sleeping time of all the sleepers within 5% of
//!   their measured sum, and at least 90% of the spinners' time as runnable.
//!
//! Needs root (eBPF), gcc and Go; skipped with a message without them,
//! except under CI=true. About 15 s.
//!
//!     sudo -E cargo test -p profcol --test off_cpu -- --nocapture

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use profcol_testkit::pprof_raw::read_raw;
use profcol_testkit::tools::{require, tool_available, KillOnDrop};

const PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile int running = 1;
static int pipe_fds[2];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* ns each thread waited in its blocking call (waits of 1 ms or more). */
static long long waited[8];
static long long spun_ns[2];
static int tids[8];

static long long now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void add(int who, long long t0) {
	long long d = now_ns() - t0;
	if (d >= 1000000)
		waited[who] += d;
}

static void nap(long ms) {
	struct timespec t = {0, ms * 1000000L};
	nanosleep(&t, 0);
}

__attribute__((noinline)) void c_sleeps(void) { long long t0 = now_ns(); nap(20); add(0, t0); }
__attribute__((noinline)) void a_reads(void) { char b; long long t0 = now_ns(); if (read(pipe_fds[0], &b, 1) != 1) running = 0; add(1, t0); }
__attribute__((noinline)) void b_sleeps(void) { long long t0 = now_ns(); nap(30); add(2, t0); }
__attribute__((noinline)) void b_writes(void) { if (write(pipe_fds[1], "x", 1) != 1) running = 0; }
__attribute__((noinline)) void d_locks(void) { long long t0 = now_ns(); pthread_mutex_lock(&lock); add(3, t0); pthread_mutex_unlock(&lock); }
__attribute__((noinline)) void e_holds_lock(void) { pthread_mutex_lock(&lock); long long t0 = now_ns(); nap(15); add(4, t0); pthread_mutex_unlock(&lock); /* no tail call: e_holds_lock stays on the unlock's stack */ __asm__ volatile("" ::: "memory"); }
__attribute__((noinline)) void e_rests(void) { long long t0 = now_ns(); nap(5); add(4, t0); }

static void *c_main(void *a) { tids[0] = gettid(); while (running) c_sleeps(); return a; }
static void *a_main(void *a) { tids[1] = gettid(); while (running) a_reads(); return a; }
static void *b_main(void *a) { tids[2] = gettid(); while (running) { b_sleeps(); b_writes(); } b_writes(); return a; }
static void *d_main(void *a) {
	tids[3] = gettid();
	while (running) {
		d_locks();
		long long t0 = now_ns();
		nap(1);
		add(5, t0);
	}
	return a;
}
static void *e_main(void *a) { tids[4] = gettid(); while (running) { e_holds_lock(); e_rests(); } return a; }

__attribute__((noinline)) void spin(int who) {
	long long t0 = now_ns();
	volatile unsigned long x = 0;
	while (running)
		for (int i = 0; i < 100000; i++) x += i;
	spun_ns[who] = now_ns() - t0;
}

static void *spinner(void *a) {
	int who = (int)(long)a;
	tids[5 + who] = gettid();
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(sysconf(_SC_NPROCESSORS_ONLN) - 1, &set);
	sched_setaffinity(0, sizeof(set), &set);
	spin(who);
	return a;
}

int main(int argc, char **argv) {
	int seconds = atoi(argv[1]);
	char go[8];
	if (pipe(pipe_fds)) return 1;
	printf("ready\n");
	fflush(stdout);
	/* The agent is attached when stdin says so. */
	if (!fgets(go, sizeof go, stdin)) return 1;
	pthread_t t[7];
	void *(*mains[5])(void *) = {c_main, a_main, b_main, d_main, e_main};
	for (int i = 0; i < 5; i++) pthread_create(&t[i], 0, mains[i], 0);
	for (long i = 0; i < 2; i++) pthread_create(&t[5 + i], 0, spinner, (void *)i);
	long long t0 = now_ns();
	sleep(seconds);
	add(7, t0);
	running = 0;
	for (int i = 0; i < 7; i++) {
		t0 = now_ns();
		pthread_join(t[i], 0);
		add(7, t0);
	}
	const char *names[5] = {"C", "A", "B", "D", "E"};
	for (int i = 0; i < 5; i++) printf("%s %d %lld\n", names[i], tids[i], waited[i]);
	for (int i = 0; i < 2; i++) printf("S%d %d %lld\n", i + 1, tids[5 + i], spun_ns[i]);
	printf("M %d %lld\n", getpid(), waited[7]);
	printf("N %d %lld\n", tids[3], waited[5]);
	return 0;
}
"#;

/// A loopback port free now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The `off_cpu` series of /metrics on `port`.
fn off_cpu_series(port: u16) -> BTreeMap<String, f64> {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).expect("/metrics");
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).unwrap();
    body.lines()
        .filter(|l| l.starts_with("profcol_receiver_ebpf_off_cpu_"))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// What woke a wait, told by its waker's sample (tid and frame names,
/// `[kernel only]` first when it has no user frame): "B b_writes" for
/// thread B with `b_writes` in its stack, "interrupt hrtimer_wakeup" for
/// a timer's interrupt, else what it is.
fn waker_summary(waker: Option<&(u32, Vec<String>)>, measured: &BTreeMap<String, (u32, f64)>) -> String {
    let Some((tid, names)) = waker else { return "no waker".into() };
    let has = |f: &str| names.iter().any(|n| n == f);
    if *tid == 0 {
        return if has("[kernel only]") && has("hrtimer_wakeup") {
            "interrupt hrtimer_wakeup".into()
        } else {
            format!("interrupt {:?}", names.iter().take(4).collect::<Vec<_>>())
        };
    }
    let who = measured.iter().find(|(_, (t, _))| t == tid).map_or("?", |(w, _)| w.as_str());
    if has("b_writes") {
        return format!("{who} b_writes");
    }
    // E's unlock path: the kernel's futex wake under e_holds_lock (libc's
    // unlock frames between them are local symbols, unnamed in a stripped libc).
    if has("e_holds_lock") && has("futex_wake") {
        return format!("{who} e_holds_lock unlock");
    }
    format!("{who} {:?}", names.iter().take(16).collect::<Vec<_>>())
}

fn pct(a: f64, b: f64) -> f64 {
    100.0 * (a - b) / b
}

#[test]
fn off_cpu_time_per_stack_matches_the_waits_a_program_measures() {
    let test = "off_cpu_time_per_stack_matches_the_waits_a_program_measures";
    if !require(test, profcol_receivers::ebpf::bpf::privileges::Privileges::current().check()) {
        return;
    }
    if !tool_available("go", &["version"]) || !tool_available("gcc", &["--version"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("waits.c");
    std::fs::write(&src, PROGRAM).unwrap();
    let bin = dir.path().join("waits");
    let out = Command::new("gcc").args(["-O2", "-g", "-pthread", "-o"]).arg(&bin).arg(&src).output().expect("gcc");
    assert!(out.status.success(), "gcc: {}", String::from_utf8_lossy(&out.stderr));

    let mut prog = KillOnDrop(
        Command::new(&bin).arg("5").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("start waits"),
    );
    let pid = prog.0.id();
    let mut stdout = BufReader::new(prog.0.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");

    let profiles = dir.path().join("profiles");
    let port = free_port();
    let config = dir.path().join("profcol.yaml");
    std::fs::write(
        &config,
        format!(
            "receivers:\n  ebpf:\n    sample_frequency: 19\n    report_interval: 1s\n    pids: [{pid}]\n\
             \x20   off_cpu:\n      threshold: 1ms\n\
             processors:\n  kernel_symbols:\n  user_symbols:\n\
             exporters:\n  pprof:\n    directory: {}\n\
             service:\n  telemetry:\n    metrics:\n      address: \"127.0.0.1:{port}\"\n\
             \x20 pipelines:\n    profiles:\n      receivers: [ebpf]\n      processors: [kernel_symbols, user_symbols]\n\
             \x20     exporters: [pprof]\n",
            profiles.display()
        ),
    )
    .unwrap();
    let log_path = dir.path().join("profcol.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let log_text = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let mut agent = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_profcol"))
            .arg("--config")
            .arg(&config)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start profcol"),
    );
    let t0 = Instant::now();
    while !log_text().contains("profcol started") {
        assert!(agent.0.try_wait().unwrap().is_none(), "profcol exited:\n{}", log_text());
        assert!(t0.elapsed() < Duration::from_secs(60), "not started in 60 s:\n{}", log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    prog.0.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let status = prog.0.wait().unwrap();
    assert!(status.success(), "waits: {status}");
    let mut measured: BTreeMap<String, (u32, f64)> = BTreeMap::new();
    for l in stdout.lines() {
        let l = l.unwrap();
        let f: Vec<&str> = l.split_whitespace().collect();
        measured.insert(f[0].to_owned(), (f[1].parse().unwrap(), f[2].parse().unwrap()));
    }
    // The last records go out at the next report.
    std::thread::sleep(Duration::from_millis(1500));
    let series = off_cpu_series(port);
    // SAFETY: kill has no memory effects; the pid is our child's.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    let status = agent.0.wait().unwrap();
    assert!(status.success(), "profcol at SIGTERM: {status:?}\n{}", log_text());

    // ns off CPU by (tid, whether the stack holds each function).
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&profiles).unwrap().filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.retain(|p| p.to_string_lossy().ends_with("-off_cpu.pb.gz"));
    assert!(!files.is_empty(), "no off-CPU report:\n{}", log_text());
    let mut by_tid: BTreeMap<u32, f64> = BTreeMap::new();
    let mut in_function: BTreeMap<(u32, &str), f64> = BTreeMap::new();
    // ns of those waits by what woke them: (tid, function) → waker → ns.
    let mut woken_by: BTreeMap<(u32, &str), BTreeMap<String, f64>> = BTreeMap::new();
    let functions = ["c_sleeps", "a_reads", "d_locks"];
    for f in &files {
        // The wakers of this report's waits: its `-wakeup` twin, by number.
        let twin = PathBuf::from(f.to_string_lossy().replace("-off_cpu.pb.gz", "-wakeup.pb.gz"));
        let wakers: BTreeMap<String, (u32, Vec<String>)> = if twin.exists() {
            read_raw(&twin)
                .into_iter()
                .filter_map(|(_, w)| {
                    let names = w.frames.iter().map(|fr| fr.name.clone()).collect();
                    let user = w.frames.iter().any(|fr| !fr.mapping.contains("kernel"));
                    let names = if user { names } else { [vec!["[kernel only]".to_owned()], names].concat() };
                    Some((w.label("wakeup")?.to_owned(), (w.tid, names)))
                })
                .collect()
        } else {
            BTreeMap::new()
        };
        for (p, s) in read_raw(f) {
            if p != pid {
                continue;
            }
            *by_tid.entry(s.tid).or_default() += s.count as f64;
            for func in functions {
                if s.frames.iter().any(|fr| fr.name == func) {
                    *in_function.entry((s.tid, func)).or_default() += s.count as f64;
                    let waker = s.label("wakeup").and_then(|n| wakers.get(n));
                    let who = waker_summary(waker, &measured);
                    *woken_by.entry((s.tid, func)).or_default().entry(who).or_default() += s.count as f64;
                }
            }
        }
    }
    let mut failures = Vec::new();
    eprintln!("{:<4} {:>8} {:>14} {:>14} {:>8}", "who", "tid", "measured ms", "profcol ms", "diff");
    for (who, func) in [("C", "c_sleeps"), ("A", "a_reads"), ("D", "d_locks")] {
        let (tid, want) = measured[who];
        let got = in_function.get(&(tid, func)).copied().unwrap_or(0.0);
        eprintln!("{who:<4} {tid:>8} {:>14.1} {:>14.1} {:>7.1}%", want / 1e6, got / 1e6, pct(got, want));
        if want < 1e9 || pct(got, want).abs() > 5.0 {
            failures.push(format!(
                "{who} ({func}): profcol {:.1} ms off CPU in stacks with {func}, the program measured {:.1} ms",
                got / 1e6,
                want / 1e6
            ));
        }
    }
    // Who woke them: B in b_writes, E in e_holds_lock, a timer.
    for (who, func, want) in [
        ("A", "a_reads", "B b_writes"),
        ("D", "d_locks", "E e_holds_lock unlock"),
        ("C", "c_sleeps", "interrupt hrtimer_wakeup"),
    ] {
        let (tid, _) = measured[who];
        let by = woken_by.get(&(tid, func)).cloned().unwrap_or_default();
        let total: f64 = by.values().sum();
        let share = 100.0 * by.get(want).copied().unwrap_or(0.0) / total.max(1.0);
        eprintln!("{who:<4} woken by {want}: {share:.1}% of its time in {func} ({by:?})");
        if share < 95.0 {
            failures.push(format!("{who} ({func}): {share:.1}% of its waits' time woken by {want}: {by:?}"));
        }
    }
    for who in ["S1", "S2"] {
        let (tid, ran) = measured[who];
        let off = by_tid.get(&tid).copied().unwrap_or(0.0);
        let share = 100.0 * off / ran;
        eprintln!("{who:<4} {tid:>8} {:>14.1} {:>14.1} {share:>7.1}% of its run time off CPU", ran / 1e6, off / 1e6);
        if !(35.0..=65.0).contains(&share) {
            failures.push(format!("{who}: off CPU {share:.1}% of its run time, about half expected"));
        }
    }
    let seconds = |state: &str| {
        series
            .get(&format!("profcol_receiver_ebpf_off_cpu_seconds_total{{receiver=\"ebpf\",state=\"{state}\"}}"))
            .copied()
            .unwrap_or(0.0)
    };
    let sleepers: f64 = ["C", "A", "B", "D", "E", "M", "N"].iter().map(|w| measured[*w].1).sum::<f64>() / 1e9;
    let spinners: f64 =
        ["S1", "S2"].iter().map(|w| by_tid.get(&measured[*w].0).copied().unwrap_or(0.0)).sum::<f64>() / 1e9;
    eprintln!(
        "/metrics: sleeping {:.3} s (the sleepers measured {sleepers:.3} s), runnable {:.3} s (the spinners' {spinners:.3} s)",
        seconds("sleeping"),
        seconds("runnable")
    );
    if pct(seconds("sleeping"), sleepers).abs() > 5.0 {
        failures.push(format!("sleeping: {:.3} s counted, {sleepers:.3} s measured", seconds("sleeping")));
    }
    // Every wait over the threshold from a sleep had its waker recorded and linked.
    let series_of = |name: &str| series.get(name).copied().unwrap_or(0.0);
    let sleeping_waits = series_of("profcol_receiver_ebpf_off_cpu_samples_total{receiver=\"ebpf\",state=\"sleeping\"}");
    let linked = series_of("profcol_receiver_ebpf_off_cpu_wakeups_total{outcome=\"linked\",receiver=\"ebpf\"}");
    eprintln!("/metrics: {linked} wakeups linked to {sleeping_waits} sleeping waits");
    if linked < 0.95 * sleeping_waits || sleeping_waits == 0.0 {
        failures.push(format!("{linked} wakeups linked to {sleeping_waits} sleeping waits"));
    }
    if seconds("runnable") < 0.9 * spinners || spinners == 0.0 {
        failures
            .push(format!("runnable: {:.3} s counted, the spinners alone waited {spinners:.3} s", seconds("runnable")));
    }
    assert!(failures.is_empty(), "{}\n\nprofcol's log:\n{}", failures.join("\n"), log_text());
}
