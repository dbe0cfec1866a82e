//! Aggregation of samples over one report interval, and the batch it makes.
//!
//! Samples with the same identity (process, thread, thread name, cpu, kernel
//! stack, user stack, mapping generation, and which profile: CPU or one
//! probe) become one `Sample` whose timestamps list every occurrence (values
//! are all 1, same length). Samples counted in the kernel (see
//! `count_in_kernel`) come as a count without times: their `Sample` has one
//! value, the count, and no timestamps. Each process gets its CPU profile
//! (`samples/count`), one profile per probe that fired in it
//! (`calls/count`), named by profile attributes, and with `off_cpu:` its
//! off-CPU profile (`off_cpu/nanoseconds`: each wait's time its value,
//! how the thread left the CPU its `profcol.off_cpu.state` attribute). A
//! wait whose waker was recorded carries `profcol.off_cpu.wakeup`, a
//! number the waker's sample repeats in the `wakeup/nanoseconds` profile
//! of the waker's process (its value: the time of the waits it ended):
//! waits with one stack and one waker stack merge on both sides alike.
//! Bounded: [`Interval::is_full`] tells the sampler to cut the batch early.

use crate::ebpf::config::{SampleAttribute, UprobeSpec};
use crate::ebpf::interp::functions::{self, FunctionTable};
use crate::ebpf::jit::names::JitName;
use crate::ebpf::jit::JitMaps;
use crate::ebpf::process::service_name::ServiceNamer;
use crate::ebpf::process::{MappingSet, ProcessInfo};
use profcol_api::model::ProfileRef;
use profcol_api::model::{any_value, keys, pb, AnyValue, KeyValue, ProfileMeta, Resource};
use profcol_api::{model::AttrValue, Profiles, ProfilesBuilder};
use profcol_ebpf::python::WalkEnd;
use profcol_ebpf::record::{OffCpuState, WakeupContext};
use profcol_ebpf::UnwindEnd;
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// Distinct sample identities per batch before it is cut early.
pub const MAX_KEYS: usize = 50_000;
/// Samples per batch before it is cut early.
pub(crate) const MAX_SAMPLES: usize = 500_000;

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    pid: u32,
    generation: u32,
    /// [`CPU_PROFILE`], [`OFF_CPU_PROFILE`], or the index of the probe
    /// that fired.
    profile: u32,
    /// How the thread left the CPU (off-CPU samples).
    off_cpu_state: Option<OffCpuState>,
    /// The number of the wakeup sample of the thread's waker (off-CPU
    /// samples whose waker was recorded).
    link: Option<u32>,
    /// Where the wakeup came from (wakeup samples).
    wakeup_from: Option<WakeupContext>,
    tid: u32,
    cpu: u32,
    comm: [u8; 16],
    /// Index of the sample's frames in [`Interval::frames`].
    stack: u32,
    /// The `profcol.unwind.end` attribute, when the walk stopped early.
    unwind_end: Option<&'static str>,
    /// The `profcol.interpreter.end` attribute, when the interpreter walk
    /// stopped early.
    interp_end: Option<&'static str>,
}

/// A sample's kernel frames, then its user frames, then how many kernel
/// frames there are, in one allocation (a report makes one per distinct
/// stack), shared: a counted stack hands its record's frames to every
/// report it recurs in. Hashed and compared as that one slice, so an
/// interval finds a stack by a slice laid out the same way (see
/// [`frames_layout`]) without making one.
#[derive(Clone, Default)]
pub struct Frames {
    all: Arc<[u64]>,
}

impl Frames {
    pub fn new(kstack: &[u64], ustack: &[u64]) -> Self {
        let mut all = Vec::new();
        frames_layout(&mut all, kstack, ustack);
        Frames { all: all.into() }
    }
    fn kernel(&self) -> usize {
        // Never past the user frames, whatever the slice says.
        let n = self.all.len().saturating_sub(1);
        self.all.last().map_or(0, |&k| usize::try_from(k).unwrap_or(n).min(n))
    }
    pub fn kstack(&self) -> &[u64] {
        &self.all[..self.kernel()]
    }
    pub fn ustack(&self) -> &[u64] {
        &self.all[self.kernel()..self.all.len().saturating_sub(1)]
    }
}

impl PartialEq for Frames {
    fn eq(&self, other: &Self) -> bool {
        self.all[..] == other.all[..]
    }
}

impl Eq for Frames {}

impl std::hash::Hash for Frames {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // As the slice it borrows as.
        self.all[..].hash(state)
    }
}

impl std::borrow::Borrow<[u64]> for Frames {
    fn borrow(&self) -> &[u64] {
        &self.all
    }
}

/// Writes `kstack` and `ustack` into `out` as [`Frames`] lays them out.
fn frames_layout(out: &mut Vec<u64>, kstack: &[u64], ustack: &[u64]) {
    out.clear();
    out.reserve(kstack.len() + ustack.len() + 1);
    out.extend_from_slice(kstack);
    out.extend_from_slice(ustack);
    out.push(kstack.len() as u64);
}

/// Process facts and the mappings its frames resolve in (`None`: /proc
/// was unreadable).
type ProcessEntry = (Arc<ProcessInfo>, Option<Arc<MappingSet>>);

/// The process (pid, mapping generation) a batch's samples are at: its
/// resource index and the mappings its frames resolve in.
type Group = ((u32, u32), usize, Option<Arc<MappingSet>>);

/// How often one identity occurred in the interval.
#[derive(Default)]
struct Occurrences {
    /// Times of the samples that came one by one.
    times: Vec<u64>,
    /// Their values, where they are not 1 (off-CPU ns), in the same order.
    values: Vec<u64>,
    /// Samples counted in the kernel (no times).
    counted: u64,
    /// A wakeup sample's number, which the waits it ended carry.
    link: Option<u32>,
}

/// `Key::profile` of CPU samples.
const CPU_PROFILE: u32 = u32::MAX;
/// `Key::profile` of off-CPU samples.
const OFF_CPU_PROFILE: u32 = u32::MAX - 1;
/// `Key::profile` of wakeup samples.
const WAKEUP_PROFILE: u32 = u32::MAX - 2;

pub use keys::{
    OFF_CPU_STATE as OFF_CPU_STATE_ATTR, OFF_CPU_WAKEUP as OFF_CPU_WAKEUP_ATTR, WAKEUP_FROM as WAKEUP_FROM_ATTR,
};

/// Which profile a sample goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleProfile {
    /// An on-CPU sample.
    Cpu,
    /// A call of configured probe `i`.
    Probe(u32),
    /// A wait of `ns` off CPU, left in `state`.
    OffCpu { ns: u64, state: OffCpuState },
    /// What ended a wait of `ns`, coming `from` a thread or an interrupt.
    Wakeup { ns: u64, from: WakeupContext },
}

/// Profile attribute: the probed function of a `calls/count` profile.
pub(crate) const UPROBE_SYMBOL_ATTR: &str = "profcol.uprobe.symbol";
/// Profile attribute: the probe's `binary:` pattern, when set.
pub(crate) const UPROBE_BINARY_ATTR: &str = "profcol.uprobe.binary";

/// One sample as handed to the aggregator.
pub struct SampleIn<'a> {
    pub profile: SampleProfile,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub comm: [u8; 16],
    pub unix_ns: u64,
    pub kstack: &'a [u64],
    pub ustack: &'a [u64],
    /// How the user stack ended.
    pub unwind_end: UnwindEnd,
    /// How the interpreter walk ended (`WalkEnd::None`: none was made).
    pub interp_end: WalkEnd,
}

/// Sample attribute: why the user stack walk stopped before the outermost
/// frame (absent when it reached it, or when frame pointers alone made it).
pub const UNWIND_END_ATTR: &str = "profcol.unwind.end";
/// Sample attribute: why the interpreter walk stopped before the thread's
/// outermost frame (`depth_limit`, `read_error`).
pub const INTERPRETER_END_ATTR: &str = "profcol.interpreter.end";

/// The [`UNWIND_END_ATTR`] value of a stack end, if it gets one.
pub(crate) fn unwind_end_attr(end: UnwindEnd) -> Option<&'static str> {
    match end {
        UnwindEnd::Unknown | UnwindEnd::Outermost => None,
        e => Some(e.name()),
    }
}

/// Which sample attributes a batch carries (`sample_attributes:`); the
/// ones left out are not part of a sample's identity either, so samples
/// that differ only in them merge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleAttrs {
    pub thread_id: bool,
    pub thread_name: bool,
    pub cpu: bool,
}

impl SampleAttrs {
    pub(crate) fn from_config(list: &[SampleAttribute]) -> Self {
        SampleAttrs {
            thread_id: list.contains(&SampleAttribute::ThreadId),
            thread_name: list.contains(&SampleAttribute::ThreadName),
            cpu: list.contains(&SampleAttribute::CpuLogicalNumber),
        }
    }
}

/// Everything sampled during one report interval.
pub struct Interval {
    pub start_unix_ns: u64,
    attrs: SampleAttrs,
    samples: FxHashMap<Key, Occurrences>,
    /// The interval's distinct stacks, each made once: a sample of a stack
    /// met before costs a lookup, not a copy of its frames.
    stacks: FxHashMap<Frames, u32>,
    /// The same stacks by index (`Key::stack`).
    frames: Vec<Frames>,
    /// The stack being looked up, laid out as [`Frames`] (reused).
    scratch: Vec<u64>,
    /// (pid, generation) → process facts and the mappings frames resolve in.
    procs: FxHashMap<(u32, u32), ProcessEntry>,
    /// The first thread name of each process /proc could not tell about:
    /// what names it (whether or not samples keep `thread.name`).
    unreadable_comm: FxHashMap<u32, [u8; 16]>,
    /// Samples with a time (what bounds the interval's memory).
    count: usize,
    /// Samples counted in the kernel.
    counted: u64,
    /// Wakeup samples numbered so far (numbers start at 1: a pprof
    /// reader drops a numeric label of 0).
    wakeups: u32,
}

impl Interval {
    pub fn new(start_unix_ns: u64, attrs: SampleAttrs) -> Self {
        Interval {
            start_unix_ns,
            attrs,
            samples: FxHashMap::default(),
            stacks: FxHashMap::default(),
            frames: Vec::new(),
            scratch: Vec::new(),
            procs: FxHashMap::default(),
            unreadable_comm: FxHashMap::default(),
            count: 0,
            counted: 0,
            wakeups: 0,
        }
    }

    /// An interval sized for `like`'s samples and processes: a report's
    /// distinct stacks are much like the last one's, and a table grown
    /// step by step rehashes every entry at each step.
    pub fn sized_like(start_unix_ns: u64, attrs: SampleAttrs, like: &Interval) -> Self {
        let mut iv = Interval::new(start_unix_ns, attrs);
        iv.samples.reserve(like.samples.len());
        iv.stacks.reserve(like.stacks.len());
        iv.frames.reserve(like.frames.len());
        iv.procs.reserve(like.procs.len());
        iv
    }

    /// Samples in the interval, with a time or counted in the kernel.
    pub fn sample_count(&self) -> u64 {
        self.count as u64 + self.counted
    }

    pub fn is_full(&self) -> bool {
        self.samples.len() >= MAX_KEYS || self.count >= MAX_SAMPLES
    }

    /// Adds a sample. `process` is `None` when /proc was unreadable: the
    /// sample keeps its pid and raw user addresses without mappings.
    pub fn add(&mut self, s: &SampleIn<'_>, process: Option<(&Arc<ProcessInfo>, &Arc<MappingSet>)>) {
        self.add_linked(s, process, None);
    }

    /// Adds an off-CPU sample and the wakeup sample of its waker, both
    /// carrying the waker's number.
    pub(crate) fn add_woken(
        &mut self,
        s: &SampleIn<'_>,
        process: Option<(&Arc<ProcessInfo>, &Arc<MappingSet>)>,
        waker: &SampleIn<'_>,
        waker_process: Option<(&Arc<ProcessInfo>, &Arc<MappingSet>)>,
    ) {
        let stack = self.stack_of(waker.kstack, waker.ustack);
        let key = self.key(waker, stack, waker_process);
        let next = self.wakeups + 1;
        let occ = self.samples.entry(key).or_default();
        let link = *occ.link.get_or_insert(next);
        occ.times.push(waker.unix_ns);
        if let SampleProfile::Wakeup { ns, .. } = waker.profile {
            occ.values.push(ns);
        }
        self.count += 1;
        if link == next {
            self.wakeups += 1;
        }
        self.add_linked(s, process, Some(link));
    }

    fn add_linked(
        &mut self,
        s: &SampleIn<'_>,
        process: Option<(&Arc<ProcessInfo>, &Arc<MappingSet>)>,
        link: Option<u32>,
    ) {
        let stack = self.stack_of(s.kstack, s.ustack);
        let mut key = self.key(s, stack, process);
        key.link = link;
        let occ = self.samples.entry(key).or_default();
        occ.times.push(s.unix_ns);
        if let SampleProfile::OffCpu { ns, .. } | SampleProfile::Wakeup { ns, .. } = s.profile {
            occ.values.push(ns);
        }
        self.count += 1;
    }

    /// Adds `n` samples of `s`'s identity counted in the kernel (`s.unix_ns`
    /// is not used: they have no times of their own).
    pub fn add_counted(&mut self, s: &SampleIn<'_>, process: Option<(&Arc<ProcessInfo>, &Arc<MappingSet>)>, n: u64) {
        self.add_counted_frames(s, Frames::new(s.kstack, s.ustack), process, n);
    }

    /// [`Self::add_counted`] with the stacks already made (`s`'s are not
    /// read): a counted stack's record hands its frames over, not a copy.
    pub(crate) fn add_counted_frames(
        &mut self,
        s: &SampleIn<'_>,
        frames: Frames,
        process: Option<(&Arc<ProcessInfo>, &Arc<MappingSet>)>,
        n: u64,
    ) {
        if n == 0 {
            return;
        }
        let stack = match self.stacks.get(&frames.all[..]) {
            Some(&i) => i,
            None => self.new_stack(frames),
        };
        let key = self.key(s, stack, process);
        self.samples.entry(key).or_default().counted += n;
        self.counted = self.counted.saturating_add(n);
    }

    /// The index of the stack `kstack` then `ustack`, made on first use.
    fn stack_of(&mut self, kstack: &[u64], ustack: &[u64]) -> u32 {
        frames_layout(&mut self.scratch, kstack, ustack);
        match self.stacks.get(&self.scratch[..]) {
            Some(&i) => i,
            None => self.new_stack(Frames { all: Arc::from(&self.scratch[..]) }),
        }
    }

    fn new_stack(&mut self, frames: Frames) -> u32 {
        let i = self.frames.len() as u32;
        self.frames.push(frames.clone());
        self.stacks.insert(frames, i);
        i
    }

    /// The identity of `s`, its process remembered for the batch.
    fn key(&mut self, s: &SampleIn<'_>, stack: u32, process: Option<(&Arc<ProcessInfo>, &Arc<MappingSet>)>) -> Key {
        let generation = process.map_or(0, |(_, m)| m.generation);
        if process.is_none() {
            self.unreadable_comm.entry(s.pid).or_insert(s.comm);
        }
        self.procs.entry((s.pid, generation)).or_insert_with(|| match process {
            Some((info, maps)) => (info.clone(), Some(maps.clone())),
            None => (Arc::new(ProcessInfo { pid: s.pid, ..Default::default() }), None),
        });
        Key {
            pid: s.pid,
            generation,
            profile: match s.profile {
                SampleProfile::Cpu => CPU_PROFILE,
                SampleProfile::Probe(i) => i,
                SampleProfile::OffCpu { .. } => OFF_CPU_PROFILE,
                SampleProfile::Wakeup { .. } => WAKEUP_PROFILE,
            },
            off_cpu_state: match s.profile {
                SampleProfile::OffCpu { state, .. } => Some(state),
                _ => None,
            },
            link: None,
            wakeup_from: match s.profile {
                SampleProfile::Wakeup { from, .. } => Some(from),
                _ => None,
            },
            tid: if self.attrs.thread_id { s.tid } else { 0 },
            cpu: if self.attrs.cpu { s.cpu } else { 0 },
            comm: if self.attrs.thread_name { s.comm } else { [0; 16] },
            stack,
            unwind_end: unwind_end_attr(s.unwind_end),
            // A thread without a thread state (a native thread of a Python
            // process) is not a walk cut short: its stack is whole.
            interp_end: match s.interp_end {
                WalkEnd::NoThreadState => None,
                e => e.cut_reason(),
            },
        }
    }

    /// Builds the batch: one resource per process (per mapping generation),
    /// with its CPU profile and one profile per probe that fired in it
    /// (`probes` names them). Empty intervals make an empty batch. `namer`
    /// names the processes /proc could not tell about.
    pub fn build(
        self,
        host_name: &str,
        period_ns: i64,
        end_unix_ns: u64,
        probes: &[UprobeSpec],
        namer: &ServiceNamer,
        namers: FrameNamers<'_>,
    ) -> Profiles {
        let meta = ProfileMeta::cpu(period_ns, self.start_unix_ns, end_unix_ns.saturating_sub(self.start_unix_ns));
        let (mut samples, order) = sorted(self.samples, &self.frames);
        let mut batch = BatchBuilder::new(self.attrs, meta, Names { host_name, probes, namer }, samples.len());
        batch.locations.functions = namers.functions;
        batch.locations.jit = namers.jit;
        for &i in &order {
            let (key, occ) = &mut samples[i as usize];
            batch.add(key, &self.frames[key.stack as usize], occ, &self.procs, &self.unreadable_comm);
        }
        batch.b.build()
    }
}

/// The samples, and the order they go into the batch: by pid, generation,
/// then sample identity. Sorted by index (a sample with its key is ~100
/// bytes to move at every swap, an index 4), one vector for all processes.
fn sorted(samples: FxHashMap<Key, Occurrences>, frames: &[Frames]) -> (Vec<(Key, Occurrences)>, Vec<u32>) {
    let samples: Vec<(Key, Occurrences)> = samples.into_iter().collect();
    let mut order: Vec<u32> = (0..samples.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| {
        let (a, b) = (&samples[a as usize].0, &samples[b as usize].0);
        let (fa, fb) = (&frames[a.stack as usize], &frames[b.stack as usize]);
        (a.pid, a.generation, a.profile, a.tid, a.cpu, fa.kstack(), fa.ustack()).cmp(&(
            b.pid,
            b.generation,
            b.profile,
            b.tid,
            b.cpu,
            fb.kstack(),
            fb.ustack(),
        ))
    });
    (samples, order)
}

/// What names the frames no ELF file describes.
#[derive(Clone, Copy, Default)]
pub struct FrameNamers<'a> {
    /// What interpreter frames' stack words name.
    pub(crate) functions: Option<&'a FunctionTable>,
    /// The perf maps of processes with JIT code.
    pub(crate) jit: Option<&'a JitMaps>,
}

/// What names a batch's resources and probe profiles.
struct Names<'a> {
    host_name: &'a str,
    probes: &'a [UprobeSpec],
    namer: &'a ServiceNamer,
}

/// The batch [`Interval::build`] makes, sample by sorted sample: where the
/// samples are (process, profile, thread: each changes rarely, as they come
/// sorted) and what was interned once for the whole batch.
struct BatchBuilder<'a> {
    b: ProfilesBuilder,
    attrs: SampleAttrs,
    names: Names<'a>,
    meta: ProfileMeta<'a>,
    probe_meta: ProfileMeta<'a>,
    off_cpu_meta: ProfileMeta<'a>,
    wakeup_meta: ProfileMeta<'a>,
    locations: Locations<'a>,
    /// The process of the samples now: its resource and mappings.
    group: Option<Group>,
    /// Its profiles, made when their first sample comes.
    current: Option<(u32, ProfileRef)>,
    /// The thread of the last sample, with its attributes' indices.
    thread_attrs: Option<(u32, [u8; 16], [Option<i32>; 2])>,
}

/// The locations of a batch's frames, each made once.
struct Locations<'a> {
    kernel_mapping: i32,
    kernel_attr: i32,
    native_attr: i32,
    /// What interpreter frames' stack words name.
    functions: Option<&'a FunctionTable>,
    /// JIT code's names; the process of the stacks now, and the location
    /// of each of its JIT names met.
    jit: Option<&'a JitMaps>,
    pid: u32,
    jit_locs: FxHashMap<u32, i32>,
    /// Location of each interpreter frame's stack word (one for all
    /// processes: the word names a function and line), and the
    /// `profile.frame.type` attribute of each frame type.
    interp: FxHashMap<u64, i32>,
    frame_type_attrs: Vec<(&'static str, i32)>,
    /// The stack being made (reused).
    stack: Vec<i32>,
    /// Location of each kernel address (one mapping for all processes)
    /// and, per process, of each user address: most frames of a report
    /// are callers many stacks share, found here without building and
    /// hashing a Location. Each is new to the batch when first met, so it
    /// is pushed, not interned.
    kernel: FxHashMap<u64, i32>,
    user: FxHashMap<u64, i32>,
    /// Mapping index per mapping of the process, interned lazily.
    mapping_idx: FxHashMap<usize, i32>,
}

impl<'a> BatchBuilder<'a> {
    fn new(attrs: SampleAttrs, meta: ProfileMeta<'a>, names: Names<'a>, samples: usize) -> Self {
        let mut b = ProfilesBuilder::new();
        let kernel_mapping = {
            let filename_strindex = b.string(keys::KERNEL_MAPPING);
            b.mapping(pb::Mapping { filename_strindex, ..Default::default() })
        };
        let kernel_attr = b.attribute(keys::FRAME_TYPE, AttrValue::Str("kernel"));
        let native_attr = b.attribute(keys::FRAME_TYPE, AttrValue::Str("native"));
        let probe_meta =
            ProfileMeta { sample_type: ("calls", "count"), period_type: ("calls", "count"), period: 1, ..meta };
        let off_cpu_meta = ProfileMeta {
            sample_type: ("off_cpu", "nanoseconds"),
            period_type: ("off_cpu", "nanoseconds"),
            period: 1,
            ..meta
        };
        let wakeup_meta = ProfileMeta {
            sample_type: ("wakeup", "nanoseconds"),
            period_type: ("wakeup", "nanoseconds"),
            period: 1,
            ..meta
        };
        // A stack per sample at most; about as many distinct frames.
        b.reserve(samples, samples);
        BatchBuilder {
            b,
            attrs,
            names,
            meta,
            probe_meta,
            off_cpu_meta,
            wakeup_meta,
            locations: Locations {
                kernel_mapping,
                kernel_attr,
                native_attr,
                functions: None,
                jit: None,
                pid: 0,
                jit_locs: FxHashMap::default(),
                interp: FxHashMap::default(),
                frame_type_attrs: Vec::new(),
                stack: Vec::new(),
                kernel: FxHashMap::default(),
                user: FxHashMap::default(),
                mapping_idx: FxHashMap::default(),
            },
            group: None,
            current: None,
            thread_attrs: None,
        }
    }

    /// Adds one sample identity and its occurrences (their times taken).
    fn add(
        &mut self,
        k: &Key,
        frames: &Frames,
        occ: &mut Occurrences,
        procs: &FxHashMap<(u32, u32), ProcessEntry>,
        unreadable_comm: &FxHashMap<u32, [u8; 16]>,
    ) {
        let resource = self.enter_process((k.pid, k.generation), procs, unreadable_comm);
        let prof = self.profile(resource, k.profile);
        let maps = self.group.as_ref().and_then(|g| g.2.as_deref());
        let stack_index = self.locations.stack(&mut self.b, frames, maps);
        let attribute_indices = self.sample_attributes(k, occ.link.or(k.link));
        self.push_samples(prof, stack_index, attribute_indices, occ);
    }

    /// The resource of process `gk`, made when its first sample comes.
    fn enter_process(
        &mut self,
        gk: (u32, u32),
        procs: &FxHashMap<(u32, u32), ProcessEntry>,
        unreadable_comm: &FxHashMap<u32, [u8; 16]>,
    ) -> usize {
        if let Some((g, r, _)) = &self.group {
            if *g == gk {
                return *r;
            }
        }
        let (info, maps) = match procs.get(&gk) {
            Some((i, m)) => (i.clone(), m.clone()),
            None => (Arc::new(ProcessInfo::default()), None),
        };
        let service = match info.service_name.as_str() {
            "" => {
                let comm = unreadable_comm.get(&gk.0).map(comm_str).unwrap_or_default();
                self.names.namer.name_without_process(&comm)
            }
            name => name.to_owned(),
        };
        let r = self.b.resource(resource(self.names.host_name, &info, &service));
        self.b.set_scope(r, profcol_api::model::profcol_scope());
        self.current = None;
        self.thread_attrs = None;
        self.locations.enter_process(gk.0);
        self.group = Some((gk, r, maps));
        r
    }

    /// The profile `profile` ([`CPU_PROFILE`] or a probe's index) of the
    /// process at `resource`, made when its first sample comes.
    fn profile(&mut self, resource: usize, profile: u32) -> ProfileRef {
        if let Some((p, r)) = self.current {
            if p == profile {
                return r;
            }
        }
        let r = if profile == CPU_PROFILE {
            self.b.profile(resource, &self.meta)
        } else if profile == OFF_CPU_PROFILE {
            self.b.profile(resource, &self.off_cpu_meta)
        } else if profile == WAKEUP_PROFILE {
            self.b.profile(resource, &self.wakeup_meta)
        } else {
            let b = &mut self.b;
            let pr = b.profile(resource, &self.probe_meta);
            let spec = self.names.probes.get(profile as usize);
            let mut attrs =
                vec![b.attribute(UPROBE_SYMBOL_ATTR, AttrValue::Str(spec.map_or("", |s| s.symbol.as_str())))];
            if let Some(bin) = spec.and_then(|s| s.binary.as_deref()) {
                attrs.push(b.attribute(UPROBE_BINARY_ATTR, AttrValue::Str(bin)));
            }
            b.profile_mut(pr).attribute_indices = attrs;
            pr
        };
        self.current = Some((profile, r));
        r
    }

    /// The attributes of sample `k`: its thread's (interned once per
    /// thread: samples come sorted by thread), cpu, unwind end, off-CPU
    /// state and `link`, the number tying a wait to its waker.
    fn sample_attributes(&mut self, k: &Key, link: Option<u32>) -> Vec<i32> {
        let mut attribute_indices = Vec::with_capacity(4);
        let thread = match self.thread_attrs {
            // An interrupt is no thread.
            _ if k.wakeup_from == Some(WakeupContext::Interrupt) => [None, None],
            Some((tid, comm, attrs)) if tid == k.tid && comm == k.comm => attrs,
            _ => {
                let b = &mut self.b;
                let attrs = [
                    self.attrs.thread_id.then(|| b.attribute(keys::THREAD_ID, AttrValue::Int(k.tid as i64))),
                    self.attrs.thread_name.then(|| b.attribute(keys::THREAD_NAME, AttrValue::Str(&comm_str(&k.comm)))),
                ];
                self.thread_attrs = Some((k.tid, k.comm, attrs));
                attrs
            }
        };
        attribute_indices.extend(thread.into_iter().flatten());
        if self.attrs.cpu {
            attribute_indices.push(self.b.attribute(keys::CPU_LOGICAL_NUMBER, AttrValue::Int(k.cpu as i64)));
        }
        if let Some(end) = k.unwind_end {
            attribute_indices.push(self.b.attribute(UNWIND_END_ATTR, AttrValue::Str(end)));
        }
        if let Some(end) = k.interp_end {
            attribute_indices.push(self.b.attribute(INTERPRETER_END_ATTR, AttrValue::Str(end)));
        }
        if let Some(state) = k.off_cpu_state {
            attribute_indices.push(self.b.attribute(OFF_CPU_STATE_ATTR, AttrValue::Str(state.name())));
        }
        if let Some(from) = k.wakeup_from {
            let from = match from {
                WakeupContext::Task => "thread",
                WakeupContext::Interrupt => "interrupt",
            };
            attribute_indices.push(self.b.attribute(WAKEUP_FROM_ATTR, AttrValue::Str(from)));
        }
        if let Some(link) = link {
            attribute_indices.push(self.b.attribute(OFF_CPU_WAKEUP_ATTR, AttrValue::Int(i64::from(link))));
        }
        attribute_indices
    }

    /// The samples of one identity: its count (no times) and its timed
    /// occurrences, each a `Sample` when there are any.
    fn push_samples(
        &mut self,
        prof: ProfileRef,
        stack_index: i32,
        mut attribute_indices: Vec<i32>,
        occ: &mut Occurrences,
    ) {
        let (mut ts, counted) = (std::mem::take(&mut occ.times), occ.counted);
        if counted > 0 {
            let values = vec![i64::try_from(counted).unwrap_or(i64::MAX)];
            // A copy only when a sample with times follows.
            let attribute_indices =
                if ts.is_empty() { std::mem::take(&mut attribute_indices) } else { attribute_indices.clone() };
            let s = pb::Sample { stack_index, attribute_indices, values, ..Default::default() };
            self.b.sample(prof, s);
        }
        if !ts.is_empty() {
            let values = if occ.values.len() == ts.len() {
                // Sorted by time with their values.
                let mut pairs: Vec<(u64, u64)> = ts.iter().copied().zip(occ.values.drain(..)).collect();
                pairs.sort_unstable();
                ts.clear();
                ts.extend(pairs.iter().map(|p| p.0));
                pairs.iter().map(|p| i64::try_from(p.1).unwrap_or(i64::MAX)).collect()
            } else {
                ts.sort_unstable();
                vec![1; ts.len()]
            };
            self.b.sample(
                prof,
                pb::Sample { stack_index, attribute_indices, link_index: 0, values, timestamps_unix_nano: ts },
            );
        }
    }
}

impl Locations<'_> {
    /// A new process: its user addresses and mappings are its own.
    fn enter_process(&mut self, pid: u32) {
        self.pid = pid;
        self.jit_locs.clear();
        self.mapping_idx.clear();
        // Location of each user address of this process (its mappings say
        // where an address lies): a frame met again, in this stack or the
        // next, is one lookup of a u64.
        self.user.clear();
    }

    /// The stack of `frames` (`maps`: its process's mappings).
    fn stack(&mut self, b: &mut ProfilesBuilder, frames: &Frames, maps: Option<&MappingSet>) -> i32 {
        self.stack.clear();
        for &addr in frames.kstack() {
            let l = *self.kernel.entry(addr).or_insert_with(|| {
                b.push_location(pb::Location {
                    mapping_index: self.kernel_mapping,
                    address: addr,
                    lines: Vec::new(),
                    attribute_indices: vec![self.kernel_attr],
                })
            });
            self.stack.push(l);
        }
        for (i, &addr) in frames.ustack().iter().enumerate() {
            let l = match self.user.get(&addr) {
                Some(&l) => l,
                None => match functions::decode(addr) {
                    Some((func, line)) => self.interp_location(b, addr, func, line),
                    None => self.user_location(b, addr, i == 0, maps),
                },
            };
            self.stack.push(l);
        }
        b.stack(&self.stack)
    }

    /// The location of an interpreter frame's stack word `word`: function
    /// `func` at `line`, no mapping, its frame type as an attribute.
    fn interp_location(&mut self, b: &mut ProfilesBuilder, word: u64, func: u32, line: u32) -> i32 {
        if let Some(&l) = self.interp.get(&word) {
            return l;
        }
        let f = self.functions.and_then(|t| t.get(func));
        let (name, file, frame_type) = f.map_or(("[unknown]", "", "cpython"), |f| (&*f.name, &*f.file, f.frame_type));
        let attr = self.frame_type_attr(b, frame_type);
        let function_index = b.function(name, name, file, 0);
        let l = b.push_location(pb::Location {
            mapping_index: 0,
            address: 0,
            lines: vec![pb::Line { function_index, line: i64::from(line), column: 0 }],
            attribute_indices: vec![attr],
        });
        self.interp.insert(word, l);
        l
    }

    /// A new location for user address `addr` (`leaf`: the sampled
    /// instruction, else a return address), in the mapping of `maps` it
    /// lies in (interned on first use); JIT code is named from its
    /// process's map.
    fn user_location(&mut self, b: &mut ProfilesBuilder, addr: u64, leaf: bool, maps: Option<&MappingSet>) -> i32 {
        let mut jit = None;
        let mapping_index = maps
            .and_then(|set| {
                let i = set.mappings.partition_point(|m| m.start <= addr).checked_sub(1)?;
                let m = &set.mappings[i];
                (addr < m.end).then_some((i, m))
            })
            .map_or(0, |(i, m)| {
                if crate::ebpf::jit::may_hold_jit_code(&m.path) {
                    // A return address may be just past its call.
                    let at = if leaf { addr } else { addr.saturating_sub(1) };
                    jit = self.jit.and_then(|j| j.name(self.pid, at));
                }
                *self.mapping_idx.entry(i).or_insert_with(|| {
                    let filename_strindex = b.string(&m.path);
                    let attribute_indices = match (&m.build_id, &m.file_id) {
                        (Some(id), _) => vec![b.attribute(keys::BUILD_ID_GNU, AttrValue::Str(id))],
                        (None, Some(id)) => vec![b.attribute(keys::BUILD_ID_HTLHASH, AttrValue::Str(id))],
                        (None, None) => Vec::new(),
                    };
                    b.mapping(pb::Mapping {
                        memory_start: m.start,
                        memory_limit: m.end,
                        file_offset: m.file_offset,
                        filename_strindex,
                        attribute_indices,
                    })
                })
            });
        let l = match jit {
            Some((id, name)) => match self.jit_locs.get(&id) {
                Some(&l) => l,
                None => {
                    let l = self.jit_location(b, mapping_index, addr, name);
                    self.jit_locs.insert(id, l);
                    l
                }
            },
            None => b.push_location(pb::Location {
                mapping_index,
                address: addr,
                lines: Vec::new(),
                attribute_indices: vec![self.native_attr],
            }),
        };
        self.user.insert(addr, l);
        l
    }

    /// The location of JIT code named `name` (each name of a process one
    /// location, at the first address met: the function, not the
    /// instruction, is what a map names).
    fn jit_location(&mut self, b: &mut ProfilesBuilder, mapping_index: i32, addr: u64, name: &JitName) -> i32 {
        let attr = self.frame_type_attr(b, name.frame_type);
        let function_index = b.function(&name.function, &name.function, &name.file, i64::from(name.line));
        b.push_location(pb::Location {
            mapping_index,
            address: addr,
            lines: vec![pb::Line { function_index, line: i64::from(name.line), column: 0 }],
            attribute_indices: vec![attr],
        })
    }

    /// The `profile.frame.type` attribute of `frame_type`, made once.
    fn frame_type_attr(&mut self, b: &mut ProfilesBuilder, frame_type: &'static str) -> i32 {
        match self.frame_type_attrs.iter().find(|(t, _)| *t == frame_type) {
            Some(&(_, a)) => a,
            None => {
                let a = b.attribute(keys::FRAME_TYPE, AttrValue::Str(frame_type));
                self.frame_type_attrs.push((frame_type, a));
                a
            }
        }
    }
}

fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue { key: key.to_owned(), value: Some(AnyValue { value: Some(v) }), ..Default::default() }
}

fn comm_str(comm: &[u8; 16]) -> std::borrow::Cow<'_, str> {
    let end = comm.iter().position(|&c| c == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end])
}

fn resource(host_name: &str, info: &ProcessInfo, service_name: &str) -> Resource {
    use any_value::Value::{IntValue, StringValue};
    let mut attributes = Vec::with_capacity(12);
    attributes.push(kv(keys::SERVICE_NAME, StringValue(service_name.to_owned())));
    if !host_name.is_empty() {
        attributes.push(kv(keys::HOST_NAME, StringValue(host_name.to_owned())));
    }
    attributes.push(kv(keys::PROCESS_PID, IntValue(info.pid as i64)));
    if !info.exe_name.is_empty() {
        attributes.push(kv(keys::PROCESS_EXECUTABLE_NAME, StringValue(info.exe_name.clone())));
    }
    if let Some(p) = &info.exe_path {
        attributes.push(kv(keys::PROCESS_EXECUTABLE_PATH, StringValue(p.clone())));
    }
    if let Some(c) = &info.container {
        attributes.push(kv(keys::CONTAINER_ID, StringValue(c.id.clone())));
        let known = [
            (keys::CONTAINER_RUNTIME, c.runtime),
            (keys::CONTAINER_IMAGE_NAME, c.image_name.as_deref().map(image_name)),
            (keys::K8S_NAMESPACE_NAME, c.namespace.as_deref()),
            (keys::K8S_POD_NAME, c.pod_name.as_deref()),
            (keys::K8S_POD_UID, c.pod_uid.as_deref()),
            (keys::K8S_CONTAINER_NAME, c.container_name.as_deref()),
        ];
        for (key, v) in known {
            if let Some(v) = v.filter(|v| !v.is_empty()) {
                attributes.push(kv(key, StringValue(v.to_owned())));
            }
        }
    }
    Resource { attributes, ..Default::default() }
}

/// An image reference without its tag or digest (`container.image.name`):
/// `docker.io/library/busybox:1.36` → `docker.io/library/busybox`; a
/// registry's port (`host:5000/app`) stays.
fn image_name(reference: &str) -> &str {
    if reference.starts_with("sha256:") {
        return reference; // an image id: no name to cut
    }
    let r = reference.split_once('@').map_or(reference, |(name, _)| name);
    match r.rfind(':') {
        Some(i) if !r[i..].contains('/') => &r[..i],
        _ => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ebpf::process::service_name::Source;
    use crate::ebpf::process::Mapping;

    fn comm(s: &str) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[..s.len()].copy_from_slice(s.as_bytes());
        c
    }

    /// Frames met again are found in the batch's address caches: a kernel
    /// address is one location for every process, a user address one per
    /// process (its mapping differs), and every frame keeps its own.
    #[test]
    fn shared_frames_share_locations_and_processes_keep_their_mappings() {
        let maps_of = |path: &str, generation| {
            Arc::new(MappingSet {
                generation,
                mappings: vec![Mapping {
                    start: 0x1000,
                    end: 0x2000,
                    file_offset: 0,
                    path: path.into(),
                    build_id: None,
                    file_id: None,
                }],
            })
        };
        let (a, b) = (maps_of("/bin/a", 1), maps_of("/bin/b", 1));
        let info = |pid| Arc::new(ProcessInfo { pid, ..Default::default() });
        let (ia, ib) = (info(1), info(2));
        let mut iv = Interval::new(0, SampleAttrs { thread_id: false, thread_name: false, cpu: false });
        let sample = |pid, kstack: &'static [u64], ustack: &'static [u64]| SampleIn {
            profile: SampleProfile::Cpu,
            pid,
            tid: pid,
            cpu: 0,
            comm: comm("x"),
            unix_ns: 1,
            kstack,
            ustack,
            unwind_end: UnwindEnd::Unknown,
            interp_end: WalkEnd::None,
        };
        const K: u64 = 0xffff_ffff_8100_0000;
        iv.add(&sample(1, &[K + 1, K], &[0x1100, 0x1800]), Some((&ia, &a)));
        iv.add(&sample(1, &[K + 2, K], &[0x1200, 0x1800]), Some((&ia, &a)));
        iv.add(&sample(2, &[K + 3, K], &[0x1300, 0x1800]), Some((&ib, &b)));
        let p = iv.build("h", 1, 2, &[], &ServiceNamer::new(Vec::new()), FrameNamers::default());
        p.validate().expect("valid batch");
        let d = p.dictionary().unwrap();
        let stacks: Vec<&Vec<i32>> = p
            .profiles()
            .flat_map(|pr| pr.samples.iter())
            .map(|s| &d.stack_table[s.stack_index as usize].location_indices)
            .collect();
        assert_eq!(stacks.len(), 3);
        let loc = |i: i32| &d.location_table[i as usize];
        let file =
            |i: i32| d.string_table[d.mapping_table[loc(i).mapping_index as usize].filename_strindex as usize].as_str();
        // Every frame is its own address, in its order.
        for s in &stacks {
            assert_eq!(s.len(), 4);
            assert_eq!(loc(s[1]).address, K);
            assert_eq!(loc(s[3]).address, 0x1800);
        }
        // The kernel's K: one location in all three stacks.
        assert!(stacks.iter().all(|s| s[1] == stacks[0][1]));
        // 0x1800: one location within process 1, another in process 2.
        assert_eq!(stacks[0][3], stacks[1][3]);
        assert_ne!(stacks[0][3], stacks[2][3]);
        assert_eq!((file(stacks[0][3]), file(stacks[2][3])), ("/bin/a", "/bin/b"));
        let leaves: Vec<u64> = stacks.iter().map(|s| loc(s[2]).address).collect();
        assert_eq!(leaves, vec![0x1100, 0x1200, 0x1300]);
    }

    /// A stack is its kernel frames and its user frames apart: the same
    /// addresses split differently are two samples, the same stack met
    /// again is one, and counted samples join the timed ones of their stack.
    #[test]
    fn stacks_are_found_again_by_their_frames_and_split() {
        let info = Arc::new(ProcessInfo { pid: 3, ..Default::default() });
        let maps = Arc::new(MappingSet { generation: 1, mappings: vec![] });
        let mut iv = Interval::new(0, SampleAttrs { thread_id: false, thread_name: false, cpu: false });
        let sample = |kstack: &'static [u64], ustack: &'static [u64], unix_ns| SampleIn {
            profile: SampleProfile::Cpu,
            pid: 3,
            tid: 3,
            cpu: 0,
            comm: comm("x"),
            unix_ns,
            kstack,
            ustack,
            unwind_end: UnwindEnd::Unknown,
            interp_end: WalkEnd::None,
        };
        const K: u64 = 0xffff_ffff_8100_0000;
        iv.add(&sample(&[K, K + 1], &[0x10], 5), Some((&info, &maps)));
        iv.add(&sample(&[K], &[K + 1, 0x10], 6), Some((&info, &maps)));
        iv.add(&sample(&[K, K + 1], &[0x10], 4), Some((&info, &maps)));
        iv.add_counted_frames(&sample(&[], &[], 0), Frames::new(&[K, K + 1], &[0x10]), Some((&info, &maps)), 7);
        assert_eq!(iv.sample_count(), 10);
        let p = iv.build("h", 1, 10, &[], &ServiceNamer::new(Vec::new()), FrameNamers::default());
        p.validate().expect("valid batch");
        let d = p.dictionary().unwrap();
        // (kernel frames, addresses, times or the count) of each sample.
        let mut got: Vec<(usize, Vec<u64>, Vec<u64>)> = p
            .profiles()
            .flat_map(|pr| pr.samples.iter())
            .map(|s| {
                let locs = &d.stack_table[s.stack_index as usize].location_indices;
                let loc = |l: &i32| &d.location_table[*l as usize];
                // User frames here lie in no mapping (index 0).
                let kernel = locs.iter().filter(|l| loc(l).mapping_index != 0).count();
                let addrs = locs.iter().map(|l| loc(l).address).collect();
                let times = if s.timestamps_unix_nano.is_empty() {
                    s.values.iter().map(|&v| v as u64).collect()
                } else {
                    s.timestamps_unix_nano.clone()
                };
                (kernel, addrs, times)
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                (1, vec![K, K + 1, 0x10], vec![6]),
                (2, vec![K, K + 1, 0x10], vec![4, 5]),
                (2, vec![K, K + 1, 0x10], vec![7]),
            ]
        );
    }

    /// Off-CPU waits go to the process's `off_cpu/nanoseconds` profile,
    /// each its time as its value (in time order), split by how the thread
    /// left the CPU; the same stack on CPU stays in the CPU profile.
    #[test]
    fn off_cpu_waits_are_a_profile_of_their_time_by_state() {
        let info = Arc::new(ProcessInfo { pid: 3, ..Default::default() });
        let maps = Arc::new(MappingSet { generation: 1, mappings: vec![] });
        let mut iv = Interval::new(0, SampleAttrs { thread_id: false, thread_name: false, cpu: false });
        let sample = |profile, unix_ns| SampleIn {
            profile,
            pid: 3,
            tid: 3,
            cpu: 0,
            comm: comm("x"),
            unix_ns,
            kstack: &[],
            ustack: &[0x10, 0x20],
            unwind_end: UnwindEnd::Unknown,
            interp_end: WalkEnd::None,
        };
        let wait = |ns, state| SampleProfile::OffCpu { ns, state };
        iv.add(&sample(wait(5_000_000, OffCpuState::Sleeping), 9), Some((&info, &maps)));
        iv.add(&sample(wait(2_000_000, OffCpuState::Sleeping), 4), Some((&info, &maps)));
        iv.add(&sample(wait(3_000_000, OffCpuState::Runnable), 6), Some((&info, &maps)));
        iv.add(&sample(SampleProfile::Cpu, 7), Some((&info, &maps)));
        let p = iv.build("h", 1, 10, &[], &ServiceNamer::new(Vec::new()), FrameNamers::default());
        p.validate().expect("valid batch");
        let d = p.dictionary().unwrap();
        let s = |i: i32| d.string_table[i as usize].as_str();
        let mut got = Vec::new();
        for pr in p.profiles() {
            let st = pr.sample_type.as_ref().unwrap();
            for smp in &pr.samples {
                let state = smp
                    .attribute_indices
                    .iter()
                    .map(|&i| &d.attribute_table[i as usize])
                    .find(|a| s(a.key_strindex) == OFF_CPU_STATE_ATTR)
                    .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                        any_value::Value::StringValue(v) => Some(v.clone()),
                        _ => None,
                    });
                got.push((
                    s(st.type_strindex).to_owned(),
                    s(st.unit_strindex).to_owned(),
                    state,
                    smp.values.clone(),
                    smp.timestamps_unix_nano.clone(),
                ));
            }
        }
        got.sort();
        let row = |t: &str, u: &str, state: Option<&str>, values: Vec<i64>, times: Vec<u64>| {
            (t.to_owned(), u.to_owned(), state.map(str::to_owned), values, times)
        };
        assert_eq!(
            got,
            vec![
                row("off_cpu", "nanoseconds", Some("runnable"), vec![3_000_000], vec![6]),
                row("off_cpu", "nanoseconds", Some("sleeping"), vec![2_000_000, 5_000_000], vec![4, 9]),
                row("samples", "count", None, vec![1], vec![7]),
            ]
        );
    }

    /// A wait with its waker: the waker's sample goes to the waker's
    /// process's `wakeup/nanoseconds` profile (its value the wait's time),
    /// both carry one number; waits of one stack woken by one stack merge
    /// on both sides, another waker stack gets another number, and an
    /// interrupt's wakeup has no thread attributes.
    #[test]
    fn waits_and_their_wakers_share_a_number() {
        let proc_of = |pid| {
            (
                Arc::new(ProcessInfo { pid, ..Default::default() }),
                Arc::new(MappingSet { generation: 1, mappings: vec![] }),
            )
        };
        let (w, z) = (proc_of(3), proc_of(4));
        let mut iv = Interval::new(0, SampleAttrs { thread_id: true, thread_name: false, cpu: false });
        let sample = |profile, pid, ustack: &'static [u64], unix_ns| SampleIn {
            profile,
            pid,
            tid: pid + 100,
            cpu: 0,
            comm: comm("x"),
            unix_ns,
            kstack: &[],
            ustack,
            unwind_end: UnwindEnd::Unknown,
            interp_end: WalkEnd::None,
        };
        let wait = |ns| SampleProfile::OffCpu { ns, state: OffCpuState::Sleeping };
        let wake = |ns, from| SampleProfile::Wakeup { ns, from };
        fn at(p: &(Arc<ProcessInfo>, Arc<MappingSet>)) -> Option<(&Arc<ProcessInfo>, &Arc<MappingSet>)> {
            Some((&p.0, &p.1))
        }
        // Process 3 waits in [0x10, 0x20]; process 4 wakes it from [0x30] twice, from [0x40] once.
        for (ns, waker, t) in [(5, &[0x30u64][..], 10), (7, &[0x30], 20), (9, &[0x40], 30)] {
            let woken = sample(wait(ns), 3, &[0x10, 0x20], t + 1);
            iv.add_woken(&woken, at(&w), &sample(wake(ns, WakeupContext::Task), 4, waker, t), at(&z));
        }
        let woken = sample(wait(11), 3, &[0x10, 0x20], 41);
        iv.add_woken(&woken, at(&w), &sample(wake(11, WakeupContext::Interrupt), 3, &[], 40), at(&w));
        let p = iv.build("h", 1, 50, &[], &ServiceNamer::new(Vec::new()), FrameNamers::default());
        p.validate().expect("valid batch");
        let d = p.dictionary().unwrap();
        let s = |i: i32| d.string_table[i as usize].as_str();
        let mut got = Vec::new();
        for r in &p.0.resource_profiles {
            let pid = r.resource.as_ref().unwrap().attributes.iter().find(|a| a.key == keys::PROCESS_PID);
            let pid = match pid.and_then(|a| a.value.as_ref()?.value.as_ref()) {
                Some(any_value::Value::IntValue(v)) => *v,
                _ => -1,
            };
            for prof in r.scope_profiles.iter().flat_map(|s| s.profiles.iter()) {
                let st = prof.sample_type.as_ref().unwrap();
                for smp in &prof.samples {
                    let attrs: Vec<(String, String)> = smp
                        .attribute_indices
                        .iter()
                        .map(|&i| &d.attribute_table[i as usize])
                        .map(|a| {
                            let v = match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                                Some(any_value::Value::StringValue(v)) => v.clone(),
                                Some(any_value::Value::IntValue(v)) => v.to_string(),
                                _ => String::new(),
                            };
                            (s(a.key_strindex).to_owned(), v)
                        })
                        .collect();
                    let stack = &d.stack_table[smp.stack_index as usize];
                    let addrs: Vec<u64> =
                        stack.location_indices.iter().map(|&l| d.location_table[l as usize].address).collect();
                    got.push((pid, s(st.type_strindex).to_owned(), addrs, smp.values.clone(), attrs));
                }
            }
        }
        got.sort();
        let a = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        let tid3 = ("thread.id", "103");
        let tid4 = ("thread.id", "104");
        let st = (OFF_CPU_STATE_ATTR, "sleeping");
        let (w0, w1, w2) = ((OFF_CPU_WAKEUP_ATTR, "1"), (OFF_CPU_WAKEUP_ATTR, "2"), (OFF_CPU_WAKEUP_ATTR, "3"));
        let (thread, irq) = ((WAKEUP_FROM_ATTR, "thread"), (WAKEUP_FROM_ATTR, "interrupt"));
        assert_eq!(
            got,
            vec![
                (3, "off_cpu".into(), vec![0x10, 0x20], vec![5, 7], a(&[tid3, st, w0])),
                (3, "off_cpu".into(), vec![0x10, 0x20], vec![9], a(&[tid3, st, w1])),
                (3, "off_cpu".into(), vec![0x10, 0x20], vec![11], a(&[tid3, st, w2])),
                (3, "wakeup".into(), vec![], vec![11], a(&[irq, w2])),
                (4, "wakeup".into(), vec![0x30], vec![5, 7], a(&[tid4, thread, w0])),
                (4, "wakeup".into(), vec![0x40], vec![9], a(&[tid4, thread, w1])),
            ]
        );
    }

    #[test]
    fn builds_the_data_model() {
        let info = Arc::new(ProcessInfo {
            pid: 42,
            start_time: 1,
            exe_name: "burn".into(),
            exe_path: Some("/opt/burn".into()),
            container: None,
            service_name: "burn-svc".into(),
        });
        let maps = Arc::new(MappingSet {
            generation: 3,
            mappings: vec![Mapping {
                start: 0x1000,
                end: 0x2000,
                file_offset: 0x1000,
                path: Arc::from("/opt/burn"),
                build_id: Some(Arc::from("abcd")),
                file_id: None,
            }],
        });
        let all = SampleAttrs { thread_id: true, thread_name: true, cpu: true };
        let mut iv = Interval::new(1_000, all);
        for t in [1_500, 1_200] {
            iv.add(
                &SampleIn {
                    profile: SampleProfile::Cpu,
                    pid: 42,
                    tid: 43,
                    cpu: 1,
                    comm: comm("worker"),
                    unix_ns: t,
                    kstack: &[0xffff_ffff_8100_1234],
                    ustack: &[0x1100, 0x1200, 0x9999],
                    unwind_end: UnwindEnd::Unknown,
                    interp_end: WalkEnd::None,
                },
                Some((&info, &maps)),
            );
        }
        iv.add(
            &SampleIn {
                profile: SampleProfile::Cpu,
                pid: 7,
                tid: 7,
                cpu: 0,
                comm: comm("gone"),
                unix_ns: 1_300,
                kstack: &[],
                ustack: &[0x5555],
                unwind_end: UnwindEnd::Unknown,
                interp_end: WalkEnd::None,
            },
            None,
        );
        assert_eq!(iv.sample_count(), 3);
        let p = iv.build(
            "host1",
            52_631_578,
            2_000,
            &[],
            &ServiceNamer::new(vec![Source::Executable]),
            FrameNamers::default(),
        );
        p.validate().expect("valid batch");
        // Three observations in two Sample messages (the two of pid 42 merged).
        assert_eq!(p.sample_messages(), 2);
        assert_eq!(p.sample_count(), 3);
        let rp = &p.0.resource_profiles;
        assert_eq!(rp.len(), 2);
        let d = p.dictionary().unwrap();
        let s = |i: i32| d.string_table[i as usize].as_str();
        // pid 7 first (sorted), then 42.
        let attrs = &rp[1].resource.as_ref().unwrap().attributes;
        let get = |k: &str| attrs.iter().find(|a| a.key == k).and_then(|a| a.value.clone());
        assert_eq!(get("process.pid").unwrap().value, Some(any_value::Value::IntValue(42)));
        assert_eq!(get("process.executable.name").unwrap().value, Some(any_value::Value::StringValue("burn".into())));
        assert_eq!(get("host.name").unwrap().value, Some(any_value::Value::StringValue("host1".into())));
        assert_eq!(get("service.name").unwrap().value, Some(any_value::Value::StringValue("burn-svc".into())));
        // A process /proc could not tell about is named by its thread's comm.
        let gone = &rp[0].resource.as_ref().unwrap().attributes;
        assert_eq!(gone[0].key, "service.name");
        assert_eq!(gone[0].value.as_ref().unwrap().value, Some(any_value::Value::StringValue("gone".into())));
        // Every resource's scope: profcol and its version.
        for r in rp {
            let scope = r.scope_profiles[0].scope.as_ref().expect("a scope");
            assert_eq!((scope.name.as_str(), scope.version.as_str()), ("profcol", env!("CARGO_PKG_VERSION")));
        }
        let prof = &rp[1].scope_profiles[0].profiles[0];
        assert_eq!(prof.period, 52_631_578);
        assert_eq!(s(prof.sample_type.unwrap().type_strindex), "samples");
        assert_eq!(s(prof.period_type.unwrap().unit_strindex), "nanoseconds");
        assert_eq!(prof.time_unix_nano, 1_000);
        assert_eq!(prof.duration_nano, 1_000);
        let smp = &prof.samples[0];
        assert_eq!(smp.timestamps_unix_nano, vec![1_200, 1_500]);
        assert_eq!(smp.values, vec![1, 1]);
        let stack = &d.stack_table[smp.stack_index as usize].location_indices;
        assert_eq!(stack.len(), 4);
        let loc = |i: usize| &d.location_table[stack[i] as usize];
        let frame_type = |l: &pb::Location| {
            let a = &d.attribute_table[l.attribute_indices[0] as usize];
            (s(a.key_strindex).to_owned(), a.value.clone().unwrap().value)
        };
        // Kernel leaf first.
        assert_eq!(loc(0).address, 0xffff_ffff_8100_1234);
        assert_eq!(s(d.mapping_table[loc(0).mapping_index as usize].filename_strindex), "[kernel.kallsyms]");
        assert_eq!(
            frame_type(loc(0)),
            ("profile.frame.type".into(), Some(any_value::Value::StringValue("kernel".into())))
        );
        // User frame in the file mapping with its build id.
        let m = &d.mapping_table[loc(1).mapping_index as usize];
        assert_eq!((m.memory_start, m.memory_limit, m.file_offset), (0x1000, 0x2000, 0x1000));
        assert_eq!(s(m.filename_strindex), "/opt/burn");
        let bid = &d.attribute_table[m.attribute_indices[0] as usize];
        assert_eq!(s(bid.key_strindex), "process.executable.build_id.gnu");
        assert_eq!(loc(1).address, 0x1100);
        assert_eq!(
            frame_type(loc(1)),
            ("profile.frame.type".into(), Some(any_value::Value::StringValue("native".into())))
        );
        // Unmapped user address: no mapping, still a native frame.
        assert_eq!(loc(3).mapping_index, 0);
        assert_eq!(loc(3).address, 0x9999);
        // Sample attributes.
        let sa: Vec<_> = smp
            .attribute_indices
            .iter()
            .map(|&i| {
                let a = &d.attribute_table[i as usize];
                (s(a.key_strindex).to_owned(), a.value.clone().unwrap().value.unwrap())
            })
            .collect();
        assert!(sa.contains(&("thread.id".into(), any_value::Value::IntValue(43))));
        assert!(sa.contains(&("thread.name".into(), any_value::Value::StringValue("worker".into()))));
        assert!(sa.contains(&("cpu.logical_number".into(), any_value::Value::IntValue(1))));
    }

    /// The same stack on two CPUs (and of two threads of one name): one
    /// sample of 2 observations under the default attributes, two samples
    /// when the CPU is asked for.
    #[test]
    fn samples_differing_only_in_attributes_left_out_merge() {
        let info =
            Arc::new(ProcessInfo { pid: 9, exe_name: "w".into(), service_name: "w".into(), ..Default::default() });
        let maps = Arc::new(MappingSet { generation: 1, mappings: vec![] });
        let batch = |attrs: &[SampleAttribute]| {
            let mut iv = Interval::new(0, SampleAttrs::from_config(attrs));
            for (cpu, t) in [(0, 10), (3, 20)] {
                let s = SampleIn {
                    profile: SampleProfile::Cpu,
                    pid: 9,
                    tid: 9,
                    cpu,
                    comm: comm("w"),
                    unix_ns: t,
                    kstack: &[0xffff_ffff_8100_0000],
                    ustack: &[0x1000],
                    unwind_end: UnwindEnd::Unknown,
                    interp_end: WalkEnd::None,
                };
                iv.add(&s, Some((&info, &maps)));
            }
            iv.build("h", 1, 30, &[], &ServiceNamer::new(vec![Source::Executable]), FrameNamers::default())
        };
        let keys_of = |p: &Profiles| -> Vec<Vec<String>> {
            let d = p.dictionary().unwrap();
            p.profiles()
                .flat_map(|pr| &pr.samples)
                .map(|s| {
                    s.attribute_indices
                        .iter()
                        .map(|&i| d.string_table[d.attribute_table[i as usize].key_strindex as usize].clone())
                        .collect()
                })
                .collect()
        };
        let default = batch(&crate::ebpf::EbpfConfig::default().sample_attributes);
        assert_eq!((default.sample_messages(), default.sample_count()), (1, 2));
        assert_eq!(keys_of(&default), vec![vec!["thread.id".to_owned(), "thread.name".to_owned()]]);
        let s = default.profiles().next().unwrap().samples[0].clone();
        assert_eq!((s.values, s.timestamps_unix_nano), (vec![1, 1], vec![10, 20]));
        let with_cpu =
            batch(&[SampleAttribute::ThreadId, SampleAttribute::ThreadName, SampleAttribute::CpuLogicalNumber]);
        assert_eq!((with_cpu.sample_messages(), with_cpu.sample_count()), (2, 2));
        assert!(keys_of(&with_cpu).iter().all(|k| k.contains(&"cpu.logical_number".to_owned())));
        // Nothing asked for: one sample, no attributes.
        let bare = batch(&[]);
        assert_eq!((bare.sample_messages(), keys_of(&bare)), (1, vec![Vec::<String>::new()]));
        // A process /proc could not tell about keeps its thread's name as its
        // service's, whether or not samples carry thread.name.
        let mut iv = Interval::new(0, SampleAttrs::from_config(&[]));
        let gone = SampleIn {
            profile: SampleProfile::Cpu,
            pid: 5,
            tid: 5,
            cpu: 0,
            comm: comm("gone"),
            unix_ns: 1,
            kstack: &[],
            ustack: &[0x1000],
            unwind_end: UnwindEnd::Unknown,
            interp_end: WalkEnd::None,
        };
        iv.add(&gone, None);
        let p = iv.build("h", 1, 2, &[], &ServiceNamer::new(vec![Source::Executable]), FrameNamers::default());
        let attrs = &p.0.resource_profiles[0].resource.as_ref().unwrap().attributes;
        assert_eq!(attrs[0].key, "service.name");
        assert_eq!(attrs[0].value.as_ref().unwrap().value, Some(any_value::Value::StringValue("gone".into())));
    }

    #[test]
    fn a_container_process_carries_its_pod_and_others_none_of_it() {
        use crate::ebpf::process::containers::Container;
        let strings = |r: &Resource| -> Vec<(String, String)> {
            r.attributes
                .iter()
                .filter_map(|a| match &a.value.as_ref()?.value {
                    Some(any_value::Value::StringValue(v)) => Some((a.key.clone(), v.clone())),
                    _ => None,
                })
                .collect()
        };
        let c = Container {
            id: "ab".repeat(32),
            runtime: Some("containerd"),
            pod_name: Some("shop-7d9".into()),
            pod_uid: Some("0f5e".into()),
            namespace: Some("prod".into()),
            container_name: Some("api".into()),
            image_name: Some("docker.io/library/busybox:1.36".into()),
            ..Default::default()
        };
        let info =
            ProcessInfo { pid: 3, exe_name: "busybox".into(), container: Some(Arc::new(c)), ..Default::default() };
        let got = strings(&resource("h", &info, "api"));
        let want = [
            (keys::CONTAINER_ID, "ab".repeat(32)),
            (keys::CONTAINER_RUNTIME, "containerd".into()),
            (keys::CONTAINER_IMAGE_NAME, "docker.io/library/busybox".into()),
            (keys::K8S_NAMESPACE_NAME, "prod".into()),
            (keys::K8S_POD_NAME, "shop-7d9".into()),
            (keys::K8S_POD_UID, "0f5e".into()),
            (keys::K8S_CONTAINER_NAME, "api".into()),
        ];
        for (k, v) in &want {
            assert!(got.contains(&(k.to_string(), v.clone())), "{k}={v} missing in {got:?}");
        }
        // Outside any container: none of them.
        let plain = ProcessInfo { pid: 4, exe_name: "sh".into(), ..Default::default() };
        let got = strings(&resource("h", &plain, "sh"));
        assert!(got.iter().all(|(k, _)| want.iter().all(|(w, _)| w != k)), "{got:?}");
        // A container known by id only: its id, nothing else.
        let bare = Container { id: "cd".repeat(32), ..Default::default() };
        let info = ProcessInfo { pid: 5, container: Some(Arc::new(bare)), ..Default::default() };
        let got = strings(&resource("", &info, "x"));
        assert_eq!(got, [("service.name".into(), "x".into()), (keys::CONTAINER_ID.into(), "cd".repeat(32))]);
    }

    #[test]
    fn image_names_lose_their_tag_or_digest_only() {
        for (r, n) in [
            ("docker.io/library/busybox:1.36", "docker.io/library/busybox"),
            ("busybox", "busybox"),
            ("registry:5000/team/app", "registry:5000/team/app"),
            ("registry:5000/team/app:v2", "registry:5000/team/app"),
            ("quay.io/x@sha256:abcd", "quay.io/x"),
            ("quay.io/x:1@sha256:abcd", "quay.io/x"),
            ("sha256:4e1b", "sha256:4e1b"),
        ] {
            assert_eq!(image_name(r), n, "{r}");
        }
    }
}
