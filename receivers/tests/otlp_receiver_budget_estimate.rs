//! The decode budget's estimates (`model::decode_budget`, what the otlp
//! receiver checks against `max_decoded_size_mib`) against the peak heap the
//! decode really holds, measured with a counting allocator, for real batches
//! and hostile shapes. A test binary of its own: the allocator counts the
//! whole process, so nothing else may run beside a measurement.

use profcol_api::model::decode_budget::{json_decoded_size, proto_decoded_size, BudgetError};
use profcol_api::model::ExportProfilesServiceRequest;
use profcol_api::Profiles;
use profcol_testkit::hostile::{delimited, expansion_request, json_expansion_request};
use profcol_testkit::prelude::*;
use prost::Message;

#[global_allocator]
static ALLOC: profcol_testkit::alloc::Counting = profcol_testkit::alloc::Counting;

/// Serialises the allocator measurements (tests run on threads of one process).
static MEASURE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One test at a time: the allocator counts every thread, so a test
/// allocating or freeing beside a measurement would skew it.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    MEASURE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Peak heap bytes held while `f` runs, above what was live before (call
/// under [`alone`]).
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = profcol_testkit::alloc::live();
    profcol_testkit::alloc::reset_peak();
    let out = f();
    (out, (profcol_testkit::alloc::peak() - before).max(0) as usize)
}

fn hand_made(parts: &[(u32, &[u8])]) -> Vec<u8> {
    parts.iter().flat_map(|(tag, payload)| delimited(*tag, payload)).collect()
}

/// Protobuf requests: real batches and shapes that expand.
fn proto_cases() -> Vec<(&'static str, Vec<u8>)> {
    let repeat = |unit: &[u8], n: usize| unit.repeat(n);
    // dictionary(2) { stack_table(7): empty Stack × n }
    let empty_stacks = hand_made(&[(2, &repeat(&[7 << 3 | 2, 0], 500_000))]);
    // dictionary(2) { string_table(5): one-byte strings × n }
    let tiny_strings = hand_made(&[(2, &repeat(&[5 << 3 | 2, 1, b'x'], 300_000))]);
    // dictionary(2) { location_table(2): Location { lines(3): empty Line } × n }
    let lines = hand_made(&[(2, &repeat(&[2 << 3 | 2, 2, 3 << 3 | 2, 0], 250_000))]);
    // Samples each with one packed value and one timestamp.
    let mut sample = vec![2 << 3 | 2, 13, 4 << 3 | 2, 1, 1, 5 << 3 | 2, 8];
    sample.extend_from_slice(&[1; 8]);
    let one_valued = hand_made(&[(1, &hand_made(&[(2, &hand_made(&[(2, &repeat(&sample, 100_000))]))]))]);
    // dictionary(2) { attribute_table(6): KeyValueAndUnit { value(2): AnyValue { array(5): ArrayValue { AnyValue × n } } } }
    let array = hand_made(&[(1, &[])]).repeat(200_000);
    let any = hand_made(&[(5, &array)]);
    let kvu = hand_made(&[(2, &any)]);
    let nested_array = hand_made(&[(2, &hand_made(&[(6, &kvu)]))]);
    // Just past a growth: the vector has twice the room it needs.
    let past_growth = expansion_request(2 * ((1 << 18) + 1) + 16);
    vec![
        ("empty samples just past a growth", past_growth),
        ("random batch", random_batch(7, 5, 20_000, 2_000, 24).encode_to_vec()),
        ("cpu batch", cpu_batch(3, 20, 500).encode_to_vec()),
        ("empty samples", expansion_request(3_000_000)),
        ("empty stacks", empty_stacks),
        ("one-byte strings", tiny_strings),
        ("locations with an empty line", lines),
        ("one-valued samples", one_valued),
        ("a long attribute array", nested_array),
    ]
}

#[test]
fn the_proto_estimate_covers_the_decode_peak() {
    let _one = alone();
    for (name, wire) in proto_cases() {
        let est = proto_decoded_size(&wire, usize::MAX).unwrap_or_else(|e| panic!("{name}: {e}"));
        // The receiver's decode (vectors sized exactly); prost's own (grown
        // push by push) is shown beside it.
        let (decoded, peak) = peak_of(|| Profiles::decode(&wire[..]).unwrap());
        let held = decoded.memory_size();
        drop(decoded);
        let (_, prost_peak) = peak_of(|| ExportProfilesServiceRequest::decode(&wire[..]).unwrap());
        eprintln!(
            "{name}: wire {} B, estimate {est} B ({:.1}× wire), decode peak {peak} B (prost's {prost_peak} B), held {held} B",
            wire.len(),
            est as f64 / wire.len() as f64
        );
        assert!(est >= peak, "{name}: estimate {est} below the decode's peak {peak}");
        assert!(est <= peak * 3 + 4096, "{name}: estimate {est} far above the decode's peak {peak}");
    }
}

#[test]
fn the_json_estimate_covers_the_decode_peak() {
    let _one = alone();
    let mut cases = vec![
        ("random batch", random_batch(7, 5, 5_000, 500, 24).to_json().into_bytes()),
        ("cpu batch", cpu_batch(3, 5, 200).to_json().into_bytes()),
        ("empty samples", json_expansion_request(1_000_000)),
        (
            "one-byte strings",
            format!("{{\"dictionary\":{{\"stringTable\":[\"\"{}]}}}}", ",\"x\"".repeat(200_000)).into_bytes(),
        ),
        (
            "nested empty arrays",
            format!(
                "{{\"dictionary\":{{\"attributeTable\":[{{\"value\":{{\"arrayValue\":{{\"values\":[{}{{}}]}}}}}}]}}}}",
                "{},".repeat(200_000)
            )
            .into_bytes(),
        ),
        (
            "numbers in values",
            format!(
                "{{\"resourceProfiles\":[{{\"scopeProfiles\":[{{\"profiles\":[{{\"samples\":[{{\"values\":[{}1]}}]}}]}}]}}]}}",
                "1,".repeat(300_000)
            )
            .into_bytes(),
        ),
    ];
    // Vectors just past a power of two: twice the room, and the old block during the move.
    let n = (1 << 17) + 1;
    cases.push((
        "profiles just past a growth",
        format!("{{\"resourceProfiles\":[{{\"scopeProfiles\":[{{\"profiles\":[{}{{}}]}}]}}]}}", "{},".repeat(n - 1))
            .into_bytes(),
    ));
    cases.push((
        "values just past a growth",
        format!(
            "{{\"resourceProfiles\":[{{\"scopeProfiles\":[{{\"profiles\":[{{\"samples\":[{{\"values\":[{}1]}}]}}]}}]}}]}}",
            "1,".repeat(n - 1)
        )
        .into_bytes(),
    ));
    for (name, text) in cases {
        let est = json_decoded_size(&text, usize::MAX).unwrap();
        let (decoded, peak) = peak_of(|| Profiles::from_json(&text));
        decoded.unwrap_or_else(|e| panic!("{name}: {e}"));
        eprintln!(
            "{name}: text {} B, estimate {est} B ({:.1}× text), decode peak {peak} B",
            text.len(),
            est as f64 / text.len() as f64
        );
        assert!(est >= peak, "{name}: estimate {est} below the decode's peak {peak}");
    }
}

#[test]
fn over_budget_stops_early() {
    let _one = alone();
    let wire = expansion_request(30 << 20);
    let t = std::time::Instant::now();
    let e = proto_decoded_size(&wire, 256 << 20).unwrap_err();
    assert!(matches!(e, BudgetError::OverBudget { limit, .. } if limit == 256 << 20), "{e:?}");
    // The walk stops at the budget: a fraction of the request is read.
    eprintln!("refused in {:?}", t.elapsed());
}
