//! What a Sample counts ("samples" everywhere means observations).

use crate::lookup::str_at;
use crate::pb;

/// Whether `p`'s sample type counts events (unit `count`, as in
/// `samples/count` or `calls/count`): then a value is a number of observations.
pub fn profile_counts_events(p: &pb::Profile, strings: &[String]) -> bool {
    p.sample_type.is_some_and(|t| str_at(strings, t.unit_strindex) == "count")
}

/// A Sample's observations. Where the sample type counts events
/// (`counts_events`), the sum of its values, or the number of its timestamps
/// when it has no values; for any other unit (e.g. nanoseconds), its number
/// of data points (values, else timestamps). A Sample with neither counts 1.
/// Negative values count 0; never a sum of nanoseconds.
pub fn observations(s: &pb::Sample, counts_events: bool) -> u64 {
    if counts_events && !s.values.is_empty() {
        return s.values.iter().fold(0u64, |n, &v| n.saturating_add(v.max(0) as u64));
    }
    match (s.values.len(), s.timestamps_unix_nano.len()) {
        (0, 0) => 1,
        (0, t) => t as u64,
        (v, _) => v as u64,
    }
}
