//! Off-CPU time (`off_cpu:`): how long threads wait, in which state, and
//! the stacks they waited in.
//!
//! The kernel does the work (`profcol_off_cpu_switch` on `sched_switch`,
//! `profcol_off_cpu` on `sys_exit`, `profcol_off_cpu_waking` on
//! `sched_waking`, see the BPF source): the chance and the threshold are
//! applied there, before any stack walk, and a wait over the threshold
//! comes as one record with its time, after the record of what woke it.
//! Here: the section's settings, the wakeups held until their wait comes
//! ([`Wakeups`]), and the counters of what came.

use std::sync::Arc;
use std::time::Duration;

use profcol_api::config::schema::DurationText;
use profcol_api::telemetry::{ComponentTelemetry, Counter};
use profcol_ebpf::python::WalkEnd;
use profcol_ebpf::record::{OffCpuState, WakeupContext};
use profcol_ebpf::UnwindEnd;
use rustc_hash::FxHashMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ebpf::metrics as m;
use crate::ebpf::process::{MappingSet, ProcessInfo};
use crate::ebpf::stacks::aggregate::{SampleIn, SampleProfile};

/// `off_cpu:` section of the ebpf receiver. Absent: off.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OffCpuConfig {
    /// A wait at least this long is a sample (its value: the time off CPU
    /// in nanoseconds); a shorter one costs no stack walk.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "DurationText")]
    pub threshold: Duration,
    /// The share of switches off CPU followed (0 < p <= 1), decided before
    /// anything else. Values are not scaled: with 0.1, a profile holds
    /// about a tenth of the time waited.
    pub probability: f64,
}

// Validation refuses a probability that is NaN.
impl Eq for OffCpuConfig {}

impl Default for OffCpuConfig {
    fn default() -> Self {
        OffCpuConfig { threshold: Duration::from_millis(1), probability: 1.0 }
    }
}

impl OffCpuConfig {
    /// Problems with the settings, as (key, message).
    pub(crate) fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if !(self.probability > 0.0 && self.probability <= 1.0) {
            out.push((
                "off_cpu.probability".into(),
                format!("{} is out of range; use a share of switches in (0, 1], e.g. 0.1", self.probability),
            ));
        }
        if self.threshold > Duration::from_secs(3600) {
            out.push(("off_cpu.threshold".into(), format!("{:?} is too long; use at most 1h", self.threshold)));
        }
        out
    }

    /// The kernel's threshold: ns, at least 1 (0 would mean off).
    pub(crate) fn threshold_ns(&self) -> u64 {
        (self.threshold.as_nanos().min(u64::MAX as u128) as u64).max(1)
    }

    /// The kernel's chance: `probability` scaled to `u32::MAX` (a random
    /// u32 at most this follows the switch).
    pub(crate) fn probability_scaled(&self) -> u32 {
        (self.probability.clamp(0.0, 1.0) * f64::from(u32::MAX)).round() as u32
    }
}

/// Off-CPU samples and their time, by state, and what became of wakeups.
#[derive(Clone)]
pub(crate) struct OffCpuCounters {
    samples: [Counter; 3],
    seconds: [Counter; 3],
    linked: Counter,
    unlinked: Counter,
    missing: Counter,
}

impl OffCpuCounters {
    pub(crate) fn new(t: &ComponentTelemetry) -> Self {
        OffCpuCounters {
            samples: OffCpuState::ALL.map(|s| t.counter_by(&m::OFF_CPU_SAMPLES, s.name())),
            seconds: OffCpuState::ALL.map(|s| t.counter_by(&m::OFF_CPU_SECONDS, s.name())),
            linked: t.counter_by(&m::OFF_CPU_WAKEUPS, "linked"),
            unlinked: t.counter_by(&m::OFF_CPU_WAKEUPS, "unlinked"),
            missing: t.counter_by(&m::OFF_CPU_WAKEUPS, "missing"),
        }
    }

    /// One wait of `ns` in `state` (the seconds series counts ns).
    pub(crate) fn add(&self, state: OffCpuState, ns: u64) {
        self.samples[state as usize].inc();
        self.seconds[state as usize].add(ns);
    }
}

/// Wakeups held at most (each a few hundred bytes): more than two
/// reports' worth of waits over the threshold would be needed to fill it.
const MAX_HELD: usize = 16_384;

/// A wakeup record, held until the wait it ended comes (its record is
/// written when the woken thread runs again, after this one).
struct HeldWakeup {
    pid: u32,
    tid: u32,
    cpu: u32,
    comm: [u8; 16],
    unix_ns: u64,
    from: WakeupContext,
    kstack: Vec<u64>,
    ustack: Vec<u64>,
    unwind_end: UnwindEnd,
    interp_end: WalkEnd,
    process: Option<(Arc<ProcessInfo>, Arc<MappingSet>)>,
    /// The report it came in (held for two at most).
    report: u64,
}

/// What woke a wait, as the aggregator takes it: the waker's sample (the
/// wait's time is its value) and its process.
pub(crate) struct Waker<'a> {
    pub sample: SampleIn<'a>,
    pub process: Option<(&'a Arc<ProcessInfo>, &'a Arc<MappingSet>)>,
}

/// Wakeup records by id, until their waits come; their stack buffers are
/// reused, not allocated per wakeup.
#[derive(Default)]
pub(crate) struct Wakeups {
    held: FxHashMap<u64, HeldWakeup>,
    spare: Vec<(Vec<u64>, Vec<u64>)>,
    report: u64,
}

impl Wakeups {
    /// Holds wakeup `id` (sample `s`, its process) until its wait comes;
    /// dropped (unlinked) when `MAX_HELD` are held.
    pub(crate) fn hold(
        &mut self,
        id: u64,
        from: WakeupContext,
        s: &SampleIn<'_>,
        process: Option<(Arc<ProcessInfo>, Arc<MappingSet>)>,
        counters: &OffCpuCounters,
    ) {
        if self.held.len() >= MAX_HELD {
            counters.unlinked.inc();
            return;
        }
        let (mut kstack, mut ustack) = self.spare.pop().unwrap_or_default();
        kstack.clear();
        kstack.extend_from_slice(s.kstack);
        ustack.clear();
        ustack.extend_from_slice(s.ustack);
        let w = HeldWakeup {
            pid: s.pid,
            tid: s.tid,
            cpu: s.cpu,
            comm: s.comm,
            unix_ns: s.unix_ns,
            from,
            kstack,
            ustack,
            unwind_end: s.unwind_end,
            interp_end: s.interp_end,
            process,
            report: self.report,
        };
        if let Some(old) = self.held.insert(id, w) {
            // An id met twice (never expected): the older one is unlinked.
            counters.unlinked.inc();
            self.spare.push((old.kstack, old.ustack));
        }
    }

    /// Calls `f` with the waker of wait `id` (of `ns`), if held, and
    /// forgets it.
    pub(crate) fn take<R>(
        &mut self,
        id: u64,
        ns: u64,
        counters: &OffCpuCounters,
        f: impl FnOnce(Option<Waker<'_>>) -> R,
    ) -> R {
        let Some(w) = self.held.remove(&id) else {
            counters.missing.inc();
            return f(None);
        };
        counters.linked.inc();
        let r = f(Some(Waker {
            sample: SampleIn {
                profile: SampleProfile::Wakeup { ns, from: w.from },
                pid: w.pid,
                tid: w.tid,
                cpu: w.cpu,
                comm: w.comm,
                unix_ns: w.unix_ns,
                kstack: &w.kstack,
                ustack: &w.ustack,
                unwind_end: w.unwind_end,
                interp_end: w.interp_end,
            },
            process: w.process.as_ref().map(|(i, m)| (i, m)),
        }));
        self.spare.push((w.kstack, w.ustack));
        r
    }

    /// A report is cut: wakeups held since before the last one are
    /// unlinked (their waits are not coming).
    pub(crate) fn cut(&mut self, counters: &OffCpuCounters) {
        let report = self.report;
        let spare = &mut self.spare;
        self.held.retain(|_, w| {
            let keep = w.report + 1 >= report;
            if !keep {
                counters.unlinked.inc();
                spare.push((std::mem::take(&mut w.kstack), std::mem::take(&mut w.ustack)));
            }
            keep
        });
        spare.truncate(64);
        self.report += 1;
    }
}

/// The kernel text the wakeup program tells apart, from /proc/kallsyms:
/// each `[start, end)`, `(0, 0)` when not found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct WakeTexts {
    /// Interrupt entry (`__irqentry_text_*`): a wakeup from an interrupt
    /// is not the interrupted thread's.
    pub irq: (u64, u64),
    /// Softirq entry (`__softirqentry_text_*`), likewise.
    pub softirq: (u64, u64),
    /// `try_to_wake_up`, to the next symbol: a waker's stack starts there.
    pub wake: (u64, u64),
}

/// [`WakeTexts`] of the running kernel (a warning for what is missing:
/// wakeups by interrupts are then taken for the threads they interrupt).
pub(crate) fn wake_texts() -> WakeTexts {
    let texts = match std::fs::File::open("/proc/kallsyms") {
        Ok(f) => wake_texts_in(std::io::BufReader::new(f)),
        Err(e) => {
            tracing::warn!("ebpf receiver: off_cpu: /proc/kallsyms is unreadable ({e})");
            WakeTexts::default()
        }
    };
    if texts.irq == (0, 0) || texts.wake == (0, 0) {
        tracing::warn!(
            "ebpf receiver: off_cpu: /proc/kallsyms shows no interrupt entry text or no try_to_wake_up (hidden \
             addresses?); wakeups by interrupts are taken for the threads they interrupt"
        );
    }
    texts
}

fn wake_texts_in(r: impl std::io::BufRead) -> WakeTexts {
    const NAMES: [&str; 5] = [
        "__irqentry_text_start",
        "__irqentry_text_end",
        "__softirqentry_text_start",
        "__softirqentry_text_end",
        "try_to_wake_up",
    ];
    let mut at = [0u64; 5];
    // The symbol after try_to_wake_up: the least address above it (the
    // file is not sorted), so every line is read.
    let mut lines: Vec<u64> = Vec::new();
    for line in r.lines() {
        let Ok(line) = line else { break };
        let mut f = line.split_ascii_whitespace();
        let (Some(addr), Some(_), Some(name)) = (f.next(), f.next(), f.next()) else { continue };
        let Ok(addr) = u64::from_str_radix(addr, 16) else { continue };
        if f.next().is_none() {
            // Kernel text only (module symbols end in "[module]").
            lines.push(addr);
        }
        if let Some(i) = NAMES.iter().position(|&n| n == name) {
            if at[i] == 0 {
                at[i] = addr;
            }
        }
    }
    let range = |start: u64, end: u64| if start != 0 && end > start { (start, end) } else { (0, 0) };
    let wake_end = lines.iter().copied().filter(|&a| a > at[4]).min().unwrap_or(0);
    WakeTexts { irq: range(at[0], at[1]), softirq: range(at[2], at[3]), wake: range(at[4], wake_end) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wakeup is held until its wait takes it (once), its stacks copied;
    /// one never taken is unlinked after two cuts; a wait whose wakeup
    /// never came is counted missing.
    #[test]
    fn wakeups_are_held_until_their_wait_and_no_longer_than_two_reports() {
        use profcol_api::component::{ComponentId, Kind};
        let id: ComponentId = "ebpf".parse().unwrap();
        let c = OffCpuCounters::new(&ComponentTelemetry::detached(Kind::Receiver, &id));
        let sample = |kstack, ustack| SampleIn {
            profile: SampleProfile::Wakeup { ns: 0, from: WakeupContext::Task },
            pid: 4,
            tid: 5,
            cpu: 1,
            comm: *b"waker\0\0\0\0\0\0\0\0\0\0\0",
            unix_ns: 77,
            kstack,
            ustack,
            unwind_end: UnwindEnd::Outermost,
            interp_end: WalkEnd::None,
        };
        let mut w = Wakeups::default();
        w.hold(10, WakeupContext::Task, &sample(&[0xffff_ffff_8100_0000], &[0x401000, 0x402000]), None, &c);
        w.hold(11, WakeupContext::Interrupt, &sample(&[], &[]), None, &c);
        let got = w.take(10, 3_000_000, &c, |waker| {
            let s = &waker.expect("held").sample;
            (s.profile, s.pid, s.tid, s.unix_ns, s.kstack.to_vec(), s.ustack.to_vec())
        });
        assert_eq!(
            got,
            (
                SampleProfile::Wakeup { ns: 3_000_000, from: WakeupContext::Task },
                4,
                5,
                77,
                vec![0xffff_ffff_8100_0000],
                vec![0x401000, 0x402000]
            )
        );
        assert!(w.take(10, 1, &c, |waker| waker.is_none()), "taken once");
        assert_eq!((c.linked.get(), c.missing.get()), (1, 1));
        w.cut(&c);
        w.cut(&c);
        assert_eq!(c.unlinked.get(), 0, "held over two reports");
        w.cut(&c);
        assert_eq!(c.unlinked.get(), 1, "then unlinked");
        assert!(w.take(11, 1, &c, |waker| waker.is_none()));
        assert!(w.spare.len() <= 2, "buffers reused");
    }

    #[test]
    fn wake_texts_are_read_from_kallsyms() {
        let text = "ffffffff81000010 T __entry_text_start\n\
                    ffffffff813a8c70 T __pfx_wake_up_process\n\
                    ffffffff81000300 T __irqentry_text_start\n\
                    ffffffff81000f70 T __irqentry_text_end\n\
                    ffffffff813a8620 T try_to_wake_up\n\
                    ffffffff813a8610 T __pfx_try_to_wake_up\n\
                    ffffffffc0001000 t helper\t[fixture]\n\
                    ffffffff82202a10 T __softirqentry_text_start\n\
                    garbage\n\
                    ffffffff82202a2c T __softirqentry_text_end\n";
        let t = wake_texts_in(text.as_bytes());
        assert_eq!(t.irq, (0xffffffff81000300, 0xffffffff81000f70));
        assert_eq!(t.softirq, (0xffffffff82202a10, 0xffffffff82202a2c));
        assert_eq!(t.wake, (0xffffffff813a8620, 0xffffffff813a8c70), "to the next symbol, in any order");
        let hidden = "0000000000000000 T __irqentry_text_start\n0000000000000000 T __irqentry_text_end\n\
                      0000000000000000 T try_to_wake_up\n";
        assert_eq!(wake_texts_in(hidden.as_bytes()), WakeTexts::default());
        let half = "ffffffff81000300 T __irqentry_text_start\n";
        assert_eq!(wake_texts_in(half.as_bytes()).irq, (0, 0));
    }

    #[test]
    fn probability_and_threshold_reach_the_kernel_scaled() {
        let c = OffCpuConfig { threshold: Duration::from_micros(1500), probability: 1.0 };
        assert_eq!((c.threshold_ns(), c.probability_scaled()), (1_500_000, u32::MAX));
        let c = OffCpuConfig { threshold: Duration::ZERO, probability: 0.25 };
        assert_eq!(c.threshold_ns(), 1, "0 is off in the kernel: the least threshold is 1 ns");
        assert_eq!(c.probability_scaled(), (f64::from(u32::MAX) / 4.0).round() as u32);
        assert!(c.problems().is_empty());
        for p in [0.0, -1.0, 1.5, f64::NAN] {
            let c = OffCpuConfig { probability: p, ..Default::default() };
            assert_eq!(c.problems().len(), 1, "{p}");
        }
    }
}
