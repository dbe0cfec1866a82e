//! The profile data model: one representation for every stage.
//!
//! [`Profiles`] is a newtype over opentelemetry-proto's `ProfilesData`
//! (profiles `v1development`, proto v1.10 layout), so OTLP exporters, the
//! OTLP receiver and WASM plugins use the same bytes with no conversion.
//! [`ProfilesBuilder`] interns every dictionary table; [`view`] walks samples
//! with their frames resolved; [`ProfilesBuilder::append`] merges batches by
//! remapping one dictionary into another; [`Profiles::validate`] checks the spec's
//! invariants on input from outside; [`Profiles::compact`] drops dictionary
//! entries nothing refers to any more.

mod builder;
pub mod canonical;
mod compact;
mod decode;
pub mod decode_budget;
mod encode;
mod memsize;
pub mod otlp_json;
pub mod rpc;
mod strindex;
#[cfg(test)]
mod validate_tests;
pub mod view;

pub use builder::{hash_str, AttrValue, HashIndex, ProfileMeta, ProfileRef, ProfilesBuilder};
pub use compact::Compacted;
pub use profcol_model_rules::validate::{DroppedProfiles, InvalidProfiles};

pub use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesPartialSuccess, ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
pub use opentelemetry_proto::tonic::common::v1::{
    any_value, AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList,
};
pub use opentelemetry_proto::tonic::profiles::v1development as pb;
pub use opentelemetry_proto::tonic::resource::v1::Resource;

use prost::Message;

/// Attribute keys profcol writes and reads (OTel semantic conventions).
pub mod keys {
    pub const SERVICE_NAME: &str = "service.name";
    pub const HOST_NAME: &str = "host.name";
    pub const PROCESS_PID: &str = "process.pid";
    pub const PROCESS_EXECUTABLE_NAME: &str = "process.executable.name";
    pub const PROCESS_EXECUTABLE_PATH: &str = "process.executable.path";
    pub const CONTAINER_ID: &str = "container.id";
    pub const THREAD_ID: &str = "thread.id";
    pub const THREAD_NAME: &str = "thread.name";
    pub const CPU_LOGICAL_NUMBER: &str = "cpu.logical_number";
    pub const BUILD_ID_GNU: &str = "process.executable.build_id.gnu";
    /// File id of a mapped file without a GNU build id (Go binaries):
    /// SHA-256 of its first and last 4 KiB and its size, first 128 bits.
    pub const BUILD_ID_HTLHASH: &str = "process.executable.build_id.htlhash";
    pub const FRAME_TYPE: &str = "profile.frame.type";
    /// Filename of the mapping that holds kernel (vmlinux) frames.
    pub const KERNEL_MAPPING: &str = "[kernel.kallsyms]";
}

/// The instrumentation scope of the profiles profcol itself makes (its
/// receivers' batches): `profcol` and its version.
pub fn profcol_scope() -> InstrumentationScope {
    InstrumentationScope { name: "profcol".into(), version: env!("CARGO_PKG_VERSION").into(), ..Default::default() }
}

/// A batch of profiles: the unit that flows through pipelines.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profiles(pub pb::ProfilesData);

/// Bytes that are not a valid `ProfilesData` / `ExportProfilesServiceRequest`.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("not a valid OTLP profiles protobuf message: {0}")]
    Protobuf(#[from] prost::DecodeError),
    #[error("not a valid OTLP/JSON profiles document: {0}")]
    Json(#[from] otlp_json::JsonError),
}

impl Profiles {
    /// An empty batch (dictionary with the zero entries in place).
    pub fn empty() -> Self {
        ProfilesBuilder::new().build()
    }

    pub fn dictionary(&self) -> Option<&pb::ProfilesDictionary> {
        self.0.dictionary.as_ref()
    }

    /// Observations across all resources, scopes and profiles: what every
    /// counter, log line, batch size and limit calls "samples" (see
    /// [`observations`]). Saturates instead of overflowing.
    pub fn sample_count(&self) -> usize {
        let strings = self.dictionary().map(|d| d.string_table.as_slice()).unwrap_or(&[]);
        self.profiles().fold(0usize, |n, p| {
            let counted = profile_counts_events(p, strings);
            p.samples.iter().fold(n, |n, s| n.saturating_add(observations(s, counted) as usize))
        })
    }

    /// Number of Sample messages (distinct stack + attribute rows), for
    /// where that number is shown as such; counts use [`Profiles::sample_count`].
    pub fn sample_messages(&self) -> usize {
        self.profiles().map(|p| p.samples.len()).sum()
    }

    /// Bytes the batch occupies in memory (its value and every heap block it
    /// owns, at capacity); what `sending_queue.sizer: bytes` counts. See
    /// `model/memsize.rs` for what the estimate leaves out.
    pub fn memory_size(&self) -> usize {
        memsize::memory_size(&self.0)
    }

    /// Entries per dictionary table, in the order strings, attributes,
    /// mappings, functions, locations, stacks, links (all zero without a
    /// dictionary): what compaction and symbolization are judged by.
    pub fn table_sizes(&self) -> [usize; 7] {
        self.dictionary().map_or([0; 7], |d| {
            [
                d.string_table.len(),
                d.attribute_table.len(),
                d.mapping_table.len(),
                d.function_table.len(),
                d.location_table.len(),
                d.stack_table.len(),
                d.link_table.len(),
            ]
        })
    }

    /// Every profile of the batch, in order.
    pub fn profiles(&self) -> impl Iterator<Item = &pb::Profile> {
        self.0.resource_profiles.iter().flat_map(|r| r.scope_profiles.iter()).flat_map(|s| s.profiles.iter())
    }

    /// No Sample message at all.
    pub fn is_empty(&self) -> bool {
        self.profiles().all(|p| p.samples.is_empty())
    }

    /// Protobuf encoding of `ProfilesData` (prost's bytes, each profile
    /// measured once: see `model/encode.rs`).
    pub fn encode_to_vec(&self) -> Vec<u8> {
        encode::encode_to_vec(&self.0)
    }

    pub fn encoded_len(&self) -> usize {
        self.0.encoded_len()
    }

    /// Decodes protobuf `ProfilesData` bytes (or `ExportProfilesServiceRequest`
    /// bytes: the same fields), with vectors sized exactly (`model/decode.rs`).
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        Ok(Self(decode::decode(bytes)?))
    }

    /// OTLP/JSON encoding of `ProfilesData` (also the JSON of the export
    /// request); see [`otlp_json`] for the rules.
    pub fn to_json(&self) -> String {
        otlp_json::encode(&self.0.resource_profiles, self.0.dictionary.as_ref())
    }

    /// Reads OTLP/JSON `ProfilesData` or an `ExportProfilesServiceRequest`
    /// (the same document), as any proto3 JSON printer writes it.
    pub fn from_json(text: &[u8]) -> Result<Self, DecodeError> {
        Ok(Self(otlp_json::decode(text)?))
    }

    /// Wraps the batch into the OTLP export request (same fields, same bytes).
    pub fn into_request(self) -> ExportProfilesServiceRequest {
        ExportProfilesServiceRequest { resource_profiles: self.0.resource_profiles, dictionary: self.0.dictionary }
    }

    pub fn from_request(req: ExportProfilesServiceRequest) -> Self {
        Self(pb::ProfilesData { resource_profiles: req.resource_profiles, dictionary: req.dictionary })
    }

    /// Checks the spec's invariants; run on every batch that comes from outside.
    pub fn validate(&self) -> Result<(), InvalidProfiles> {
        profcol_model_rules::validate::validate(&self.0)
    }

    /// Removes the profiles that break an invariant and keeps the rest, for
    /// a receiver that accepts a request in part. `Ok(None)`: all valid. An
    /// invalid dictionary spoils every profile: `Err`, and nothing removed.
    pub fn drop_invalid_profiles(&mut self) -> Result<Option<DroppedProfiles>, InvalidProfiles> {
        profcol_model_rules::validate::drop_invalid_profiles(&mut self.0)
    }

    /// Drops dictionary entries nothing live refers to (e.g. frames a
    /// processor replaced), keeping entry 0 and the order of the rest.
    pub fn compact(&mut self) -> Compacted {
        compact::compact(&mut self.0)
    }

    /// Walks every sample with its frames resolved.
    pub fn samples(&self) -> view::Samples<'_> {
        view::Samples::new(self)
    }

    /// Merges `other` into `self`, remapping its dictionary into ours.
    pub fn merge(&mut self, other: Profiles) {
        let mut b = ProfilesBuilder::from_profiles(std::mem::take(self));
        b.append(other);
        *self = b.build();
    }
}

// What a Sample counts: one rule for the host and the plugin SDK.
pub use profcol_model_rules::observations::{observations, profile_counts_events};

/// Looks up string `i` of a string table; out-of-range indices read as "".
pub use profcol_model_rules::lookup::str_at;
