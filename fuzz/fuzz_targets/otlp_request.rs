//! Fuzzes what the otlp receiver does with request bytes from the network:
//! protobuf (and JSON) decoding of ExportProfilesServiceRequest, the
//! invariant check, and — for what passes it — everything downstream that
//! walks the dictionary: sample views, canonical forms, merging, the pprof
//! and flamegraph conversions. None of it may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use profcol_api::model::{canonical, ExportProfilesServiceRequest};
use profcol_api::{Profiles, ProfilesBuilder};
use profcol_exporters::group::GroupBy;
use prost::Message;

fn downstream(p: Profiles) {
    if p.validate().is_err() {
        return;
    }
    let _ = canonical::samples(&p);
    let _ = profcol_exporters::flamegraph::folded(&p, GroupBy::Process, true);
    for g in profcol_exporters::pprof::convert::to_pprof(&p, GroupBy::Container) {
        // What the exporter checks before writing: must hold for valid input.
        g.report.check_valid().expect("pprof conversion made an invalid profile");
        // And what it writes decodes to a valid profile.
        let decoded = g.report.to_profile().expect("pprof encoding that prost cannot decode");
        profcol_exporters::pprof::convert::check_valid(&decoded).expect("pprof encoding decodes to an invalid profile");
    }
    let mut b = ProfilesBuilder::new();
    b.append(p.clone());
    b.append(p);
    let merged = b.build();
    merged.validate().expect("merging two valid batches made an invalid one");
}

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let (mode, body) = (data[0], &data[1..]);
    match mode % 3 {
        0 => {
            if let Ok(req) = ExportProfilesServiceRequest::decode(body) {
                downstream(Profiles::from_request(req));
            }
        }
        1 => {
            // The otlp receiver's JSON path: the same decoder.
            if let Ok(p) = Profiles::from_json(body) {
                downstream(p);
            }
        }
        _ => {
            if let Ok(p) = Profiles::decode(body) {
                downstream(p);
            }
        }
    }
});
