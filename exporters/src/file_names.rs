//! What report files are named: `{prefix}-{YYYYmmddTHHMMSSZ}-{group}.{ext}`,
//! made of the batch's time and safe characters only; shared by `pprof` and
//! `flamegraph`.

/// Keeps `[A-Za-z0-9._-]`, replaces the rest: safe in a file name.
pub(crate) fn sanitize(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect()
}

/// `YYYYmmddTHHMMSSZ` of a unix time in nanoseconds (UTC).
pub(crate) fn timestamp(unix_nanos: u64) -> String {
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
pub(crate) fn time_range(batch: &profcol_api::Profiles) -> (u64, u64) {
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
pub(crate) fn unique_path(dir: &std::path::Path, prefix: &str, t: u64, group: &str, ext: &str) -> std::path::PathBuf {
    let base = format!("{prefix}-{}-{group}", timestamp(t));
    let mut p = dir.join(format!("{base}.{ext}"));
    let mut n = 1;
    while p.exists() {
        p = dir.join(format!("{base}-{n}.{ext}"));
        n += 1;
    }
    p
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
