//! Rules a batch is held to on both sides of the WASM plugin boundary, in one
//! place so the host and the plugin SDK cannot drift apart:
//!
//! - [`validate`]: the spec's invariants; the host refuses a batch (from a
//!   receiver or a plugin) that breaks one, and the SDK's test harness checks
//!   a plugin's output with the same function.
//! - [`folded`]: the folded-stacks text (`frame;frame;... count`) that the
//!   `flamegraph` exporter writes and the `folded_exporter` example plugin
//!   produces: how a frame is named, unnamed and kernel frames included.
//! - [`observations`]: what a Sample counts (its observations);
//! - [`lookup`]: reading the dictionary by index, out-of-range indices
//!   read as absent.
//!
//! Builds for `wasm32-wasip2`: it needs only the proto messages.

pub mod folded;
pub mod lookup;
pub mod observations;
pub mod validate;

pub use opentelemetry_proto::tonic::profiles::v1development as pb;
