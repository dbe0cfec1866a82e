//! Rewrites the kernel frames of a batch: each kernel location gets a
//! mapping (vmlinux, module or BPF), a module-relative address for modules,
//! and a line naming the function. Every sample is resolved against the
//! generation live at its timestamp.
//!
//! Work is per distinct (stack, generation, BPF epoch) and (location,
//! generation, BPF epoch, exact?), never per sample: samples only get a new
//! stack index; a vmlinux function is named once per batch, however many
//! of its addresses the batch holds. Entries the rewrite orphaned are then dropped from the
//! dictionary. A sample whose timestamps see different symbols is split
//! first (see [`split_by_symbol_epoch`]). Counts are of frames: each sample's kernel frames times its
//! observations.

use profcol_api::model::{keys, observations, pb, profile_counts_events, str_at, AttrValue, Profiles, ProfilesBuilder};
use rustc_hash::{FxHashMap, FxHashSet};

use super::generations::{Generation, Generations};
use super::snapshot::{Symbol, TAIL_SLACK};
use super::sysfs::hex;
use super::table::NameBuf;
use std::sync::Arc;

/// Mapping filename of BPF frames (they have no file and no build ID).
pub(crate) const BPF_MAPPING: &str = "[bpf]";
const KERNEL_FRAME: &str = "kernel";

/// Kernel frames of one batch by outcome: every frame of every sample,
/// times the sample's observations.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub kernel_frames: u64,
    pub resolved: u64,
    /// In a known module whose names are not read yet.
    pub module_only: u64,
    pub unresolved: u64,
}

impl Outcome {
    fn count(&mut self, kind: Kind) {
        match kind {
            Kind::Resolved => self.resolved += 1,
            Kind::ModuleOnly => self.module_only += 1,
            Kind::Unresolved => self.unresolved += 1,
        }
    }

    fn add(&mut self, o: &Outcome, times: u64) {
        self.kernel_frames += o.kernel_frames * times;
        self.resolved += o.resolved * times;
        self.module_only += o.module_only * times;
        self.unresolved += o.unresolved * times;
    }
}

/// Interrupt and exception entries: the frame after one is the
/// interrupted instruction (from the saved registers), not a return address.
fn is_entry(name: &str) -> bool {
    name.starts_with("asm_")
}

/// Retpoline / return / SRSO thunks: reached by a jump, so the frame after
/// one sampled as the leaf holds a jump target, not a return address.
fn is_thunk(name: &str) -> bool {
    name.contains("_thunk") || name.starts_with("srso_")
}

/// What the next outer frame is, as this frame says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Plain,
    Entry,
    Thunk,
}

impl Class {
    /// Whether the frame after one of this class (at `pos`, leaf 0) is
    /// looked up at its exact address: after an interrupt/exception entry,
    /// or after a thunk leaf.
    fn next_exact(self, pos: usize) -> bool {
        self == Class::Entry || (pos == 0 && self == Class::Thunk)
    }
}

/// How one location came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Resolved,
    ModuleOnly,
    Unresolved,
}

/// Symbolizes every kernel frame of `batch` with `gens`.
pub fn symbolize(batch: Profiles, gens: &[Arc<Generation>]) -> (Profiles, Outcome) {
    let mut out = Outcome::default();
    let Some(dict) = batch.dictionary() else {
        return (batch, out);
    };
    let kernel_locs = kernel_locations(dict);
    if kernel_locs.is_empty() {
        return (batch, out);
    }
    let strings = &dict.string_table;
    let shape: Vec<Shape> = batch
        .0
        .resource_profiles
        .iter()
        .enumerate()
        .flat_map(|(r, rp)| {
            rp.scope_profiles.iter().enumerate().flat_map(move |(s, sp)| {
                sp.profiles
                    .iter()
                    .enumerate()
                    .map(move |(p, prof)| (r, s, p, prof.time_unix_nano, profile_counts_events(prof, strings)))
            })
        })
        .collect();
    let single = one_symbol_epoch(&batch, &shape, gens);
    let mut b = ProfilesBuilder::from_profiles(batch);
    let mut ctx = Ctx::new(&mut b);
    if let Some(g) = single {
        let out = ctx.in_place(&shape, g, &kernel_locs);
        let mut batch = b.build();
        // The receiver's bare kernel mapping is an orphan now.
        batch.compact();
        return (batch, out);
    }
    // (stack, generation, BPF epoch) -> new stack and its frames' outcome.
    let mut stacks: FxHashMap<(i32, u64, u32), (i32, Outcome)> = FxHashMap::default();
    let mut rewritten = false;
    for (resource, scope, profile, start, counts_events) in shape {
        let r = profcol_api::model::ProfileRef { resource, scope, profile };
        // Samples split below are appended and resolved in turn.
        let mut i = 0;
        while i < ctx.b.profile_mut(r).samples.len() {
            split_by_symbol_epoch(ctx.b, r, i, gens, &kernel_locs);
            let s = &ctx.b.profile_mut(r).samples[i];
            let ts = s.timestamps_unix_nano.first().copied().unwrap_or(start);
            let times = observations(s, counts_events);
            let stack = s.stack_index;
            let g = Generations::at(gens, ts);
            let epoch = g.snapshot.bpf.epoch(ts);
            let (new, o) = match stacks.get(&(stack, g.id, epoch)) {
                Some(&hit) => hit,
                None => {
                    let hit = ctx.stack(stack, g, ts, epoch, &kernel_locs);
                    stacks.insert((stack, g.id, epoch), hit);
                    hit
                }
            };
            out.add(&o, times);
            rewritten |= new != stack;
            ctx.b.profile_mut(r).samples[i].stack_index = new;
            i += 1;
        }
    }
    let mut batch = b.build();
    if rewritten {
        // The raw locations and old stacks are orphans now; don't export them.
        batch.compact();
    }
    (batch, out)
}

/// A profile of the batch: where it is, its start, whether it counts events.
type Shape = (usize, usize, usize, u64, bool);

fn samples<'a>(profiles: &'a [pb::ResourceProfiles], &(r, s, p, ..): &Shape) -> &'a [pb::Sample] {
    &profiles[r].scope_profiles[s].profiles[p].samples
}

/// The generation whose symbols every sample of the batch sees, if they all
/// see the same generation and BPF epoch (a report seldom spans a change).
fn one_symbol_epoch<'g>(batch: &Profiles, shape: &[Shape], gens: &'g [Arc<Generation>]) -> Option<&'g Generation> {
    let mut seen: Option<(&Generation, u32)> = None;
    for sh in shape {
        let start = [sh.3];
        for s in samples(&batch.0.resource_profiles, sh) {
            // A sample without times is of its profile's start.
            let times = if s.timestamps_unix_nano.is_empty() { &start[..] } else { &s.timestamps_unix_nano };
            for &ts in times {
                let g = Generations::at(gens, ts);
                let key = (&**g, g.snapshot.bpf.epoch(ts));
                match seen {
                    None => seen = Some(key),
                    Some((sg, se)) if sg.id == g.id && se == key.1 => {}
                    Some(_) => return None,
                }
            }
        }
    }
    seen.map(|(g, _)| g)
}

/// Which symbols a sample taken at `ts` sees: its generation and BPF epoch.
fn symbol_epoch(gens: &[Arc<Generation>], ts: u64) -> (u64, u32) {
    let g = Generations::at(gens, ts);
    (g.id, g.snapshot.bpf.epoch(ts))
}

/// A sample with kernel frames whose timestamps fall in different symbol
/// epochs (the same raw stack, but a BPF program freed and another loaded
/// at its address between two of them) is split, so each part is named
/// with the symbols of its own times. Sample `i` keeps the first part; the
/// others are appended to the profile. Values go with their timestamps;
/// a sample whose values do not pair with its timestamps is left whole.
fn split_by_symbol_epoch(
    b: &mut ProfilesBuilder,
    r: profcol_api::model::ProfileRef,
    i: usize,
    gens: &[Arc<Generation>],
    kernel: &FxHashSet<i32>,
) {
    let s = &b.profile_mut(r).samples[i];
    let ts = &s.timestamps_unix_nano;
    if ts.len() < 2 || !(s.values.is_empty() || s.values.len() == ts.len()) {
        return;
    }
    let first = symbol_epoch(gens, ts[0]);
    if ts.iter().all(|&t| symbol_epoch(gens, t) == first) {
        return;
    }
    let stack = s.stack_index;
    let has_kernel = usize::try_from(stack)
        .ok()
        .and_then(|k| b.dictionary().stack_table.get(k))
        .is_some_and(|st| st.location_indices.iter().any(|l| kernel.contains(l)));
    if !has_kernel {
        return;
    }
    let whole = b.profile_mut(r).samples[i].clone();
    let mut parts: Vec<((u64, u32), pb::Sample)> = Vec::new();
    for (k, &t) in whole.timestamps_unix_nano.iter().enumerate() {
        let key = symbol_epoch(gens, t);
        let at = match parts.iter().position(|p| p.0 == key) {
            Some(at) => at,
            None => {
                let empty = pb::Sample { timestamps_unix_nano: Vec::new(), values: Vec::new(), ..whole.clone() };
                parts.push((key, empty));
                parts.len() - 1
            }
        };
        let part = &mut parts[at].1;
        part.timestamps_unix_nano.push(t);
        if let Some(&v) = whole.values.get(k) {
            part.values.push(v);
        }
    }
    let mut parts = parts.into_iter().map(|p| p.1);
    let samples = &mut b.profile_mut(r).samples;
    if let Some(head) = parts.next() {
        samples[i] = head;
    }
    samples.extend(parts);
}

/// Locations with the kernel mapping and the kernel frame-type attribute
/// that carry no lines yet (already symbolized frames are left alone).
fn kernel_locations(d: &pb::ProfilesDictionary) -> FxHashSet<i32> {
    let s = |i: i32| str_at(&d.string_table, i);
    let kernel_maps: FxHashSet<i32> = (0..d.mapping_table.len() as i32)
        .filter(|&i| s(d.mapping_table[i as usize].filename_strindex) == keys::KERNEL_MAPPING)
        .collect();
    let kernel_attrs: FxHashSet<i32> = (0..d.attribute_table.len() as i32)
        .filter(|&i| {
            let kv = &d.attribute_table[i as usize];
            s(kv.key_strindex) == keys::FRAME_TYPE
                && matches!(
                    kv.value.as_ref().and_then(|v| v.value.as_ref()),
                    Some(profcol_api::model::any_value::Value::StringValue(v)) if v == KERNEL_FRAME
                )
        })
        .collect();
    (0..d.location_table.len() as i32)
        .filter(|&i| {
            let l = &d.location_table[i as usize];
            l.lines.is_empty()
                && kernel_maps.contains(&l.mapping_index)
                && l.attribute_indices.iter().any(|a| kernel_attrs.contains(a))
        })
        .collect()
}

/// (location, generation, BPF epoch, exact address?): one lookup.
type LocKey = (i32, u64, u32, bool);

struct Ctx<'b> {
    b: &'b mut ProfilesBuilder,
    locs: FxHashMap<LocKey, (i32, Kind, Class)>,
    frame_attr: i32,
    /// Mappings made in this batch by (start, limit): the kernel's is met
    /// at almost every kernel frame, and making one formats its build id.
    mappings: FxHashMap<(u64, u64), MadeMapping>,
    /// The function and class of each vmlinux symbol named in this batch,
    /// by (generation, symbol index): a report's kernel frames lie in far
    /// fewer functions than addresses, and each name was decoded, hashed
    /// and classified again at every address.
    functions: FxHashMap<(u64, u32), (i32, Class)>,
}

/// A mapping [`Ctx::mapping`] made, with what it was made from.
struct MadeMapping {
    file: Box<str>,
    build_id: Option<Box<[u8]>>,
    index: i32,
}

impl<'b> Ctx<'b> {
    fn new(b: &'b mut ProfilesBuilder) -> Self {
        let frame_attr = b.attribute(keys::FRAME_TYPE, AttrValue::Str(KERNEL_FRAME));
        Ctx {
            b,
            locs: FxHashMap::default(),
            frame_attr,
            mappings: FxHashMap::default(),
            functions: FxHashMap::default(),
        }
    }

    /// Names the batch's kernel locations where they stand, when all its
    /// samples see one generation and BPF epoch (`g`'s): no location or
    /// stack is hashed, and stacks are left as they are, but for a location
    /// named two ways (looked up exactly, say as a leaf at a function's
    /// first byte, and as a return address landing in the function before):
    /// it keeps its return-address name and the stacks that hold it
    /// exactly get a new location.
    fn in_place(&mut self, shape: &[Shape], g: &Generation, kernel: &FxHashSet<i32>) -> Outcome {
        let d = self.b.dictionary();
        let (n_locs, n_stacks) = (d.location_table.len(), d.stack_table.len());
        // Per location, per [inexact, exact] lookup: 1 + its index in `named`.
        let mut slot: Vec<[u32; 2]> = vec![[0; 2]; n_locs];
        let mut named: Vec<(Option<pb::Location>, Kind, Class)> = Vec::new();
        let mut stack_out: Vec<Option<Outcome>> = vec![None; n_stacks];
        let mut frames: Vec<i32> = Vec::new();
        let mut out = Outcome::default();
        for sh in shape {
            let n = samples(self.b.resources(), sh).len();
            for i in 0..n {
                let s = &samples(self.b.resources(), sh)[i];
                let Some(k) = usize::try_from(s.stack_index).ok().filter(|&k| k < n_stacks) else { continue };
                if stack_out[k].is_some() {
                    continue;
                }
                let ts = s.timestamps_unix_nano.first().copied().unwrap_or(sh.3);
                frames.clear();
                frames.extend_from_slice(&self.b.dictionary().stack_table[k].location_indices);
                let mut o = Outcome::default();
                let mut exact = true;
                for (pos, &l) in frames.iter().enumerate() {
                    if !kernel.contains(&l) {
                        exact = false;
                        continue;
                    }
                    o.kernel_frames += 1;
                    let cell = &mut slot[l as usize][usize::from(exact)];
                    if *cell == 0 {
                        let hit = self
                            .name(l, g, ts, exact)
                            .map_or((None, Kind::Unresolved, Class::Plain), |(n, k, c)| (Some(n), k, c));
                        named.push(hit);
                        *cell = named.len() as u32;
                    }
                    let &(_, kind, class) = &named[*cell as usize - 1];
                    exact = class.next_exact(pos);
                    o.count(kind);
                }
                stack_out[k] = Some(o);
            }
        }
        // A location named two ways: its exact name goes to a new location.
        let mut exact_alias: FxHashMap<i32, i32> = FxHashMap::default();
        for (l, &[a, b]) in slot.iter().enumerate() {
            if a != 0 && b != 0 && named[a as usize - 1].0 != named[b as usize - 1].0 {
                let alias = match named[b as usize - 1].0.take() {
                    Some(loc) => self.b.push_location(loc),
                    // Looked up exactly it names nothing: the exact uses
                    // get a copy of the raw location.
                    None => self.b.push_location(self.b.dictionary().location_table[l].clone()),
                };
                exact_alias.insert(l as i32, alias);
            }
        }
        for (l, &[a, b]) in slot.iter().enumerate() {
            // The return-address name where there are both.
            let at = if a != 0 { a } else { b };
            if at == 0 {
                continue;
            }
            if let Some(loc) = named[at as usize - 1].0.take() {
                self.b.set_location(l as i32, loc);
            }
        }
        if !exact_alias.is_empty() {
            self.alias_exact_frames(&stack_out, kernel, &exact_alias, &named, &slot);
        }
        for sh in shape {
            for s in samples(self.b.resources(), sh) {
                let k = usize::try_from(s.stack_index).ok();
                if let Some(o) = k.and_then(|k| stack_out.get(k)).copied().flatten() {
                    out.add(&o, observations(s, sh.4));
                }
            }
        }
        out
    }

    /// Points the exact uses of the locations in `alias` (location → its
    /// exact-name copy) at the copy, in the stacks walked (`walked`), with
    /// the same exact/−1 rule as the walk (the classes in `named`).
    fn alias_exact_frames(
        &mut self,
        walked: &[Option<Outcome>],
        kernel: &FxHashSet<i32>,
        alias: &FxHashMap<i32, i32>,
        named: &[(Option<pb::Location>, Kind, Class)],
        slot: &[[u32; 2]],
    ) {
        for (k, o) in walked.iter().enumerate() {
            if o.is_none() {
                continue;
            }
            let frames = &self.b.dictionary().stack_table[k].location_indices;
            if !frames.iter().any(|l| alias.contains_key(l)) {
                continue;
            }
            let mut new = frames.clone();
            let mut exact = true;
            for (pos, l) in new.iter_mut().enumerate() {
                if !kernel.contains(l) {
                    exact = false;
                    continue;
                }
                let class = named[slot[*l as usize][usize::from(exact)] as usize - 1].2;
                if exact {
                    if let Some(&a) = alias.get(l) {
                        *l = a;
                    }
                }
                exact = class.next_exact(pos);
            }
            self.b.set_stack(k as i32, new);
        }
    }

    fn stack(&mut self, stack: i32, g: &Generation, ts: u64, epoch: u32, kernel: &FxHashSet<i32>) -> (i32, Outcome) {
        let mut out = Outcome::default();
        let Some(st) = usize::try_from(stack).ok().and_then(|i| self.b.dictionary().stack_table.get(i)) else {
            return (stack, out);
        };
        let locs = st.location_indices.clone();
        if !locs.iter().any(|l| kernel.contains(l)) {
            return (stack, out);
        }
        // Leaf first. A frame is looked up at its exact address when it is
        // the leaf, follows an interrupt/exception entry, or follows a thunk
        // leaf; every other frame holds a return address (address − 1),
        // unless that lands in the padding before a function.
        let mut exact = true;
        let new: Vec<i32> = locs
            .iter()
            .enumerate()
            .map(|(pos, &l)| {
                if !kernel.contains(&l) {
                    exact = false;
                    return l;
                }
                out.kernel_frames += 1;
                let (n, kind, class) = match self.locs.get(&(l, g.id, epoch, exact)) {
                    Some(&hit) => hit,
                    None => {
                        let hit = self.location(l, g, ts, exact);
                        self.locs.insert((l, g.id, epoch, exact), hit);
                        hit
                    }
                };
                exact = class.next_exact(pos);
                out.count(kind);
                n
            })
            .collect();
        (self.b.stack(&new), out)
    }

    fn location(&mut self, loc: i32, g: &Generation, ts: u64, exact: bool) -> (i32, Kind, Class) {
        match self.name(loc, g, ts, exact) {
            Some((named, kind, class)) => (self.b.location(named), kind, class),
            None => (loc, Kind::Unresolved, Class::Plain),
        }
    }

    /// Location `loc` named with `g`'s symbols at `ts` (not interned);
    /// `None` when its address names nothing.
    fn name(&mut self, loc: i32, g: &Generation, ts: u64, exact: bool) -> Option<(pb::Location, Kind, Class)> {
        let addr = self.b.dictionary().location_table.get(usize::try_from(loc).ok()?)?.address;
        let snap = &g.snapshot;
        let lookup = if exact || snap.padded_start(addr) { addr } else { addr.saturating_sub(1) };
        let mut class = Class::Plain;
        let mut classify = |name: &str| {
            class = if is_entry(name) {
                Class::Entry
            } else if is_thunk(name) {
                Class::Thunk
            } else {
                Class::Plain
            };
        };
        let mut buf = NameBuf::new();
        let (mapping, address, line) = match snap.lookup_at(lookup, ts) {
            Some(Symbol::Kernel { name, .. }) => {
                let v = &snap.vmlinux;
                let m = self.mapping(
                    keys::KERNEL_MAPPING,
                    v.base(),
                    v.last_addr() + TAIL_SLACK,
                    snap.vmlinux_build_id.as_deref(),
                );
                let line = match self.functions.get(&(g.id, name.index())) {
                    Some(&(function_index, c)) => {
                        class = c;
                        pb::Line { function_index, line: 0, column: 0 }
                    }
                    None => {
                        let text = name.decode(&mut buf);
                        classify(text);
                        let line = self.func_line(text, text, "", 0);
                        self.functions.insert((g.id, name.index()), (line.function_index, class));
                        line
                    }
                };
                (m, addr, Some(line))
            }
            Some(Symbol::Module { module, sym }) => {
                let m = self.mapping(&module.name, module.text, module.text + module.size, module.build_id.as_deref());
                let line = sym.map(|(name, _)| {
                    let name = name.decode(&mut buf);
                    self.func_line(name, name, "", 0)
                });
                (m, addr - module.text, line)
            }
            Some(Symbol::Loose { module, name, .. }) => {
                let m = self.mapping(module, 0, 0, None);
                let name = name.decode(&mut buf);
                (m, addr, Some(self.func_line(name, name, "", 0)))
            }
            Some(Symbol::Bpf { func, line, .. }) => {
                let m = self.mapping(BPF_MAPPING, func.start, func.start + u64::from(func.len), None);
                let name = func.func.as_deref().unwrap_or(&func.name);
                let (file, no) = line.map_or(("", 0), |l| (&*l.file, i64::from(l.line)));
                (m, addr, Some(self.func_line(name, &func.name, file, no)))
            }
            None => return None,
        };
        let kind = if line.is_some() { Kind::Resolved } else { Kind::ModuleOnly };
        let named = pb::Location {
            mapping_index: mapping,
            address,
            lines: line.into_iter().collect(),
            attribute_indices: vec![self.frame_attr],
        };
        Some((named, kind, class))
    }

    fn mapping(&mut self, file: &str, start: u64, limit: u64, build_id: Option<&[u8]>) -> i32 {
        if let Some(m) = self.mappings.get(&(start, limit)) {
            if *m.file == *file && m.build_id.as_deref() == build_id {
                return m.index;
            }
        }
        let index = self.make_mapping(file, start, limit, build_id);
        let made = MadeMapping { file: file.into(), build_id: build_id.map(Into::into), index };
        self.mappings.insert((start, limit), made);
        index
    }

    fn make_mapping(&mut self, file: &str, start: u64, limit: u64, build_id: Option<&[u8]>) -> i32 {
        let filename_strindex = self.b.string(file);
        let attribute_indices = match build_id {
            Some(id) => vec![self.b.attribute(keys::BUILD_ID_GNU, AttrValue::Str(&hex(id)))],
            None => Vec::new(),
        };
        self.b.mapping(pb::Mapping {
            memory_start: start,
            memory_limit: limit,
            file_offset: 0,
            filename_strindex,
            attribute_indices,
        })
    }

    fn func_line(&mut self, name: &str, system_name: &str, file: &str, line: i64) -> pb::Line {
        pb::Line { function_index: self.b.function(name, system_name, file, 0), line, column: 0 }
    }
}
