//! Write profcol plugins in Rust.
//!
//! A plugin is a WebAssembly component (`wasm32-wasip2`) that implements
//! the `processor` or `exporter` world of `profcol:plugin@0.1.0`
//! (`plugins/wit/plugin.wit`). With this crate a plugin is a type:
//!
//! ```
//! use profcol_plugin_sdk::{Batch, PluginError, Processor};
//!
//! struct DropIdle;
//!
//! impl Processor for DropIdle {
//!     fn init(_config: &str) -> Result<Self, String> { Ok(DropIdle) }
//!     fn process(&mut self, mut batch: Batch) -> Result<Option<Batch>, PluginError> {
//!         batch.retain_frames(|f| f.function_name() != Some("cpu_idle"));
//!         Ok(Some(batch))
//!     }
//! }
//!
//! profcol_plugin_sdk::export_processor!(DropIdle);
//!
//! // Natively, the harness calls it as the host would.
//! let mut h = profcol_plugin_sdk::harness::Harness::<DropIdle>::processor("null").unwrap();
//! assert!(h.process(&profcol_plugin_sdk::harness::cpu_batch()).unwrap().is_some());
//! ```
//!
//! - The batch arrives as [`Batch`], the OTLP `ProfilesData` in the same
//!   opentelemetry-proto prost types the host uses ([`pb`]).
//! - [`Batch::samples`] resolves every index: a [`Sample`]'s frames
//!   ([`Frame`]: function name, file, line, mapping) and attributes.
//! - Edits ([`Batch::retain_frames`], [`Batch::retain_samples`],
//!   [`Batch::set_resource_attribute`]) and [`BatchBuilder`] write a batch
//!   that passes the host's validate (entry 0 of every table is the zero
//!   value, every index in range).
//! - [`host`]: the host's log and counters.
//! - [`harness`]: runs a plugin natively in `cargo test`, through the same
//!   bytes-in, bytes-out path and the host's own validate.
//!
//! The crate builds natively too (for the harness); the wasm bindings exist
//! only in wasm builds.

mod builder;
mod edit;
mod fold;
#[cfg(not(target_arch = "wasm32"))]
pub mod harness;
pub mod host;
mod intern;
mod value;
mod view;

#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod guest;

pub use builder::{BatchBuilder, FrameSpec, ProfileId, ProfileSpec, SampleSpec};
pub use edit::Retained;
pub use profcol_model_rules::validate::InvalidProfiles;
pub use value::Value;
pub use view::{Frame, Line, Mapping, Sample};

/// The folded-stacks rules the `flamegraph` exporter uses ([`Frame`]
/// implements its `Frame`).
pub use profcol_model_rules::folded;

/// The protobuf types of a batch (opentelemetry-proto, profiles v1development).
pub mod pb {
    pub use opentelemetry_proto::tonic::common::v1 as common;
    pub use opentelemetry_proto::tonic::profiles::v1development as profiles;
    pub use opentelemetry_proto::tonic::resource::v1 as resource;
}

use prost::Message;

/// A batch: OTLP `ProfilesData`, as the host sends and takes it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch(pub pb::profiles::ProfilesData);

static EMPTY_DICTIONARY: std::sync::OnceLock<pb::profiles::ProfilesDictionary> = std::sync::OnceLock::new();

impl Batch {
    /// Decodes `ProfilesData` protobuf bytes.
    pub fn decode(bytes: &[u8]) -> Result<Batch, prost::DecodeError> {
        pb::profiles::ProfilesData::decode(bytes).map(Batch)
    }

    pub fn encode(&self) -> Vec<u8> {
        self.0.encode_to_vec()
    }

    /// Checks the spec's invariants, with the host's own rules.
    pub fn validate(&self) -> Result<(), InvalidProfiles> {
        profcol_model_rules::validate::validate(&self.0)
    }

    /// The batch's dictionary (an empty one when it has none).
    pub fn dictionary(&self) -> &pb::profiles::ProfilesDictionary {
        self.0.dictionary.as_ref().unwrap_or_else(|| EMPTY_DICTIONARY.get_or_init(Default::default))
    }

    /// Number of samples in the batch.
    pub fn sample_count(&self) -> usize {
        self.0
            .resource_profiles
            .iter()
            .flat_map(|r| &r.scope_profiles)
            .flat_map(|s| &s.profiles)
            .map(|p| p.samples.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.sample_count() == 0
    }
}

/// What the host does after a failed call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Try again later (exporters: the host's `retry_on_failure`).
    Retryable,
    /// The batch cannot be handled; counted as a plugin failure.
    Permanent,
    /// The plugin decided the batch goes nowhere; not a failure.
    Drop,
}

/// A failed call: its kind and a message for profcol's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginError {
    pub kind: ErrorKind,
    pub message: String,
}

impl PluginError {
    pub fn retryable(message: impl Into<String>) -> Self {
        PluginError { kind: ErrorKind::Retryable, message: message.into() }
    }
    pub fn permanent(message: impl Into<String>) -> Self {
        PluginError { kind: ErrorKind::Permanent, message: message.into() }
    }
    pub fn drop(message: impl Into<String>) -> Self {
        PluginError { kind: ErrorKind::Drop, message: message.into() }
    }
}

impl std::fmt::Display for PluginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for PluginError {}

/// One piece of an exporter's output, for the sink named `sink` (a key of
/// the exporter's `sinks` config); the host writes or posts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    pub sink: String,
    pub content_type: String,
    pub data: Vec<u8>,
}

/// A processor plugin (`processors: wasm/NAME`).
pub trait Processor: Sized + 'static {
    /// Makes the plugin from its `config` (the component's `config`, as JSON;
    /// `null` when none is set). An error fails the component's start.
    fn init(config: &str) -> Result<Self, String>;

    /// Returns the changed batch, or `None` to drop it.
    fn process(&mut self, batch: Batch) -> Result<Option<Batch>, PluginError>;

    /// The call as the host makes it. Override to work on the bytes without
    /// decoding them (a plugin that passes batches through unchanged).
    fn process_bytes(&mut self, batch: Vec<u8>) -> Result<Option<Vec<u8>>, PluginError> {
        let batch = Batch::decode(&batch).map_err(|e| PluginError::permanent(format!("batch does not decode: {e}")))?;
        Ok(self.process(batch)?.map(|b| b.encode()))
    }
}

/// An exporter plugin (`exporters: wasm/NAME`).
pub trait Exporter: Sized + 'static {
    /// As [`Processor::init`].
    fn init(config: &str) -> Result<Self, String>;

    /// Turns a batch into outputs for the configured sinks.
    fn export(&mut self, batch: Batch) -> Result<Vec<Output>, PluginError>;

    /// The call as the host makes it.
    fn export_bytes(&mut self, batch: Vec<u8>) -> Result<Vec<Output>, PluginError> {
        let batch = Batch::decode(&batch).map_err(|e| PluginError::permanent(format!("batch does not decode: {e}")))?;
        self.export(batch)
    }
}

/// Reads a plugin's JSON config into `T` (a serde type); an absent config
/// (`null`) reads as `T::default()`. The error says where and what is wrong.
pub fn config<T: serde::de::DeserializeOwned + Default>(json: &str) -> Result<T, String> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| format!("config is not JSON: {e}"))?;
    if v.is_null() {
        return Ok(T::default());
    }
    serde_json::from_value(v).map_err(|e| format!("config: {e}"))
}

/// Exports `$t` (a [`Processor`]) as the plugin's `processor` world.
/// Does nothing in a native build.
#[macro_export]
macro_rules! export_processor {
    ($t:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct ProfcolProcessor;
            impl $crate::guest::processor_world::exports::profcol::plugin::process_batch::Guest for ProfcolProcessor {
                fn init(config: ::std::string::String) -> ::std::result::Result<(), ::std::string::String> {
                    $crate::guest::init(|| <$t as $crate::Processor>::init(&config))
                }
                fn process(
                    batch: ::std::vec::Vec<u8>,
                ) -> ::std::result::Result<
                    ::std::option::Option<::std::vec::Vec<u8>>,
                    $crate::guest::processor_world::profcol::plugin::types::PluginError,
                > {
                    $crate::guest::process::<$t>(batch)
                }
            }
            $crate::guest::processor_world::__export_processor_world!(ProfcolProcessor with_types_in $crate::guest::processor_world);
        };
    };
}

/// Exports `$t` (an [`Exporter`]) as the plugin's `exporter` world.
/// Does nothing in a native build.
#[macro_export]
macro_rules! export_exporter {
    ($t:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct ProfcolExporter;
            impl $crate::guest::exporter_world::exports::profcol::plugin::export_batch::Guest for ProfcolExporter {
                fn init(config: ::std::string::String) -> ::std::result::Result<(), ::std::string::String> {
                    $crate::guest::init(|| <$t as $crate::Exporter>::init(&config))
                }
                fn export(
                    batch: ::std::vec::Vec<u8>,
                ) -> ::std::result::Result<
                    ::std::vec::Vec<$crate::guest::processor_world::profcol::plugin::types::Output>,
                    $crate::guest::processor_world::profcol::plugin::types::PluginError,
                > {
                    $crate::guest::export::<$t>(batch)
                }
            }
            $crate::guest::exporter_world::__export_exporter_world!(ProfcolExporter with_types_in $crate::guest::exporter_world);
        };
    };
}
