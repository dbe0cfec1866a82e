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
mod packed;
pub mod rpc;
mod strindex;
#[cfg(test)]
mod validate_tests;
pub mod view;

pub use builder::{hash_str, AttrValue, HashIndex, ProfileMeta, ProfileRef, ProfilesBuilder};
pub use compact::Compacted;
use packed::PackedSamples;
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
    pub const CONTAINER_IMAGE_NAME: &str = "container.image.name";
    pub const CONTAINER_RUNTIME: &str = "container.runtime.name";
    pub const K8S_POD_NAME: &str = "k8s.pod.name";
    pub const K8S_POD_UID: &str = "k8s.pod.uid";
    pub const K8S_NAMESPACE_NAME: &str = "k8s.namespace.name";
    pub const K8S_CONTAINER_NAME: &str = "k8s.container.name";
    pub const THREAD_ID: &str = "thread.id";
    pub const THREAD_NAME: &str = "thread.name";
    pub const CPU_LOGICAL_NUMBER: &str = "cpu.logical_number";
    pub const BUILD_ID_GNU: &str = "process.executable.build_id.gnu";
    /// File id of a mapped file without a GNU build id (Go binaries):
    /// SHA-256 of its first and last 4 KiB and its size, first 128 bits.
    pub const BUILD_ID_HTLHASH: &str = "process.executable.build_id.htlhash";
    pub const FRAME_TYPE: &str = "profile.frame.type";
    /// Off-CPU samples: how the thread left the CPU (`sleeping`,
    /// `uninterruptible`, `runnable`).
    pub const OFF_CPU_STATE: &str = "profcol.off_cpu.state";
    /// An off-CPU sample whose waker was recorded, and that waker's
    /// `wakeup` sample: one number on both, unique in the batch.
    pub const OFF_CPU_WAKEUP: &str = "profcol.off_cpu.wakeup";
    /// Wakeup samples: `thread` or `interrupt`.
    pub const WAKEUP_FROM: &str = "profcol.wakeup.from";
    /// Filename of the mapping that holds kernel (vmlinux) frames.
    pub const KERNEL_MAPPING: &str = "[kernel.kallsyms]";
}

/// The instrumentation scope of the profiles profcol itself makes (its
/// receivers' batches): `profcol` and its version.
pub fn profcol_scope() -> InstrumentationScope {
    InstrumentationScope { name: "profcol".into(), version: env!("CARGO_PKG_VERSION").into(), ..Default::default() }
}

/// A batch of profiles: the unit that flows through pipelines.
///
/// Its samples may be packed (see [`Profiles::decode_packed`]): then every
/// profile's own `samples` is empty and the second field holds them, one
/// entry per profile in walk order. Only the methods here read packed
/// samples; code that reads `.0`'s samples takes an unpacked batch (the host
/// unpacks before every processor and exporter that has not said it reads
/// packed ones).
#[derive(Clone, Debug, Default)]
pub struct Profiles(pub pb::ProfilesData, Vec<PackedSamples>);

impl From<pb::ProfilesData> for Profiles {
    fn from(data: pb::ProfilesData) -> Self {
        Profiles(data, Vec::new())
    }
}

/// The same profiles and samples, packed or not.
impl PartialEq for Profiles {
    fn eq(&self, other: &Self) -> bool {
        if !self.is_packed() && !other.is_packed() {
            return self.0 == other.0;
        }
        self.clone().into_unpacked().0 == other.clone().into_unpacked().0
    }
}

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
        let mut n = 0usize;
        self.for_each_profile(|p, packed| {
            let counted = profile_counts_events(p, strings);
            n = match packed {
                Some(samples) => n.saturating_add(samples.observations(counted) as usize),
                None => p.samples.iter().fold(n, |n, s| n.saturating_add(observations(s, counted) as usize)),
            };
        });
        n
    }

    /// Number of Sample messages (distinct stack + attribute rows), for
    /// where that number is shown as such; counts use [`Profiles::sample_count`].
    pub fn sample_messages(&self) -> usize {
        self.profiles().map(|p| p.samples.len()).sum::<usize>() + self.1.iter().map(PackedSamples::len).sum::<usize>()
    }

    /// Each profile with its packed samples, if they are.
    fn for_each_profile(&self, mut f: impl FnMut(&pb::Profile, Option<&PackedSamples>)) {
        let mut packed = self.1.iter();
        self.profiles().for_each(|p| f(p, packed.next()));
    }

    /// Decodes as [`Profiles::decode`] does, each profile's samples checked
    /// and kept as they go on the wire (`model/packed.rs`): ~1× their wire
    /// size instead of ~3.5×. For a batch that is forwarded as it came.
    pub fn decode_packed(bytes: &[u8]) -> Result<Self, DecodeError> {
        let (data, packed) = decode::decode_packed(bytes)?;
        Ok(Profiles(data, packed))
    }

    /// Whether the samples are packed (see [`Profiles::decode_packed`]).
    pub fn is_packed(&self) -> bool {
        !self.1.is_empty()
    }

    /// Puts packed samples back into their profiles; nothing to do if they
    /// are not packed.
    pub fn unpack(&mut self) {
        let packed = std::mem::take(&mut self.1);
        let profiles = self.0.resource_profiles.iter_mut().flat_map(|r| &mut r.scope_profiles);
        for (p, samples) in profiles.flat_map(|s| &mut s.profiles).zip(&packed) {
            p.samples = samples.unpack();
        }
    }

    /// [`Profiles::unpack`] by value.
    pub fn into_unpacked(mut self) -> Self {
        self.unpack();
        self
    }

    /// Bytes the batch occupies in memory (its value and every heap block it
    /// owns, at capacity); what `sending_queue.sizer: bytes` counts. See
    /// `model/memsize.rs` for what the estimate leaves out.
    pub fn memory_size(&self) -> usize {
        let packed = memsize::block(self.1.capacity() * std::mem::size_of::<PackedSamples>());
        memsize::memory_size(&self.0) + self.1.iter().fold(packed, |n, s| n + memsize::block(s.capacity()))
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
        self.profiles().all(|p| p.samples.is_empty()) && self.1.iter().all(PackedSamples::is_empty)
    }

    /// Protobuf encoding of `ProfilesData` (prost's bytes, each profile
    /// measured once: see `model/encode.rs`).
    pub fn encode_to_vec(&self) -> Vec<u8> {
        encode::encode_to_vec(&self.0, &self.1)
    }

    pub fn encoded_len(&self) -> usize {
        if self.is_packed() {
            return encode::encoded_len(&self.0, &self.1);
        }
        self.0.encoded_len()
    }

    /// Decodes protobuf `ProfilesData` bytes (or `ExportProfilesServiceRequest`
    /// bytes: the same fields), with vectors sized exactly (`model/decode.rs`).
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        Ok(Self::from(decode::decode(bytes)?))
    }

    /// OTLP/JSON encoding of `ProfilesData` (also the JSON of the export
    /// request); see [`otlp_json`] for the rules.
    pub fn to_json(&self) -> String {
        if self.is_packed() {
            return self.clone().into_unpacked().to_json();
        }
        otlp_json::encode(&self.0.resource_profiles, self.0.dictionary.as_ref())
    }

    /// Reads OTLP/JSON `ProfilesData` or an `ExportProfilesServiceRequest`
    /// (the same document), as any proto3 JSON printer writes it.
    pub fn from_json(text: &[u8]) -> Result<Self, DecodeError> {
        Ok(Self::from(otlp_json::decode(text)?))
    }

    /// Wraps the batch into the OTLP export request (same fields, same bytes).
    pub fn into_request(self) -> ExportProfilesServiceRequest {
        let Profiles(data, _) = self.into_unpacked();
        ExportProfilesServiceRequest { resource_profiles: data.resource_profiles, dictionary: data.dictionary }
    }

    pub fn from_request(req: ExportProfilesServiceRequest) -> Self {
        Self::from(pb::ProfilesData { resource_profiles: req.resource_profiles, dictionary: req.dictionary })
    }

    /// Checks the spec's invariants; run on every batch that comes from outside.
    pub fn validate(&self) -> Result<(), InvalidProfiles> {
        let rest = profcol_model_rules::validate::validate(&self.0);
        if self.is_packed() && (rest.is_err() || !self.packed_samples_valid()) {
            // The first error an unpacked batch gets: a sample's may come
            // before another profile's own.
            return self.clone().into_unpacked().validate();
        }
        rest
    }

    /// Whether every packed sample holds as its profile's own must.
    fn packed_samples_valid(&self) -> bool {
        let empty = pb::ProfilesDictionary::default();
        let d = self.dictionary().unwrap_or(&empty);
        self.1.iter().all(|samples| samples.valid_against(d))
    }

    /// Removes the profiles that break an invariant and keeps the rest, for
    /// a receiver that accepts a request in part. `Ok(None)`: all valid. An
    /// invalid dictionary spoils every profile: `Err`, and nothing removed.
    /// A packed batch stays packed when all is valid.
    pub fn drop_invalid_profiles(&mut self) -> Result<Option<DroppedProfiles>, InvalidProfiles> {
        if self.is_packed() {
            if self.validate().is_ok() {
                return Ok(None);
            }
            self.unpack();
        }
        profcol_model_rules::validate::drop_invalid_profiles(&mut self.0)
    }

    /// Drops dictionary entries nothing live refers to (e.g. frames a
    /// processor replaced), keeping entry 0 and the order of the rest.
    pub fn compact(&mut self) -> Compacted {
        self.unpack();
        compact::compact(&mut self.0)
    }

    /// Walks every sample with its frames resolved. Takes an unpacked batch.
    pub fn samples(&self) -> view::Samples<'_> {
        debug_assert!(!self.is_packed(), "samples() of a packed batch");
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
