//! Splitting a batch's samples into groups (`group_by: none | process |
//! container`) and naming report files; shared by `pprof` and `flamegraph`.

use profcol_api::model::view::SampleView;
use profcol_api::model::{any_value, keys, AnyValue};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// `group_by`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum GroupBy {
    /// One report per batch.
    #[default]
    None,
    /// One report per process (`process.pid`).
    Process,
    /// One report per container (`container.id`; samples outside containers go to `host`).
    Container,
}

/// An attribute value as text (the rule folded stacks use for their roots).
fn show(v: &AnyValue) -> Option<Cow<'_, str>> {
    profcol_model_rules::folded::value_text(v)
}

/// Attribute `key` of the sample, else of its resource: the first with a
/// value that reads as text or a number.
fn attr_value<'a>(s: &SampleView<'a>, key: &str) -> Option<&'a AnyValue> {
    let readable = |v: &&AnyValue| show(v).is_some();
    s.attributes().find(|(k, _)| *k == key).and_then(|(_, v)| v).filter(readable).or_else(|| {
        s.resource.and_then(|r| r.attributes.iter().find(|kv| kv.key == key)?.value.as_ref()).filter(readable)
    })
}

/// Attribute `key` of the sample, else of its resource, as text (borrowed
/// when it is a string: this runs per sample).
pub fn attr<'a>(s: &SampleView<'a>, key: &str) -> Option<Cow<'a, str>> {
    attr_value(s, key).and_then(show)
}

/// Integer attribute `key` of the sample, else of its resource.
pub fn attr_int(s: &SampleView<'_>, key: &str) -> Option<i64> {
    match attr_value(s, key)?.value.as_ref()? {
        any_value::Value::IntValue(i) => Some(*i),
        any_value::Value::StringValue(v) => v.parse().ok(),
        _ => None,
    }
}

/// Most groups a batch is split into; the samples of further groups go to
/// [`OVERFLOW_GROUP`] (a pprof report still tells their processes apart by
/// the `pid` label), so that a batch of many processes or containers cannot
/// make a report (and its memory) per sample.
pub const MAX_GROUPS: usize = 1024;

/// The group of every sample with `group_by: none`.
pub const ALL_GROUP: &str = "all";

/// The group of the samples past [`MAX_GROUPS`].
pub const OVERFLOW_GROUP: &str = "other";

/// Longest process id kept in a group name (which is part of a file name).
const MAX_PID_CHARS: usize = 64;

/// `group`, or [`OVERFLOW_GROUP`] when `groups` already holds [`MAX_GROUPS`]
/// other groups.
pub fn bounded_group<V>(groups: &std::collections::BTreeMap<String, V>, group: String) -> String {
    if groups.len() < MAX_GROUPS || groups.contains_key(&group) {
        group
    } else {
        OVERFLOW_GROUP.into()
    }
}

/// The first `n` characters of `s`, made safe for a file name.
fn clipped(s: &str, n: usize) -> String {
    sanitize(&s.chars().take(n).collect::<String>())
}

/// The group a sample belongs to, as it appears in file names.
pub fn group_of(s: &SampleView<'_>, by: GroupBy) -> String {
    match by {
        GroupBy::None => ALL_GROUP.into(),
        GroupBy::Process => match attr(s, keys::PROCESS_PID) {
            Some(pid) => format!("pid-{}", clipped(&pid, MAX_PID_CHARS)),
            None => "pid-unknown".into(),
        },
        GroupBy::Container => match attr(s, keys::CONTAINER_ID) {
            Some(c) => format!("container-{}", clipped(&c, 24)),
            None => "host".into(),
        },
    }
}

/// Keeps `[A-Za-z0-9._-]`, replaces the rest: safe in a file name.
pub fn sanitize(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect()
}

/// `YYYYmmddTHHMMSSZ` of a unix time in nanoseconds (UTC).
pub fn timestamp(unix_nanos: u64) -> String {
    let secs = (unix_nanos / 1_000_000_000) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil from days (Howard Hinnant).
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The batch's time range (earliest profile start, latest profile end) in
/// unix nanoseconds, or now when the batch carries no times.
pub fn time_range(batch: &profcol_api::Profiles) -> (u64, u64) {
    let mut lo = u64::MAX;
    let mut hi = 0u64;
    for p in batch.profiles() {
        if p.time_unix_nano > 0 {
            lo = lo.min(p.time_unix_nano);
            hi = hi.max(p.time_unix_nano.saturating_add(p.duration_nano));
        }
    }
    if lo == u64::MAX {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        return (now, now);
    }
    (lo, hi.max(lo))
}

/// A path in `dir` named `{prefix}-{time}-{group}.{ext}` that does not exist yet.
pub fn unique_path(dir: &std::path::Path, prefix: &str, t: u64, group: &str, ext: &str) -> std::path::PathBuf {
    let base = format!("{prefix}-{}-{group}", timestamp(t));
    let mut p = dir.join(format!("{base}.{ext}"));
    let mut n = 1;
    while p.exists() {
        p = dir.join(format!("{base}-{n}.{ext}"));
        n += 1;
    }
    p
}

/// Reports delivered lately, by a hash of their content, so that the host's
/// retry of a batch whose export failed part-way (group 3 of 5, say) does not
/// write or push the groups that already went out a second time. A report's
/// bytes are a deterministic function of its batch and group, so the same
/// content means the same report; bounded to the last [`Delivered::CAPACITY`].
#[derive(Default)]
pub struct Delivered(std::sync::Mutex<(std::collections::VecDeque<u64>, std::collections::HashSet<u64>)>);

impl Delivered {
    pub const CAPACITY: usize = 4096;

    /// The key of a report: its group and content (in parts, so content
    /// spread over many buffers needs no joined copy).
    pub fn key<'a>(group: &str, content: impl IntoIterator<Item = &'a [u8]>) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        group.hash(&mut h);
        for part in content {
            part.hash(&mut h);
        }
        h.finish()
    }

    pub fn contains(&self, key: u64) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).1.contains(&key)
    }

    pub fn insert(&self, key: u64) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (order, set) = &mut *g;
        if set.insert(key) {
            order.push_back(key);
            if order.len() > Self::CAPACITY {
                if let Some(old) = order.pop_front() {
                    set.remove(&old);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_and_names() {
        assert_eq!(timestamp(0), "19700101T000000Z");
        assert_eq!(timestamp(1_700_000_000_000_000_000), "20231114T221320Z");
        assert_eq!(sanitize("a/b c"), "a_b_c");
    }
}
