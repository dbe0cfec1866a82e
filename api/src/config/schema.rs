//! Schema pieces for field types whose serde form differs from their Rust
//! type, used as `#[schemars(with = "...")]` on config fields.
//!
//! ```ignore
//! #[serde(with = "humantime_serde")]
//! #[schemars(with = "profcol_api::config::schema::DurationText")]
//! pub timeout: Duration,
//! ```

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use std::borrow::Cow;

/// A duration written as text: `200ms`, `5s`, `1m30s`, `0s`.
pub struct DurationText;

/// The pattern durations must match (humantime's units).
pub(crate) const DURATION_PATTERN: &str = r"^\s*([0-9]+\s*(nsec|ns|usec|us|µs|msec|ms|seconds|second|sec|s|minutes|minute|min|m|hours|hour|hr|h|days|day|d|weeks|week|w|months|month|M|years|year|y)\s*)+$";

impl JsonSchema for DurationText {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
            "description": "A duration: numbers with units (ns, us, ms, s, m, h, d), e.g. 200ms, 5s, 1m30s."
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn duration_pattern_accepts_what_humantime_parses() {
        let re_ok = ["5s", "200ms", "1m30s", "0s", "1h 2m", "10 s", "3d"];
        for d in re_ok {
            assert!(humantime_like(d), "{d}");
        }
    }

    // The pattern is for editors; humantime is the authority. Spot-check that
    // the strings accepted above are also humantime's.
    fn humantime_like(s: &str) -> bool {
        #[derive(serde::Deserialize)]
        struct D(
            #[serde(with = "humantime_serde")]
            #[allow(dead_code)]
            std::time::Duration,
        );
        serde_json::from_value::<D>(serde_json::Value::String(s.into())).is_ok()
    }
}
