//! The spec's invariants, checked by the host on every batch that comes
//! from outside (receivers, plugins) and by the plugin SDK's harness on a
//! plugin's output, so both sides apply the same rules.

use crate::pb;

/// A batch that breaks an invariant: what is wrong and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidProfiles {
    /// Where, e.g. `resource_profiles[0].scope_profiles[0].profiles[2].samples[7].stack_index`.
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for InvalidProfiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid profiles: {}: {}", self.path, self.message)
    }
}

impl std::error::Error for InvalidProfiles {}

fn err(path: impl Into<String>, message: impl Into<String>) -> InvalidProfiles {
    InvalidProfiles { path: path.into(), message: message.into() }
}

fn check_idx(i: i32, len: usize, path: impl FnOnce() -> String, table: &str) -> Result<(), InvalidProfiles> {
    // An absent table still has its implied zero entry.
    if i < 0 || i as usize >= len.max(1) {
        return Err(err(path(), format!("index {i} out of range of {table} ({len} entries)")));
    }
    Ok(())
}

fn check_all(v: &[i32], len: usize, path: impl Fn() -> String, table: &str) -> Result<(), InvalidProfiles> {
    for (k, &i) in v.iter().enumerate() {
        check_idx(i, len, || format!("{}[{k}]", path()), table)?;
    }
    Ok(())
}

/// Checks every index against its table, string 0 and entry 0 of every table,
/// and the lengths of values and timestamps.
pub fn validate(data: &pb::ProfilesData) -> Result<(), InvalidProfiles> {
    let empty = pb::ProfilesDictionary::default();
    let d = data.dictionary.as_ref().unwrap_or(&empty);
    validate_dictionary(d)?;
    for (r, rp) in data.resource_profiles.iter().enumerate() {
        for (s, sp) in rp.scope_profiles.iter().enumerate() {
            for (p, prof) in sp.profiles.iter().enumerate() {
                validate_profile(d, prof, &|| format!("resource_profiles[{r}].scope_profiles[{s}].profiles[{p}]"))?;
            }
        }
    }
    Ok(())
}

/// The dictionary's invariants (what every profile relies on).
fn validate_dictionary(d: &pb::ProfilesDictionary) -> Result<(), InvalidProfiles> {
    let ns = d.string_table.len();
    if let Some(s0) = d.string_table.first() {
        if !s0.is_empty() {
            return Err(err("dictionary.string_table[0]", "must be the empty string"));
        }
    }
    macro_rules! zero_first {
        ($t:ident) => {
            if let Some(first) = d.$t.first() {
                if *first != Default::default() {
                    return Err(err(concat!("dictionary.", stringify!($t), "[0]"), "must be the zero value"));
                }
            }
        };
    }
    zero_first!(mapping_table);
    zero_first!(location_table);
    zero_first!(function_table);
    zero_first!(link_table);
    zero_first!(attribute_table);
    zero_first!(stack_table);
    let na = d.attribute_table.len();
    for (i, kv) in d.attribute_table.iter().enumerate() {
        check_idx(kv.key_strindex, ns, || format!("dictionary.attribute_table[{i}].key_strindex"), "string_table")?;
        check_idx(kv.unit_strindex, ns, || format!("dictionary.attribute_table[{i}].unit_strindex"), "string_table")?;
    }
    for (i, m) in d.mapping_table.iter().enumerate() {
        check_idx(
            m.filename_strindex,
            ns,
            || format!("dictionary.mapping_table[{i}].filename_strindex"),
            "string_table",
        )?;
        check_all(
            &m.attribute_indices,
            na,
            || format!("dictionary.mapping_table[{i}].attribute_indices"),
            "attribute_table",
        )?;
    }
    for (i, f) in d.function_table.iter().enumerate() {
        let p = |field: &str| format!("dictionary.function_table[{i}].{field}");
        check_idx(f.name_strindex, ns, || p("name_strindex"), "string_table")?;
        check_idx(f.system_name_strindex, ns, || p("system_name_strindex"), "string_table")?;
        check_idx(f.filename_strindex, ns, || p("filename_strindex"), "string_table")?;
    }
    let (nm, nf) = (d.mapping_table.len(), d.function_table.len());
    for (i, l) in d.location_table.iter().enumerate() {
        check_idx(l.mapping_index, nm, || format!("dictionary.location_table[{i}].mapping_index"), "mapping_table")?;
        for (k, ln) in l.lines.iter().enumerate() {
            check_idx(
                ln.function_index,
                nf,
                || format!("dictionary.location_table[{i}].lines[{k}].function_index"),
                "function_table",
            )?;
        }
        check_all(
            &l.attribute_indices,
            na,
            || format!("dictionary.location_table[{i}].attribute_indices"),
            "attribute_table",
        )?;
    }
    let nl = d.location_table.len();
    for (i, s) in d.stack_table.iter().enumerate() {
        check_all(
            &s.location_indices,
            nl,
            || format!("dictionary.stack_table[{i}].location_indices"),
            "location_table",
        )?;
    }
    Ok(())
}

/// One profile's invariants against a valid dictionary `d`; `base` names it.
fn validate_profile(
    d: &pb::ProfilesDictionary,
    prof: &pb::Profile,
    base: &dyn Fn() -> String,
) -> Result<(), InvalidProfiles> {
    let (ns, na) = (d.string_table.len(), d.attribute_table.len());
    for (name, vt) in [("sample_type", &prof.sample_type), ("period_type", &prof.period_type)] {
        if let Some(vt) = vt {
            check_idx(vt.type_strindex, ns, || format!("{}.{name}.type_strindex", base()), "string_table")?;
            check_idx(vt.unit_strindex, ns, || format!("{}.{name}.unit_strindex", base()), "string_table")?;
        }
    }
    check_all(&prof.attribute_indices, na, || format!("{}.attribute_indices", base()), "attribute_table")?;
    for (k, smp) in prof.samples.iter().enumerate() {
        validate_sample(d, smp, || format!("{}.samples[{k}]", base()))?;
    }
    Ok(())
}

/// One Sample's invariants against a valid dictionary `d`; `at` names it.
/// Inlined: it runs once per sample of every batch from outside.
#[inline]
fn validate_sample(
    d: &pb::ProfilesDictionary,
    smp: &pb::Sample,
    at: impl Fn() -> String,
) -> Result<(), InvalidProfiles> {
    let (na, nst, nlk) = (d.attribute_table.len(), d.stack_table.len(), d.link_table.len());
    check_idx(smp.stack_index, nst, || format!("{}.stack_index", at()), "stack_table")?;
    check_idx(smp.link_index, nlk, || format!("{}.link_index", at()), "link_table")?;
    check_all(&smp.attribute_indices, na, || format!("{}.attribute_indices", at()), "attribute_table")?;
    if !smp.values.is_empty()
        && !smp.timestamps_unix_nano.is_empty()
        && smp.values.len() != smp.timestamps_unix_nano.len()
    {
        return Err(err(
            at(),
            format!(
                "values ({}) and timestamps_unix_nano ({}) must have equal length when both are set",
                smp.values.len(),
                smp.timestamps_unix_nano.len()
            ),
        ));
    }
    Ok(())
}

/// What [`drop_invalid_profiles`] took out of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedProfiles {
    pub profiles: u64,
    pub samples: u64,
    /// The first problem found, with its path in the batch as it came.
    pub first: InvalidProfiles,
}

/// Removes the profiles that break an invariant, keeping the rest (for a
/// receiver that accepts a request in part). `Ok(None)`: nothing was wrong.
/// An invalid dictionary spoils every profile: `Err`, nothing removed.
pub fn drop_invalid_profiles(data: &mut pb::ProfilesData) -> Result<Option<DroppedProfiles>, InvalidProfiles> {
    let empty = pb::ProfilesDictionary::default();
    let d = data.dictionary.as_ref().unwrap_or(&empty);
    validate_dictionary(d)?;
    let mut dropped: Option<DroppedProfiles> = None;
    for (r, rp) in data.resource_profiles.iter_mut().enumerate() {
        for (s, sp) in rp.scope_profiles.iter_mut().enumerate() {
            let mut p = 0;
            sp.profiles.retain(|prof| {
                let at = p;
                p += 1;
                let base = || format!("resource_profiles[{r}].scope_profiles[{s}].profiles[{at}]");
                match validate_profile(d, prof, &base) {
                    Ok(()) => true,
                    Err(e) => {
                        let x = dropped.get_or_insert(DroppedProfiles { profiles: 0, samples: 0, first: e });
                        x.profiles += 1;
                        // Counted in observations, as every count of samples.
                        let counts_events = crate::observations::profile_counts_events(prof, &d.string_table);
                        let n = prof.samples.iter().map(|s| crate::observations::observations(s, counts_events));
                        x.samples = n.fold(x.samples, u64::saturating_add);
                        false
                    }
                }
            });
        }
    }
    Ok(dropped)
}
