//! `profcol-api`: what every profcol component depends on.
//!
//! - [`model`]: the profile data model ([`Profiles`], builders, views, merge, validation);
//! - [`component`]: component ids, kinds, factories, the Receiver / Processor /
//!   Exporter traits and the [`component::Next`] handle receivers push into;
//!   around every exporter;
//! - [`telemetry`]: per-component counters served as Prometheus text;
//! - [`listeners`]: listening sockets kept open across reloads.

pub mod component;
mod component_id;
pub mod config;
pub mod listeners;
pub mod model;
pub mod services;
pub mod telemetry;

pub use component::{
    Component, ComponentError, ComponentId, CreateSettings, ExportError, Exporter, Factory, FactoryMeta, Kind, Next,
    ProcessError, ProcessOutcome, Processor, Receiver, Stability,
};
pub use model::{Profiles, ProfilesBuilder};
