//! `profcol`: the host. It loads the configuration, builds the pipeline graph
//! from the built-in factories, runs it, reloads it on SIGHUP and drains it on
//! SIGINT/SIGTERM. The binary's CLI is in `main.rs`.

pub mod exporter_helper;
pub mod extensions;
pub mod print_config;
pub mod registry;
pub mod schema;
pub mod self_telemetry;
pub mod service;
pub mod telemetry_server;

/// The embedded default configuration (the node agent), kept at examples/default.yaml.
pub const DEFAULT_CONFIG: &str = include_str!("../../examples/default.yaml");
