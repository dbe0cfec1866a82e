//! Names the native user frames of a batch.
//!
//! A candidate is a location with no lines yet whose mapping carries a GNU
//! build id or a file id (`..._build_id.gnu` / `..._build_id.htlhash`) and
//! whose frame type, if set, is `native`: kernel, interpreter and
//! already-named frames pass untouched. Lookups are by (build id, file
//! offset), never by pid. The first native frame of a stack is looked up
//! at its own address (the sampled instruction, or where the thread
//! entered the kernel); every outer one holds a return address and is
//! looked up at address − 1, inside the call.
//!
//! Work is per distinct stack and per distinct (location, leaf?): samples
//! only get a new stack index. The batch's lookups are first resolved per
//! binary in one go (DWARF units streamed once), then read from the memo. Counts are of frames: each sample's
//! candidate frames times its observations.

use profcol_api::model::{keys, observations, pb, profile_counts_events, str_at, Profiles, ProfilesBuilder};
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;

use super::cache::State;
use super::table::{BinaryTable, Missing, Want};

/// Frame type value of native frames.
const NATIVE_FRAME: &str = "native";

/// Candidate frames of one batch by outcome (each times its observations).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub named: u64,
    /// A table exists, but no symbol covers the address.
    pub(crate) no_symbols: u64,
    /// The table was still loading when `max_wait` ran out.
    pub pending: u64,
    /// No readable file for the build id.
    pub(crate) no_file: u64,
}

impl Outcome {
    fn add(&mut self, o: &Outcome, times: u64) {
        self.named += o.named * times;
        self.no_symbols += o.no_symbols * times;
        self.pending += o.pending * times;
        self.no_file += o.no_file * times;
    }

    pub fn frames(&self) -> u64 {
        self.named + self.no_symbols + self.pending + self.no_file
    }
}

/// A candidate mapping: its key and where to find it; its file offset base.
#[derive(Clone)]
struct MapInfo {
    want: Want,
    start: u64,
    file_offset: u64,
}

/// Candidate mappings and locations of a batch's dictionary.
pub struct Candidates {
    maps: FxHashMap<i32, MapInfo>,
    locs: FxHashSet<i32>,
    /// Mappings some candidate location is in.
    used: FxHashSet<i32>,
}

impl Candidates {
    pub fn find(batch: &Profiles) -> Self {
        let mut c = Candidates { maps: FxHashMap::default(), locs: FxHashSet::default(), used: FxHashSet::default() };
        let Some(d) = batch.dictionary() else { return c };
        let s = |i: i32| str_at(&d.string_table, i);
        let attr_str = |a: i32| -> Option<(&str, &str)> {
            let kv = d.attribute_table.get(usize::try_from(a).ok()?)?;
            match kv.value.as_ref()?.value.as_ref()? {
                profcol_api::model::any_value::Value::StringValue(v) => Some((s(kv.key_strindex), v.as_str())),
                _ => None,
            }
        };
        for (i, m) in d.mapping_table.iter().enumerate().skip(1) {
            let path = s(m.filename_strindex);
            if path.starts_with('[') {
                continue;
            }
            let mut key = None;
            for &a in &m.attribute_indices {
                match attr_str(a) {
                    Some((keys::BUILD_ID_GNU, v)) if !v.is_empty() => key = Some((v, true)),
                    Some((keys::BUILD_ID_HTLHASH, v)) if !v.is_empty() && key.is_none() => key = Some((v, false)),
                    _ => {}
                }
            }
            let Some((key, is_build_id)) = key else { continue };
            c.maps.insert(
                i as i32,
                MapInfo {
                    want: Want { key: Arc::from(key), is_build_id, path: Arc::from(path) },
                    start: m.memory_start,
                    file_offset: m.file_offset,
                },
            );
        }
        if c.maps.is_empty() {
            return c;
        }
        for (i, l) in d.location_table.iter().enumerate().skip(1) {
            if !l.lines.is_empty() || !c.maps.contains_key(&l.mapping_index) {
                continue;
            }
            let native = l.attribute_indices.iter().all(|&a| match attr_str(a) {
                Some((keys::FRAME_TYPE, v)) => v == NATIVE_FRAME,
                _ => true,
            });
            if native {
                c.locs.insert(i as i32);
                c.used.insert(l.mapping_index);
            }
        }
        c
    }

    pub fn is_empty(&self) -> bool {
        self.locs.is_empty()
    }

    /// The distinct binaries the candidate frames need.
    pub fn wants(&self) -> Vec<Want> {
        let mut seen = FxHashSet::default();
        self.used
            .iter()
            .filter_map(|m| self.maps.get(m))
            .filter(|m| seen.insert(m.want.key.clone()))
            .map(|m| m.want.clone())
            .collect()
    }
}

/// Names the candidate frames of `batch`; `state(key)` says what is loaded.
pub fn symbolize(batch: Profiles, c: &Candidates, state: &dyn Fn(&str) -> Option<State>) -> (Profiles, Outcome) {
    let mut out = Outcome::default();
    if c.is_empty() {
        return (batch, out);
    }
    let strings = &batch.dictionary().map(|d| d.string_table.clone()).unwrap_or_default();
    let shape: Vec<(profcol_api::model::ProfileRef, bool)> = batch
        .0
        .resource_profiles
        .iter()
        .enumerate()
        .flat_map(|(r, rp)| {
            rp.scope_profiles.iter().enumerate().flat_map(move |(s, sp)| {
                sp.profiles.iter().enumerate().map(move |(p, prof)| {
                    (
                        profcol_api::model::ProfileRef { resource: r, scope: s, profile: p },
                        profile_counts_events(prof, strings),
                    )
                })
            })
        })
        .collect();
    let mut b = ProfilesBuilder::from_profiles(batch);
    let mut ctx = Ctx { b: &mut b, c, state, locs: FxHashMap::default(), tables: FxHashMap::default() };
    let mut stacks: FxHashMap<i32, (i32, Outcome)> = FxHashMap::default();
    let mut rewritten = false;
    let mut distinct: FxHashSet<i32> = FxHashSet::default();
    for (r, _) in &shape {
        distinct.extend(ctx.b.profile_mut(*r).samples.iter().map(|s| s.stack_index));
    }
    ctx.prefetch(&distinct);
    for (r, counts_events) in shape {
        for i in 0..ctx.b.profile_mut(r).samples.len() {
            let s = &ctx.b.profile_mut(r).samples[i];
            let times = observations(s, counts_events);
            let stack = s.stack_index;
            let (new, o) = match stacks.get(&stack) {
                Some(&hit) => hit,
                None => {
                    let hit = ctx.stack(stack);
                    stacks.insert(stack, hit);
                    hit
                }
            };
            out.add(&o, times);
            rewritten |= new != stack;
            ctx.b.profile_mut(r).samples[i].stack_index = new;
        }
    }
    let mut batch = b.build();
    if rewritten {
        batch.compact();
    }
    (batch, out)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Named,
    NoSymbols,
    Pending,
    NoFile,
}

struct Ctx<'a, 'b> {
    b: &'b mut ProfilesBuilder,
    c: &'a Candidates,
    state: &'a dyn Fn(&str) -> Option<State>,
    /// (location, looked up at its own address?) → new location.
    locs: FxHashMap<(i32, bool), (i32, Kind)>,
    tables: FxHashMap<Arc<str>, Option<State>>,
}

impl Ctx<'_, '_> {
    fn stack(&mut self, stack: i32) -> (i32, Outcome) {
        let mut out = Outcome::default();
        let Some(st) = usize::try_from(stack).ok().and_then(|i| self.b.dictionary().stack_table.get(i)) else {
            return (stack, out);
        };
        let locs = st.location_indices.clone();
        if !locs.iter().any(|l| self.c.locs.contains(l)) {
            return (stack, out);
        }
        let mut first_user = true;
        let mut new = Vec::with_capacity(locs.len());
        for &l in &locs {
            if !self.c.locs.contains(&l) {
                // A kernel frame keeps the next user frame "first"; any
                // other frame (an interpreter's, an unknown one) does not.
                first_user &= self.is_kernel(l);
                new.push(l);
                continue;
            }
            let exact = first_user;
            first_user = false;
            let (n, kind) = match self.locs.get(&(l, exact)) {
                Some(&hit) => hit,
                None => {
                    let hit = self.location(l, exact);
                    self.locs.insert((l, exact), hit);
                    hit
                }
            };
            match kind {
                Kind::Named => out.named += 1,
                Kind::NoSymbols => out.no_symbols += 1,
                Kind::Pending => out.pending += 1,
                Kind::NoFile => out.no_file += 1,
            }
            new.push(n);
        }
        if new == locs {
            return (stack, out);
        }
        (self.b.stack(&new), out)
    }

    /// Resolves every candidate frame of `stacks` per binary in one
    /// batch (each DWARF unit streamed once), into the tables' memos.
    fn prefetch(&mut self, stacks: &FxHashSet<i32>) {
        let mut want: FxHashMap<Arc<str>, (Arc<BinaryTable>, Vec<u64>)> = FxHashMap::default();
        let mut seen: FxHashSet<(i32, bool)> = FxHashSet::default();
        for &stack in stacks {
            let Some(st) = usize::try_from(stack).ok().and_then(|i| self.b.dictionary().stack_table.get(i)) else {
                continue;
            };
            let mut first_user = true;
            for l in st.location_indices.clone() {
                if !self.c.locs.contains(&l) {
                    first_user &= self.is_kernel(l);
                    continue;
                }
                let exact = first_user;
                first_user = false;
                if seen.insert((l, exact)) {
                    if let Ok((key, table, offset)) = self.lookup(l, exact) {
                        want.entry(key).or_insert_with(|| (table, Vec::new())).1.push(offset);
                    }
                }
            }
        }
        for (table, offsets) in want.into_values() {
            table.resolve_many(&offsets);
        }
    }

    /// The table and file offset a candidate location is looked up at, or
    /// why it cannot be.
    fn lookup(&mut self, l: i32, exact: bool) -> Result<(Arc<str>, Arc<BinaryTable>, u64), Kind> {
        let Some(loc) = self.b.dictionary().location_table.get(l as usize) else {
            return Err(Kind::NoSymbols);
        };
        let (mapping, address) = (loc.mapping_index, loc.address);
        let Some(map) = self.c.maps.get(&mapping) else { return Err(Kind::NoSymbols) };
        let state = self.tables.entry(map.want.key.clone()).or_insert_with(|| (self.state)(&map.want.key)).clone();
        let table = match state {
            Some(State::Ready(t)) => t,
            Some(State::Missing(Missing::NoSymbols)) => return Err(Kind::NoSymbols),
            Some(State::Missing(Missing::NoFile)) => return Err(Kind::NoFile),
            Some(State::Loading) | None => return Err(Kind::Pending),
        };
        let Some(offset) = (address.wrapping_sub(map.start)).checked_add(map.file_offset) else {
            return Err(Kind::NoSymbols);
        };
        let lookup = if exact { offset } else { offset.saturating_sub(1) };
        Ok((map.want.key.clone(), table, lookup))
    }

    fn is_kernel(&self, l: i32) -> bool {
        let d = self.b.dictionary();
        let Some(loc) = d.location_table.get(l as usize) else { return false };
        d.mapping_table
            .get(loc.mapping_index as usize)
            .is_some_and(|m| str_at(&d.string_table, m.filename_strindex) == keys::KERNEL_MAPPING)
    }

    fn location(&mut self, l: i32, exact: bool) -> (i32, Kind) {
        let (table, lookup) = match self.lookup(l, exact) {
            Ok((_, table, lookup)) => (table, lookup),
            Err(kind) => return (l, kind),
        };
        let Some(loc) = self.b.dictionary().location_table.get(l as usize).cloned() else {
            return (l, Kind::NoSymbols);
        };
        let frames = table.resolve(lookup);
        if frames.is_empty() {
            return (l, Kind::NoSymbols);
        }
        let lines: Vec<pb::Line> = frames
            .iter()
            .map(|f| pb::Line {
                function_index: self.b.function(&f.name, &f.system_name, &f.file, 0),
                line: i64::from(f.line),
                column: 0,
            })
            .collect();
        let n = self.b.location(pb::Location { lines, ..loc });
        (n, Kind::Named)
    }
}

/// The lookup offset the processor uses for a frame (tests compare it
/// with addr2line): file offset of `address` in a mapping, −1 unless exact.
pub fn lookup_offset(address: u64, memory_start: u64, file_offset: u64, exact: bool) -> u64 {
    let off = address.wrapping_sub(memory_start).wrapping_add(file_offset);
    if exact {
        off
    } else {
        off.saturating_sub(1)
    }
}
