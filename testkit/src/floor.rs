//! What the gateway benches measure against: the batch a busy node sends and
//! the floor, a bare prost decode + encode of the same request bytes.

use profcol_api::model::ExportProfilesServiceRequest;
use profcol_api::Profiles;
use prost::Message;
use std::time::{Duration, Instant};

/// One report interval of a busy node (16 processes × 256 samples) and its
/// encoding; prints its size, so a bench's output says what it sent.
pub fn busy_node_batch() -> (Profiles, Vec<u8>) {
    let batch = crate::batch::cpu_batch(1, 16, 256);
    let bytes = batch.encode_to_vec();
    eprintln!("batch: {} samples, {} bytes", batch.sample_count(), bytes.len());
    (batch, bytes)
}

/// The floor's unit of work: decode an export request and encode it again.
pub fn decode_encode(bytes: &[u8]) -> Vec<u8> {
    ExportProfilesServiceRequest::decode(bytes).expect("bench bytes decode").encode_to_vec()
}

/// The floor's rate in samples per second, measured plainly over `for_`
/// (for the RATIO lines benches print beside criterion's figures).
pub fn samples_per_second(bytes: &[u8], samples_per_request: u64, for_: Duration) -> f64 {
    let t = Instant::now();
    let mut k = 0u64;
    while t.elapsed() < for_ {
        std::hint::black_box(decode_encode(bytes));
        k += 1;
    }
    (k * samples_per_request) as f64 / t.elapsed().as_secs_f64()
}
