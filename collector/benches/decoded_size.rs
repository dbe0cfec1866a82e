//! What a batch takes in memory once decoded, against its size on the wire,
//! counted by a counting global allocator (heap bytes asked of the
//! allocator, as `live()` sees them): the request the gateway benches send
//! (one report interval of a busy node, 16 processes × 256 samples) as the
//! otlp receiver decodes it, and two such requests from different nodes as
//! the `batch` processor holds them merged. Each is broken down into the
//! samples (their structs and vectors) and the dictionary, and shown beside
//! the same data with every vector at exactly its length: the model's
//! layout. The receiver's decode keeps each profile's samples packed
//! (`model/packed.rs`); unpacked (`model/decode.rs`, what a processor that
//! reads samples gets) it sizes vectors from the wire, so it should hold the
//! model's layout; prost's own decode, which grows them push by push, is
//! shown beside both.
//!
//! cargo bench -p profcol --bench decoded_size    # RATIO lines

use profcol_api::model::{pb, ExportProfilesServiceRequest, ProfilesBuilder};
use profcol_api::Profiles;
use profcol_testkit::alloc::live;
use prost::Message;

#[global_allocator]
static A: profcol_testkit::alloc::Counting = profcol_testkit::alloc::Counting;

/// Heap bytes `make` leaves live, with what it returns.
fn counted<T>(make: impl FnOnce() -> T) -> (T, usize) {
    let before = live();
    let v = make();
    (v, (live() - before).max(0) as usize)
}

/// The receiver's decode: the request's bytes to the batch the pipeline gets.
fn decode_packed(wire: &[u8]) -> Profiles {
    Profiles::decode_packed(wire).expect("bench bytes decode")
}

/// The same unpacked: what the host hands a processor that reads samples.
fn decode(wire: &[u8]) -> Profiles {
    Profiles::decode(wire).expect("bench bytes decode")
}

/// prost's own decode of the same bytes (vectors grown push by push), the
/// receiver's decode before `model/decode.rs`: shown beside it.
fn prost_decode(wire: &[u8]) -> Profiles {
    Profiles::from_request(ExportProfilesServiceRequest::decode(wire).expect("bench bytes decode"))
}

/// Every vector of the batch cut to its length, as a decoder that counts
/// elements before it allocates would leave it.
fn exact(p: &Profiles) -> Profiles {
    fn v<T: Clone>(x: &[T]) -> Vec<T> {
        x.to_vec()
    }
    let mut out = p.clone();
    for rp in &mut out.0.resource_profiles {
        for sp in &mut rp.scope_profiles {
            for pr in &mut sp.profiles {
                pr.samples = pr
                    .samples
                    .iter()
                    .map(|s| pb::Sample {
                        stack_index: s.stack_index,
                        attribute_indices: v(&s.attribute_indices),
                        link_index: s.link_index,
                        values: v(&s.values),
                        timestamps_unix_nano: v(&s.timestamps_unix_nano),
                    })
                    .collect();
            }
        }
    }
    if let Some(d) = &mut out.0.dictionary {
        d.stack_table = d.stack_table.iter().map(|s| pb::Stack { location_indices: v(&s.location_indices) }).collect();
        d.location_table = d
            .location_table
            .iter()
            .map(|l| pb::Location { lines: v(&l.lines), attribute_indices: v(&l.attribute_indices), ..l.clone() })
            .collect();
        d.string_table = d.string_table.iter().map(|s| s.as_str().to_owned()).collect();
        d.attribute_table.shrink_to_fit();
        d.function_table.shrink_to_fit();
        d.mapping_table.shrink_to_fit();
    }
    out
}

/// Samples' share of a batch (what is left when the dictionary is taken out).
fn without_dictionary(p: &Profiles) -> Profiles {
    Profiles::from(pb::ProfilesData { resource_profiles: p.0.resource_profiles.clone(), dictionary: None })
}

struct Parts {
    total: usize,
    dictionary: usize,
    samples: usize,
}

/// Heap of `p`, of its dictionary alone, and of the rest (resources,
/// profiles and their samples), each counted on a copy of its own.
fn parts(p: &Profiles, copy: impl Fn(&Profiles) -> Profiles) -> Parts {
    let (a, total) = counted(|| copy(p));
    drop(a);
    let rest = without_dictionary(p);
    let (b, samples) = counted(|| copy(&rest));
    drop(b);
    Parts { total, dictionary: total.saturating_sub(samples), samples }
}

fn show(what: &str, p: &Profiles, wire: usize, decoded: usize) {
    let n = p.sample_messages();
    let dict_wire = p.dictionary().map_or(0, |d| d.encoded_len());
    let layout = parts(p, exact);
    // The decode's own count (capacities as the receiver's decode left them) split like the exact copy.
    let grown = parts(p, |p| decode(&p.encode_to_vec()));
    println!(
        "{what}: {n} Sample messages, {wire} bytes on the wire ({dict_wire} of them the dictionary); \
         decoded {decoded} bytes of heap ({:.2}× the wire size)",
        decoded as f64 / wire as f64
    );
    println!(
        "  as decoded: dictionary {} B ({:.2}× its wire size), samples and the rest {} B ({:.0} B per Sample \
         against {:.0} B on the wire)",
        grown.dictionary,
        grown.dictionary as f64 / dict_wire.max(1) as f64,
        grown.samples,
        grown.samples as f64 / n as f64,
        (wire - dict_wire) as f64 / n as f64
    );
    println!(
        "  every vector at its length: {} B ({:.2}× the wire size): dictionary {} B, samples and the rest {} B \
         ({:.0} B per Sample, of which {} B the Sample struct itself)",
        layout.total,
        layout.total as f64 / wire as f64,
        layout.dictionary,
        layout.samples,
        layout.samples as f64 / n as f64,
        std::mem::size_of::<pb::Sample>()
    );
    println!(
        "RATIO decoded {what} = {decoded} B vs wire {wire} B: {:.2}× (goal <= 2.5); with exact vectors {:.2}×",
        decoded as f64 / wire as f64,
        layout.total as f64 / wire as f64
    );
}

fn main() {
    // The gateway benches' request (testkit::floor::busy_node_batch).
    let (one, wire) = profcol_testkit::floor::busy_node_batch();
    drop(one);
    let (packed, packed_decoded) = counted(|| decode_packed(&wire));
    let (request, decoded) = counted(|| decode(&wire));
    let (by_prost, prost_decoded) = counted(|| prost_decode(&wire));
    assert_eq!(by_prost, request, "the unpacked decode reads what prost reads");
    assert_eq!(packed, request, "the packed decode reads what prost reads");
    drop(by_prost);
    println!(
        "prost's decode of the same request: {prost_decoded} B ({:.2}× the wire size)",
        prost_decoded as f64 / wire.len() as f64
    );
    show("busy-node request (unpacked, as a processor that reads samples gets it)", &request, wire.len(), decoded);
    show_packed("busy-node request (otlp receiver, samples packed)", &packed, wire.len(), packed_decoded);

    // Two nodes' requests merged, as the batch processor holds them before
    // it forwards (its first batch indexed, the second appended).
    let other = profcol_testkit::batch::cpu_batch(2, 16, 256).encode_to_vec();
    let total_wire = wire.len() + other.len();
    // As the otlp receiver hands them over (packed), and unpacked.
    for packed in [true, false] {
        let dec = |w: &[u8]| if packed { decode_packed(w) } else { decode(w) };
        let (builder, held) = counted(|| {
            let mut b = ProfilesBuilder::from_profiles(dec(&wire));
            b.append(dec(&other));
            b
        });
        // Building drops the indexes: what is freed then is theirs.
        let before = live();
        let merged = builder.build();
        let built = held.saturating_sub((before - live()).max(0) as usize);
        assert_eq!(merged.is_packed(), packed);
        let what = if packed { "samples packed" } else { "unpacked" };
        println!(
            "batch processor holding two requests ({what}): {held} B with its interning indexes ({:.2}× the \
             {total_wire} wire bytes), {built} B once built",
            held as f64 / total_wire as f64
        );
        if packed {
            show_packed("two requests merged (batch processor, samples packed)", &merged, total_wire, built);
        } else {
            show("two requests merged (batch processor, unpacked)", &merged, total_wire, built);
        }
    }
}

/// A batch whose samples are packed: its dictionary, and the rest.
fn show_packed(what: &str, p: &Profiles, wire: usize, decoded: usize) {
    let (dict, dict_decoded) = counted(|| p.dictionary().cloned());
    drop(dict);
    let n = p.sample_messages();
    let dict_wire = p.dictionary().map_or(0, |d| d.encoded_len());
    let rest = decoded.saturating_sub(dict_decoded);
    println!(
        "{what}: {n} Sample messages; dictionary {dict_decoded} B ({:.2}× its wire size), samples and the rest \
         {rest} B ({:.0} B per Sample against {:.0} B on the wire)",
        dict_decoded as f64 / dict_wire.max(1) as f64,
        rest as f64 / n as f64,
        (wire - dict_wire) as f64 / n as f64
    );
    println!("RATIO decoded {what} = {decoded} B vs wire {wire} B: {:.2}× (goal <= 2.5)", decoded as f64 / wire as f64);
}
