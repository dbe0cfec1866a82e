//! Writes the seed corpus of the cargo-fuzz target (docs/FUZZING.md):
//! `cargo test -p profcol-exporters --test fuzz_seeds -- --ignored`.

#[test]
#[ignore = "writes fuzz/corpus/otlp_request; run by hand"]
fn write_fuzz_seeds() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus/otlp_request");
    std::fs::create_dir_all(dir).unwrap();
    for (k, (procs, samples)) in [(1, 3), (2, 10), (3, 5)].into_iter().enumerate() {
        let b = profcol_testkit::batch::cpu_batch(k as u64, procs, samples);
        let mut proto = vec![0u8];
        proto.extend(b.encode_to_vec());
        std::fs::write(format!("{dir}/seed-proto-{k}"), proto).unwrap();
        let mut json = vec![1u8];
        json.extend(b.to_json().into_bytes());
        std::fs::write(format!("{dir}/seed-json-{k}"), json).unwrap();
    }
}
