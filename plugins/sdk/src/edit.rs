//! Changing a batch in place. Each edit works on the dictionary's tables
//! (a frame is judged once per location, a stack rewritten once), then points
//! the samples at the new entries; what the batch no longer uses stays in
//! the dictionary (the host compacts it), so indices never dangle.

use crate::intern::Interner;
use crate::pb::common::KeyValue;
use crate::value::Value;
use crate::view::{get, Frame};
use crate::Batch;

/// What [`Batch::retain_frames`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retained {
    /// Frames removed, summed over samples.
    pub frames_removed: u64,
    /// Samples dropped because no frame was left.
    pub samples_dropped: u64,
}

/// What a stack becomes.
#[derive(Clone, Copy)]
enum NewStack {
    Unchanged,
    Empty,
    Index(i32, u64),
}

impl Batch {
    /// Keeps the frames for which `keep` is true (asked once per distinct
    /// frame). A sample that had frames and has none left is dropped; a
    /// sample that had none to begin with stays.
    pub fn retain_frames(&mut self, mut keep: impl FnMut(&Frame<'_>) -> bool) -> Retained {
        let Some(dict) = self.0.dictionary.take() else { return Retained::default() };
        // Per location: kept? (None = not asked yet.)
        let mut kept: Vec<Option<bool>> = vec![None; dict.location_table.len()];
        // Per stack: its kept locations, for the stacks that change.
        let mut changed: Vec<Option<Option<Vec<i32>>>> = vec![None; dict.stack_table.len()];
        for s in self
            .0
            .resource_profiles
            .iter()
            .flat_map(|r| &r.scope_profiles)
            .flat_map(|s| &s.profiles)
            .flat_map(|p| &p.samples)
        {
            let Some(slot) = usize::try_from(s.stack_index).ok().and_then(|i| changed.get_mut(i)) else { continue };
            if slot.is_some() {
                continue;
            }
            let locations = &dict.stack_table[s.stack_index as usize].location_indices;
            let mut keep_loc = |l: i32| -> bool {
                let Some(k) = usize::try_from(l).ok().and_then(|i| kept.get_mut(i)) else { return true };
                *k.get_or_insert_with(|| match get(&dict.location_table, l) {
                    Some(location) => keep(&Frame { location, dict: &dict }),
                    None => true,
                })
            };
            let new: Vec<i32> = locations.iter().copied().filter(|&l| keep_loc(l)).collect();
            *slot = Some(if new.len() == locations.len() { None } else { Some(new) });
        }
        let mut interner = Interner::new(dict);
        let new_stacks: Vec<NewStack> = changed
            .into_iter()
            .enumerate()
            .map(|(i, c)| match c {
                Some(Some(new)) if new.is_empty() => NewStack::Empty,
                Some(Some(new)) => {
                    let before = interner.dict.stack_table[i].location_indices.len();
                    NewStack::Index(interner.stack(&new), (before - new.len()) as u64)
                }
                _ => NewStack::Unchanged,
            })
            .collect();
        let dict = interner.dict;
        let mut out = Retained::default();
        for p in self.0.resource_profiles.iter_mut().flat_map(|r| &mut r.scope_profiles).flat_map(|s| &mut s.profiles) {
            p.samples.retain_mut(|s| match usize::try_from(s.stack_index).ok().and_then(|i| new_stacks.get(i)) {
                Some(NewStack::Empty) => {
                    out.frames_removed += dict.stack_table[s.stack_index as usize].location_indices.len() as u64;
                    out.samples_dropped += 1;
                    false
                }
                Some(&NewStack::Index(i, removed)) => {
                    out.frames_removed += removed;
                    s.stack_index = i;
                    true
                }
                _ => true,
            });
        }
        self.0.dictionary = Some(dict);
        out
    }

    /// Keeps the samples for which `keep` is true; returns how many were dropped.
    pub fn retain_samples(&mut self, mut keep: impl FnMut(&crate::Sample<'_>) -> bool) -> u64 {
        let dict = self.0.dictionary.take().unwrap_or_default();
        let mut dropped = 0;
        for rp in &mut self.0.resource_profiles {
            let resource = rp.resource.as_ref();
            for p in rp.scope_profiles.iter_mut().flat_map(|s| &mut s.profiles) {
                let mut samples = std::mem::take(&mut p.samples);
                samples.retain(|raw| {
                    let k = keep(&crate::Sample { resource, profile: p, raw, dict: &dict });
                    dropped += u64::from(!k);
                    k
                });
                p.samples = samples;
            }
        }
        self.0.dictionary = Some(dict);
        dropped
    }

    /// Sets resource attribute `key` to `value` on every resource of the
    /// batch (replacing a value it had).
    pub fn set_resource_attribute(&mut self, key: &str, value: Value<'_>) {
        for rp in &mut self.0.resource_profiles {
            let attrs = &mut rp.resource.get_or_insert_with(Default::default).attributes;
            let kv = KeyValue { key: key.to_owned(), value: Some(value.to_any()), ..Default::default() };
            // A key given by string-table reference counts as the same key.
            let strings = self.0.dictionary.as_ref().map(|d| d.string_table.as_slice()).unwrap_or(&[]);
            let same = |a: &KeyValue| {
                a.key == key
                    || (a.key.is_empty() && crate::view::str_at(strings, a.key_strindex) == key && a.key_strindex != 0)
            };
            match attrs.iter().position(same) {
                Some(i) => {
                    attrs[i] = kv;
                    // Later duplicates of the key would contradict the new value.
                    let mut n = 0;
                    attrs.retain(|a| {
                        n += 1;
                        n <= i + 1 || !same(a)
                    });
                }
                None => attrs.push(kv),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::harness::cpu_batch;
    use crate::Value;

    fn stacks(b: &crate::Batch) -> Vec<Vec<String>> {
        b.samples().map(|s| s.frames().map(|f| f.function_name().unwrap_or("?").to_owned()).collect()).collect()
    }

    #[test]
    fn retain_frames_asks_once_per_location_and_drops_emptied_samples() {
        let mut b = cpu_batch();
        let before = stacks(&b);
        let mut asked = Vec::new();
        let r = b.retain_frames(|f| {
            asked.push(f.address());
            !matches!(f.function_name(), Some("main" | "do_syscall_64"))
        });
        assert_eq!(b.validate(), Ok(()));
        let locations = b.dictionary().location_table.len() - 1;
        assert_eq!(asked.len(), locations, "each location judged once");
        let gone = |n: &String| matches!(n.as_str(), "main" | "do_syscall_64");
        let expected: Vec<Vec<String>> = before
            .iter()
            .filter(|s| s.is_empty() || s.iter().any(|n| !gone(n)))
            .map(|s| s.iter().filter(|n| !gone(n)).cloned().collect())
            .collect();
        assert_eq!(stacks(&b), expected);
        assert_eq!(r.samples_dropped, 1);
        let removed = before.iter().flatten().filter(|n| gone(n)).count();
        assert_eq!(r.frames_removed, removed as u64);
    }

    #[test]
    fn keeping_every_frame_changes_nothing() {
        let mut b = cpu_batch();
        let r = b.retain_frames(|_| true);
        assert_eq!(r, super::Retained::default());
        assert_eq!(b, cpu_batch());
    }

    #[test]
    fn retain_samples_by_attribute() {
        let mut b = cpu_batch();
        let dropped = b.retain_samples(|s| s.attribute("process.pid") != Some(Value::Int(200)));
        assert_eq!(dropped, 2);
        assert_eq!(b.sample_count(), 5);
        assert_eq!(b.validate(), Ok(()));
    }

    #[test]
    fn set_resource_attribute_replaces_or_adds() {
        let mut b = cpu_batch();
        b.set_resource_attribute("service.name", Value::Str("renamed"));
        b.set_resource_attribute("deployment.environment", Value::Str("prod"));
        for s in b.samples() {
            assert_eq!(s.resource_attribute("service.name"), Some(Value::Str("renamed")));
            assert_eq!(s.resource_attribute("deployment.environment"), Some(Value::Str("prod")));
        }
        let keys: Vec<_> =
            b.0.resource_profiles[0].resource.as_ref().unwrap().attributes.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(keys, ["host.name", "service.name", "deployment.environment"]);
        assert_eq!(b.validate(), Ok(()));
    }
}
