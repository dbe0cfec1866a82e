//! Rewrites the kernel frames of a batch: each kernel location gets a
//! mapping (vmlinux, module or BPF), a module-relative address for modules,
//! and a line naming the function. Every sample is resolved against the
//! generation live at its timestamp.
//!
//! Work is per distinct (stack, generation) and (location, generation,
//! leaf?), never per sample: samples only get a new stack index. Entries
//! the rewrite orphaned are then dropped from the dictionary.

use profcol_api::model::{keys, pb, str_at, AttrValue, Profiles, ProfilesBuilder};
use rustc_hash::{FxHashMap, FxHashSet};

use super::generations::{Generation, Generations};
use super::snapshot::{Symbol, TAIL_SLACK};
use super::sysfs::hex;
use std::sync::Arc;

/// Mapping filename of BPF frames (they have no file and no build ID).
pub const BPF_MAPPING: &str = "[bpf]";
const KERNEL_FRAME: &str = "kernel";

/// What one batch went through.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub kernel_frames: u64,
    pub resolved: u64,
    /// In a known module whose names are not read yet.
    pub module_only: u64,
    pub unresolved: u64,
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
    let shape: Vec<(usize, usize, usize, u64)> = batch
        .0
        .resource_profiles
        .iter()
        .enumerate()
        .flat_map(|(r, rp)| {
            rp.scope_profiles.iter().enumerate().flat_map(move |(s, sp)| {
                sp.profiles.iter().enumerate().map(move |(p, prof)| (r, s, p, prof.time_unix_nano))
            })
        })
        .collect();
    let mut b = ProfilesBuilder::from_profiles(batch);
    let mut ctx = Ctx::new(&mut b);
    let mut stacks: FxHashMap<(i32, u64), i32> = FxHashMap::default();
    let mut rewritten = false;
    for (resource, scope, profile, start) in shape {
        let r = profcol_api::model::ProfileRef { resource, scope, profile };
        let n = ctx.b.profile_mut(r).samples.len();
        for i in 0..n {
            let s = &ctx.b.profile_mut(r).samples[i];
            let ts = s.timestamps_unix_nano.first().copied().unwrap_or(start);
            let stack = s.stack_index;
            let g = Generations::at(gens, ts);
            let new = match stacks.get(&(stack, g.id)) {
                Some(&n) => n,
                None => {
                    let n = ctx.stack(stack, g, &kernel_locs, &mut out);
                    stacks.insert((stack, g.id), n);
                    n
                }
            };
            rewritten |= new != stack;
            ctx.b.profile_mut(r).samples[i].stack_index = new;
        }
    }
    let mut batch = b.build();
    if rewritten {
        // The raw locations and old stacks are orphans now; don't export them.
        batch.compact();
    }
    (batch, out)
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

struct Ctx<'b> {
    b: &'b mut ProfilesBuilder,
    locs: FxHashMap<(i32, u64, bool), i32>,
    frame_attr: i32,
}

impl<'b> Ctx<'b> {
    fn new(b: &'b mut ProfilesBuilder) -> Self {
        let frame_attr = b.attribute(keys::FRAME_TYPE, AttrValue::Str(KERNEL_FRAME));
        Ctx { b, locs: FxHashMap::default(), frame_attr }
    }

    fn stack(&mut self, stack: i32, g: &Generation, kernel: &FxHashSet<i32>, out: &mut Outcome) -> i32 {
        let Some(st) = usize::try_from(stack).ok().and_then(|i| self.b.dictionary().stack_table.get(i)) else {
            return stack;
        };
        let locs = st.location_indices.clone();
        if !locs.iter().any(|l| kernel.contains(l)) {
            return stack;
        }
        // Leaf first: every frame but the first holds a return address.
        let new: Vec<i32> = locs
            .iter()
            .enumerate()
            .map(|(pos, &l)| {
                if !kernel.contains(&l) {
                    return l;
                }
                let leaf = pos == 0;
                if let Some(&n) = self.locs.get(&(l, g.id, leaf)) {
                    return n;
                }
                let n = self.location(l, g, leaf, out);
                self.locs.insert((l, g.id, leaf), n);
                n
            })
            .collect();
        self.b.stack(&new)
    }

    fn location(&mut self, loc: i32, g: &Generation, leaf: bool, out: &mut Outcome) -> i32 {
        out.kernel_frames += 1;
        let Some(addr) = self.b.dictionary().location_table.get(loc as usize).map(|l| l.address) else {
            return loc;
        };
        let lookup = if leaf { addr } else { addr.saturating_sub(1) };
        let snap = &g.snapshot;
        let (mapping, address, line) = match snap.lookup(lookup) {
            Some(Symbol::Kernel { name, .. }) => {
                let v = &snap.vmlinux;
                let m = self.mapping(
                    keys::KERNEL_MAPPING,
                    v.base(),
                    v.last_addr() + TAIL_SLACK,
                    snap.vmlinux_build_id.as_deref(),
                );
                (m, addr, Some(self.func_line(name, name, "", 0)))
            }
            Some(Symbol::Module { module, sym }) => {
                let m = self.mapping(&module.name, module.text, module.text + module.size, module.build_id.as_deref());
                let line = sym.map(|(name, _)| self.func_line(name, name, "", 0));
                (m, addr - module.text, line)
            }
            Some(Symbol::Loose { module, name, .. }) => {
                let m = self.mapping(module, 0, 0, None);
                (m, addr, Some(self.func_line(name, name, "", 0)))
            }
            Some(Symbol::Bpf { func, line, .. }) => {
                let m = self.mapping(BPF_MAPPING, func.start, func.start + u64::from(func.len), None);
                let name = func.func.as_deref().unwrap_or(&func.name);
                let (file, no) = line.map_or(("", 0), |l| (&*l.file, i64::from(l.line)));
                (m, addr, Some(self.func_line(name, &func.name, file, no)))
            }
            None => {
                out.unresolved += 1;
                return loc;
            }
        };
        if line.is_some() {
            out.resolved += 1;
        } else {
            out.module_only += 1;
        }
        self.b.location(pb::Location {
            mapping_index: mapping,
            address,
            lines: line.into_iter().collect(),
            attribute_indices: vec![self.frame_attr],
        })
    }

    fn mapping(&mut self, file: &str, start: u64, limit: u64, build_id: Option<&[u8]>) -> i32 {
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
