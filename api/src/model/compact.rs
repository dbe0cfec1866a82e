//! Dictionary garbage collection: drops table entries nothing live refers to.
//!
//! Processors that rewrite frames (kernel_symbols) add new locations and
//! stacks and leave the old ones behind. The spec lets a processor remove
//! orphans with no observable effect, and every orphan costs wire bytes.
//!
//! Liveness is marked from the batch down (samples and profiles → stacks,
//! links, attributes → locations → mappings, functions → strings), so an
//! entry only a dead entry refers to is dead too. Survivors keep their
//! relative order and entry 0 of every table stays at index 0.

use super::any_value::Value;
use super::{pb, AnyValue, KeyValue};

/// Entries removed per table by [`super::Profiles::compact`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Compacted {
    pub strings: usize,
    pub attributes: usize,
    pub mappings: usize,
    pub functions: usize,
    pub locations: usize,
    pub stacks: usize,
    pub links: usize,
}

impl Compacted {
    pub fn total(&self) -> usize {
        self.strings + self.attributes + self.mappings + self.functions + self.locations + self.stacks + self.links
    }
}

const DEAD: i32 = -1;
const LIVE: i32 = 0;

/// A reference past the end of its table: the batch is left as it is.
struct OutOfRange;

/// Marks of one table, then (after [`Table::number`]) its old → new map.
struct Table {
    map: Vec<i32>,
    removed: usize,
    /// Every survivor keeps its index, so references need no rewrite.
    identity: bool,
}

impl Table {
    fn new(len: usize) -> Self {
        // An absent table still has its implied zero entry.
        let mut map = vec![DEAD; len.max(1)];
        map[0] = LIVE;
        Table { map, removed: 0, identity: true }
    }

    #[inline]
    fn mark(&mut self, i: i32) -> Result<(), OutOfRange> {
        // Negative indices become huge and miss too.
        *self.map.get_mut(i as u32 as usize).ok_or(OutOfRange)? = LIVE;
        Ok(())
    }

    fn mark_all(&mut self, v: &[i32]) -> Result<(), OutOfRange> {
        v.iter().try_for_each(|&i| self.mark(i))
    }

    /// The entries of `table` marked live so far.
    fn live<'a, T>(&'a self, table: &'a [T]) -> impl Iterator<Item = &'a T> + 'a {
        table.iter().zip(&self.map).filter(|(_, &m)| m != DEAD).map(|(e, _)| e)
    }

    /// Turns the marks into new indices.
    fn number(&mut self) {
        let mut next = 0;
        for (i, m) in self.map.iter_mut().enumerate() {
            if *m != DEAD {
                self.identity &= next == i as i32;
                *m = next;
                next += 1;
            }
        }
        self.removed = self.map.len() - next as usize;
    }

    fn retain<T>(&self, v: &mut Vec<T>) {
        if self.removed > 0 {
            let mut i = 0;
            v.retain(|_| {
                i += 1;
                self.map[i - 1] != DEAD
            });
        }
    }

    /// Only called on references the mark phase checked.
    #[inline]
    fn remap(&self, i: &mut i32) {
        *i = self.map[*i as usize];
    }

    fn remap_all(&self, v: &mut [i32]) {
        v.iter_mut().for_each(|i| self.remap(i));
    }
}

fn mark_any(v: &AnyValue, s: &mut Table) -> Result<(), OutOfRange> {
    match &v.value {
        Some(Value::StringValueStrindex(i)) => s.mark(*i),
        Some(Value::ArrayValue(a)) => a.values.iter().try_for_each(|v| mark_any(v, s)),
        Some(Value::KvlistValue(l)) => mark_kvs(&l.values, s),
        _ => Ok(()),
    }
}

/// `KeyValue`s may name their key and string values by string index.
fn mark_kvs(kvs: &[KeyValue], s: &mut Table) -> Result<(), OutOfRange> {
    for kv in kvs {
        s.mark(kv.key_strindex)?;
        if let Some(v) = &kv.value {
            mark_any(v, s)?;
        }
    }
    Ok(())
}

fn remap_kvs(kvs: &mut [KeyValue], s: &Table) {
    super::strindex::kvs_mut(kvs, &mut |i| s.remap(i));
}

struct Tables {
    strings: Table,
    attrs: Table,
    mappings: Table,
    functions: Table,
    locations: Table,
    stacks: Table,
    links: Table,
}

impl Tables {
    fn new(d: &pb::ProfilesDictionary) -> Self {
        Tables {
            strings: Table::new(d.string_table.len()),
            attrs: Table::new(d.attribute_table.len()),
            mappings: Table::new(d.mapping_table.len()),
            functions: Table::new(d.function_table.len()),
            locations: Table::new(d.location_table.len()),
            stacks: Table::new(d.stack_table.len()),
            links: Table::new(d.link_table.len()),
        }
    }

    /// Marks what the batch reaches; each table is walked after everything
    /// that can refer to it, so only live entries mark further.
    fn mark(&mut self, data: &pb::ProfilesData, d: &pb::ProfilesDictionary) -> Result<(), OutOfRange> {
        for rp in &data.resource_profiles {
            if let Some(r) = &rp.resource {
                mark_kvs(&r.attributes, &mut self.strings)?;
            }
            for sp in &rp.scope_profiles {
                if let Some(sc) = &sp.scope {
                    mark_kvs(&sc.attributes, &mut self.strings)?;
                }
                for p in &sp.profiles {
                    for vt in p.sample_type.iter().chain(&p.period_type) {
                        self.strings.mark(vt.type_strindex)?;
                        self.strings.mark(vt.unit_strindex)?;
                    }
                    self.attrs.mark_all(&p.attribute_indices)?;
                    for s in &p.samples {
                        self.stacks.mark(s.stack_index)?;
                        self.links.mark(s.link_index)?;
                        self.attrs.mark_all(&s.attribute_indices)?;
                    }
                }
            }
        }
        for st in self.stacks.live(&d.stack_table) {
            self.locations.mark_all(&st.location_indices)?;
        }
        for l in self.locations.live(&d.location_table) {
            self.mappings.mark(l.mapping_index)?;
            for ln in &l.lines {
                self.functions.mark(ln.function_index)?;
            }
            self.attrs.mark_all(&l.attribute_indices)?;
        }
        for m in self.mappings.live(&d.mapping_table) {
            self.strings.mark(m.filename_strindex)?;
            self.attrs.mark_all(&m.attribute_indices)?;
        }
        for f in self.functions.live(&d.function_table) {
            self.strings.mark(f.name_strindex)?;
            self.strings.mark(f.system_name_strindex)?;
            self.strings.mark(f.filename_strindex)?;
        }
        for kv in self.attrs.live(&d.attribute_table) {
            self.strings.mark(kv.key_strindex)?;
            self.strings.mark(kv.unit_strindex)?;
            if let Some(v) = &kv.value {
                mark_any(v, &mut self.strings)?;
            }
        }
        Ok(())
    }

    fn number(&mut self) -> Compacted {
        let all = [
            &mut self.strings,
            &mut self.attrs,
            &mut self.mappings,
            &mut self.functions,
            &mut self.locations,
            &mut self.stacks,
            &mut self.links,
        ];
        all.into_iter().for_each(Table::number);
        Compacted {
            strings: self.strings.removed,
            attributes: self.attrs.removed,
            mappings: self.mappings.removed,
            functions: self.functions.removed,
            locations: self.locations.removed,
            stacks: self.stacks.removed,
            links: self.links.removed,
        }
    }

    fn rewrite_dictionary(&self, d: &mut pb::ProfilesDictionary) {
        let (s, a) = (&self.strings, &self.attrs);
        s.retain(&mut d.string_table);
        a.retain(&mut d.attribute_table);
        self.mappings.retain(&mut d.mapping_table);
        self.functions.retain(&mut d.function_table);
        self.locations.retain(&mut d.location_table);
        self.stacks.retain(&mut d.stack_table);
        self.links.retain(&mut d.link_table);
        if !s.identity {
            for kv in &mut d.attribute_table {
                s.remap(&mut kv.key_strindex);
                s.remap(&mut kv.unit_strindex);
                if let Some(v) = &mut kv.value {
                    super::strindex::any_mut(v, &mut |i| s.remap(i));
                }
            }
            for f in &mut d.function_table {
                s.remap(&mut f.name_strindex);
                s.remap(&mut f.system_name_strindex);
                s.remap(&mut f.filename_strindex);
            }
        }
        if !s.identity || !a.identity {
            for m in &mut d.mapping_table {
                s.remap(&mut m.filename_strindex);
                a.remap_all(&mut m.attribute_indices);
            }
        }
        let (m, f) = (&self.mappings, &self.functions);
        if !m.identity || !f.identity || !a.identity {
            for l in &mut d.location_table {
                m.remap(&mut l.mapping_index);
                for ln in &mut l.lines {
                    f.remap(&mut ln.function_index);
                }
                a.remap_all(&mut l.attribute_indices);
            }
        }
        if !self.locations.identity {
            for st in &mut d.stack_table {
                self.locations.remap_all(&mut st.location_indices);
            }
        }
    }

    fn rewrite_batch(&self, resource_profiles: &mut [pb::ResourceProfiles]) {
        let (s, a, st, lk) = (&self.strings, &self.attrs, &self.stacks, &self.links);
        let samples = !st.identity || !lk.identity || !a.identity;
        for rp in resource_profiles {
            if !s.identity {
                if let Some(r) = &mut rp.resource {
                    remap_kvs(&mut r.attributes, s);
                }
            }
            for sp in &mut rp.scope_profiles {
                if !s.identity {
                    if let Some(sc) = &mut sp.scope {
                        remap_kvs(&mut sc.attributes, s);
                    }
                }
                for p in &mut sp.profiles {
                    if !s.identity {
                        for vt in p.sample_type.iter_mut().chain(p.period_type.iter_mut()) {
                            s.remap(&mut vt.type_strindex);
                            s.remap(&mut vt.unit_strindex);
                        }
                    }
                    if !a.identity {
                        a.remap_all(&mut p.attribute_indices);
                    }
                    if samples {
                        for smp in &mut p.samples {
                            st.remap(&mut smp.stack_index);
                            lk.remap(&mut smp.link_index);
                            a.remap_all(&mut smp.attribute_indices);
                        }
                    }
                }
            }
        }
    }
}

/// Removes every dictionary entry nothing live refers to and renumbers the
/// rest in order. A batch with nothing dead, or with an out-of-range index
/// (which `validate` reports), is left untouched.
pub(super) fn compact(data: &mut pb::ProfilesData) -> Compacted {
    let Some(d) = data.dictionary.as_ref() else {
        return Compacted::default();
    };
    let mut t = Tables::new(d);
    if t.mark(data, d).is_err() {
        return Compacted::default();
    }
    let removed = t.number();
    if removed.total() == 0 {
        return removed;
    }
    if let Some(d) = data.dictionary.as_mut() {
        t.rewrite_dictionary(d);
    }
    t.rewrite_batch(&mut data.resource_profiles);
    removed
}

#[cfg(test)]
mod tests {
    use super::super::{canonical, AttrValue, InstrumentationScope, ProfileMeta, Profiles, ProfilesBuilder, Resource};
    use super::*;

    /// xorshift64: deterministic and dependency-free.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    fn sv(i: i32) -> Option<AnyValue> {
        Some(AnyValue { value: Some(Value::StringValueStrindex(i)) })
    }

    fn str_of(p: &Profiles, i: i32) -> String {
        super::super::str_at(&p.dictionary().unwrap().string_table, i).to_owned()
    }

    fn any_text(p: &Profiles, v: Option<&AnyValue>) -> String {
        match v.and_then(|v| v.value.as_ref()) {
            Some(Value::StringValueStrindex(i)) => format!("strref:{}", str_of(p, *i)),
            Some(Value::ArrayValue(a)) => {
                format!("[{}]", a.values.iter().map(|v| any_text(p, Some(v))).collect::<Vec<_>>().join(","))
            }
            Some(Value::KvlistValue(l)) => format!("{{{}}}", kvs_text(p, &l.values)),
            other => format!("{other:?}"),
        }
    }

    fn kvs_text(p: &Profiles, kvs: &[KeyValue]) -> String {
        kvs.iter()
            .map(|kv| {
                let key = if kv.key_strindex != 0 { str_of(p, kv.key_strindex) } else { kv.key.clone() };
                format!("{key}={}", any_text(p, kv.value.as_ref()))
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    fn attrs_text(p: &Profiles, idx: &[i32]) -> String {
        let d = p.dictionary().unwrap();
        idx.iter()
            .map(|&i| {
                let kv = &d.attribute_table[i as usize];
                let unit = str_of(p, kv.unit_strindex);
                format!("{}[{unit}]={}", str_of(p, kv.key_strindex), any_text(p, kv.value.as_ref()))
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Every sample and profile with every field resolved, in batch order:
    /// what `canonical` leaves out too (mapping ranges and attributes,
    /// system names, links, profile-level fields, string-index values).
    fn resolved(p: &Profiles) -> Vec<String> {
        let d = p.dictionary().unwrap();
        let s = |i| str_of(p, i);
        let mut out = Vec::new();
        for rp in &p.0.resource_profiles {
            out.push(format!("resource {}", kvs_text(p, &rp.resource.as_ref().unwrap().attributes)));
            for sp in &rp.scope_profiles {
                if let Some(sc) = &sp.scope {
                    out.push(format!("scope {}", kvs_text(p, &sc.attributes)));
                }
                for prof in &sp.profiles {
                    let vt = |v: &Option<pb::ValueType>| {
                        v.as_ref().map(|v| (s(v.type_strindex), s(v.unit_strindex))).unwrap_or_default()
                    };
                    out.push(format!(
                        "profile {:?} {:?} {}",
                        vt(&prof.sample_type),
                        vt(&prof.period_type),
                        attrs_text(p, &prof.attribute_indices)
                    ));
                    for smp in &prof.samples {
                        let frames: Vec<String> = d.stack_table[smp.stack_index as usize]
                            .location_indices
                            .iter()
                            .map(|&li| {
                                let l = &d.location_table[li as usize];
                                let m = &d.mapping_table[l.mapping_index as usize];
                                let lines: Vec<_> = l
                                    .lines
                                    .iter()
                                    .map(|ln| {
                                        let f = &d.function_table[ln.function_index as usize];
                                        let names = (s(f.name_strindex), s(f.system_name_strindex));
                                        (names, s(f.filename_strindex), f.start_line, ln.line, ln.column)
                                    })
                                    .collect();
                                format!(
                                    "{:?} {} {:#x} {lines:?} {}",
                                    (m.memory_start, m.memory_limit, m.file_offset, s(m.filename_strindex)),
                                    attrs_text(p, &m.attribute_indices),
                                    l.address,
                                    attrs_text(p, &l.attribute_indices)
                                )
                            })
                            .collect();
                        let link = &d.link_table[smp.link_index as usize];
                        out.push(format!(
                            "sample {frames:?} {:?} {} {:?} {:?}",
                            (&link.trace_id, &link.span_id),
                            attrs_text(p, &smp.attribute_indices),
                            smp.values,
                            smp.timestamps_unix_nano
                        ));
                    }
                }
            }
        }
        out
    }

    /// Interns one dead entry in every table (all with content no live entry
    /// has); they refer to each other and to live `f`, so only liveness from
    /// the samples down removes them.
    fn garbage(b: &mut ProfilesBuilder, n: u32, live_fn: i32) {
        let junk = |what: &str| format!("junk-{what}-{n}");
        b.string(&junk("string"));
        let key = b.string(&junk("key"));
        let val = b.string(&junk("value"));
        let unit = b.string(&junk("unit"));
        let attr = b.attribute_raw(key, sv(val), unit);
        let file = b.string(&junk("file"));
        let mapping =
            b.mapping(pb::Mapping { filename_strindex: file, attribute_indices: vec![attr], ..Default::default() });
        let func = b.function(&junk("fn"), &junk("sys"), &junk("src"), 7);
        let loc = b.location(pb::Location {
            mapping_index: mapping,
            address: (1 << 63) | u64::from(n),
            lines: vec![
                pb::Line { function_index: func, line: 1, column: 0 },
                pb::Line { function_index: live_fn, line: 2, column: 0 },
            ],
            attribute_indices: vec![attr],
        });
        b.stack(&[loc, 1]);
        b.link(&[0xee; 16], &n.to_le_bytes());
    }

    /// A random batch. With `junk`, dead entries are interned at random
    /// points in between; the live calls are the same either way, so the
    /// compacted batch must equal the one built without junk. Odd seeds also
    /// use string-index values.
    fn random_batch(seed: u64, junk: bool) -> Profiles {
        let strref = seed % 2 == 1;
        let mut r = Rng(seed | 1);
        let mut g = Rng(seed.rotate_left(17) | 1);
        let mut n = 0;
        let mut b = ProfilesBuilder::new();
        let mut maybe_junk = |b: &mut ProfilesBuilder| {
            if junk && g.below(4) == 0 {
                n += 1;
                let live_fn = (g.below(b.dictionary().function_table.len() as u64)) as i32;
                garbage(b, n, live_fn);
            }
        };
        let types = [("samples", "count"), ("cpu", "nanoseconds"), ("alloc", "bytes")];
        let names = ["main", "run", "poll", "read", "write", "alloc", "free", "spin"];
        for ri in 0..1 + r.below(3) {
            maybe_junk(&mut b);
            let mut attributes = vec![KeyValue {
                key: "process.pid".into(),
                value: Some(AttrValue::Int(ri as i64).to_any()),
                key_strindex: 0,
            }];
            if strref && r.below(2) == 0 {
                let (k, v) = (b.string("res.key"), b.string(&format!("res-{ri}")));
                attributes.push(KeyValue { key: String::new(), value: sv(v), key_strindex: k });
            }
            let res = b.resource(Resource { attributes, ..Default::default() });
            for _ in 0..1 + r.below(2) {
                let meta = ProfileMeta {
                    sample_type: types[r.below(3) as usize],
                    period_type: types[r.below(3) as usize],
                    period: 1,
                    ..Default::default()
                };
                let pr = b.profile(res, &meta);
                if r.below(2) == 0 {
                    let a = b.attribute("profile.kind", AttrValue::Str(names[r.below(8) as usize]));
                    b.profile_mut(pr).attribute_indices.push(a);
                }
                for t in 0..r.below(25) {
                    maybe_junk(&mut b);
                    let mut locs = Vec::new();
                    for _ in 0..1 + r.below(6) {
                        let file = b.string(["/bin/app", "/lib/libc.so"][r.below(2) as usize]);
                        let attribute_indices = match r.below(3) {
                            0 => vec![b.attribute("build.id", AttrValue::Str("abc"))],
                            _ => vec![],
                        };
                        let m = b.mapping(pb::Mapping {
                            memory_start: 0x1000,
                            memory_limit: 0x9000,
                            filename_strindex: file,
                            attribute_indices,
                            ..Default::default()
                        });
                        let lines = (0..r.below(3))
                            .map(|_| {
                                let name = names[r.below(8) as usize];
                                let f = b.function(name, &format!("_Z{name}"), "src.c", r.below(3) as i64);
                                pb::Line { function_index: f, line: r.below(50) as i64, column: r.below(2) as i64 }
                            })
                            .collect();
                        let attribute_indices = match r.below(4) {
                            0 => vec![b.attribute("frame.type", AttrValue::Str("native"))],
                            _ => vec![],
                        };
                        let address = 0x1000 + r.below(40) * 16;
                        locs.push(b.location(pb::Location { mapping_index: m, address, lines, attribute_indices }));
                        maybe_junk(&mut b);
                    }
                    let stack_index = b.stack(&locs);
                    let mut attribute_indices = vec![b.attribute("thread.id", AttrValue::Int(r.below(4) as i64))];
                    if strref && r.below(3) == 0 {
                        let (k, v) = (b.string("thread.name"), b.string(names[r.below(8) as usize]));
                        attribute_indices.push(b.attribute_raw(k, sv(v), 0));
                    }
                    if r.below(4) == 0 {
                        let (k, unit) = (b.string("wait"), b.string("ms"));
                        let v = AttrValue::Int(r.below(3) as i64).to_any();
                        attribute_indices.push(b.attribute_raw(k, Some(v), unit));
                    }
                    let link_index = match r.below(3) {
                        0 => b.link(&[r.below(4) as u8 + 1; 16], &[1; 8]),
                        _ => 0,
                    };
                    let values = vec![1 + r.below(100) as i64];
                    let smp = pb::Sample {
                        stack_index,
                        attribute_indices,
                        link_index,
                        values,
                        timestamps_unix_nano: vec![t],
                    };
                    b.sample(pr, smp);
                }
            }
        }
        maybe_junk(&mut b);
        b.build()
    }

    #[test]
    fn random_batches_compact_to_the_batch_built_without_junk() {
        let mut removed = 0;
        for seed in 0..300u64 {
            let clean = random_batch(seed, false);
            let mut p = random_batch(seed, true);
            assert_eq!(p.validate(), Ok(()), "seed {seed}");
            let (before, canon) = (resolved(&p), canonical::samples(&p));
            assert_eq!(before, resolved(&clean), "seed {seed}");
            let c = p.compact();
            removed += c.total();
            assert_eq!(p.validate(), Ok(()), "seed {seed}");
            assert_eq!(resolved(&p), before, "seed {seed}");
            assert_eq!(canonical::samples(&p), canon, "seed {seed}");
            assert_eq!(p, clean, "seed {seed}");
            assert_eq!(p.compact(), Compacted::default(), "seed {seed}: second pass");
        }
        assert!(removed > 10_000, "junk was generated: {removed}");
    }

    fn fixed_batch(junk: bool) -> Profiles {
        fixed(junk, None)
    }

    /// With `junk`, a dead entry in every table at three points; with
    /// `dead_first`, one dead entry in that table before everything else.
    fn fixed(junk: bool, dead_first: Option<usize>) -> Profiles {
        let mut b = ProfilesBuilder::new();
        if let Some(k) = dead_first {
            one_dead(&mut b, k);
        }
        let (k, v) = (b.string("res.key"), b.string("res.value"));
        let res = KeyValue { key: String::new(), value: sv(v), key_strindex: k };
        let r = b.resource(Resource { attributes: vec![res], ..Default::default() });
        let p = b.profile(r, &ProfileMeta { sample_type: ("samples", "count"), ..Default::default() });
        if junk {
            garbage(&mut b, 1, 0);
        }
        let pa = b.attribute("profile.kind", AttrValue::Str("cpu"));
        b.profile_mut(p).attribute_indices.push(pa);
        let f = b.function("main", "main", "a.c", 1);
        let file = b.string("/bin/a");
        let m = b.mapping(pb::Mapping { filename_strindex: file, ..Default::default() });
        let l1 = b.location(pb::Location {
            mapping_index: m,
            lines: vec![pb::Line { function_index: f, line: 3, column: 0 }],
            ..Default::default()
        });
        if junk {
            garbage(&mut b, 2, f);
        }
        let l2 = b.location(pb::Location { mapping_index: m, address: 0x10, ..Default::default() });
        let st = b.stack(&[l1, l2]);
        let a = b.attribute("thread.id", AttrValue::Int(1));
        let link = b.link(&[1; 16], &[2; 8]);
        if junk {
            garbage(&mut b, 3, f);
        }
        b.sample(
            p,
            pb::Sample {
                stack_index: st,
                attribute_indices: vec![a],
                link_index: link,
                values: vec![1],
                timestamps_unix_nano: vec![5],
            },
        );
        let (k, v) = (b.string("scope.key"), b.string("scope.value"));
        let mut out = b.build();
        let attributes = vec![KeyValue { key: String::new(), value: sv(v), key_strindex: k }];
        let scope = InstrumentationScope { name: "s".into(), attributes, ..Default::default() };
        out.0.resource_profiles[0].scope_profiles[0].scope = Some(scope);
        out
    }

    #[test]
    fn dead_entries_in_every_table_are_removed() {
        let mut p = fixed_batch(true);
        let before = p.table_sizes();
        let canon = canonical::samples(&p);
        let c = p.compact();
        // Per garbage() call: 8 strings and one entry in every other table.
        let want =
            Compacted { strings: 24, attributes: 3, mappings: 3, functions: 3, locations: 3, stacks: 3, links: 3 };
        assert_eq!(c, want);
        let after = p.table_sizes();
        let removed = [c.strings, c.attributes, c.mappings, c.functions, c.locations, c.stacks, c.links];
        for k in 0..7 {
            assert_eq!(after[k], before[k] - removed[k], "table {k}");
        }
        assert_eq!(p.validate(), Ok(()));
        assert_eq!(canonical::samples(&p), canon);
        assert_eq!(p, fixed_batch(false));
    }

    #[test]
    fn nothing_dead_is_unchanged_byte_for_byte() {
        let mut p = fixed_batch(false);
        let bytes = p.encode_to_vec();
        assert_eq!(p.compact(), Compacted::default());
        assert_eq!(p.encode_to_vec(), bytes);
        let mut p = random_batch(7, false);
        let bytes = p.encode_to_vec();
        assert_eq!(p.compact(), Compacted::default());
        assert_eq!(p.encode_to_vec(), bytes);
    }

    #[test]
    fn dead_entries_only_at_the_end_need_no_renumbering() {
        let clean = fixed_batch(false);
        let mut b = ProfilesBuilder::from_profiles(clean.clone());
        garbage(&mut b, 9, 1);
        let mut p = b.build();
        assert_eq!(p.compact().total(), 14);
        assert_eq!(p, clean);
    }

    /// Interns one dead entry in table `k` only (tables in `sizes` order).
    fn one_dead(b: &mut ProfilesBuilder, k: usize) {
        match k {
            0 => drop(b.string("junk")),
            1 => drop(b.attribute_raw(0, Some(AttrValue::Int(77).to_any()), 0)),
            2 => drop(b.mapping(pb::Mapping { memory_start: 77, ..Default::default() })),
            3 => drop(b.function_raw(pb::Function { start_line: 77, ..Default::default() })),
            4 => drop(b.location(pb::Location { address: 77, ..Default::default() })),
            5 => drop(b.stack(&[0, 0, 0])),
            _ => drop(b.link(&[9; 16], &[9; 8])),
        }
    }

    #[test]
    fn a_single_renumbered_table_rewrites_all_its_references() {
        let clean = fixed_batch(false);
        for k in 0..7 {
            let mut p = fixed(false, Some(k));
            let before = resolved(&p);
            assert_eq!(p.compact().total(), 1, "table {k}");
            assert_eq!(resolved(&p), before, "table {k}");
            assert_eq!(p, clean, "table {k}");
        }
    }

    #[test]
    fn string_index_values_are_kept_and_renumbered() {
        let mut b = ProfilesBuilder::new();
        for n in 0..3 {
            b.string(&format!("dead-{n}"));
        }
        let (k, v, nk) = (b.string("k"), b.string("v"), b.string("nested"));
        use opentelemetry_proto::tonic::common::v1::{ArrayValue, KeyValueList};
        let array = AnyValue { value: Some(Value::ArrayValue(ArrayValue { values: vec![sv(v).unwrap()] })) };
        let kv = KeyValue { key: String::new(), value: Some(array), key_strindex: nk };
        let nested = AnyValue { value: Some(Value::KvlistValue(KeyValueList { values: vec![kv] })) };
        let a = b.attribute_raw(k, Some(nested), 0);
        let rk = b.string("rk");
        let r = b.resource(Resource {
            attributes: vec![KeyValue { key: String::new(), value: sv(rk), key_strindex: rk }],
            ..Default::default()
        });
        let pr = b.profile(r, &ProfileMeta::default());
        b.sample(pr, pb::Sample { attribute_indices: vec![a], ..Default::default() });
        let mut p = b.build();
        let before = resolved(&p);
        assert_eq!(p.compact().strings, 3);
        assert_eq!(resolved(&p), before);
        assert_eq!(p.dictionary().unwrap().string_table, ["", "k", "v", "nested", "rk"]);
    }

    #[test]
    fn invalid_or_absent_dictionaries_are_left_alone() {
        let mut p = fixed_batch(true);
        p.0.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].stack_index = 999;
        let copy = p.clone();
        assert_eq!(p.compact(), Compacted::default());
        assert_eq!(p, copy);
        p.0.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].link_index = -1;
        assert_eq!(p.compact(), Compacted::default());
        let mut none = Profiles::default();
        assert_eq!(none.compact(), Compacted::default());
        // Absent tables: references to the implied zero entries are fine.
        let mut p = fixed_batch(false);
        let d = p.0.dictionary.as_mut().unwrap();
        d.link_table.clear();
        p.0.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].link_index = 0;
        p.0.dictionary.as_mut().unwrap().string_table.push("dead".into());
        assert_eq!(p.compact().strings, 1);
        assert_eq!(p.validate(), Ok(()));
    }
}
