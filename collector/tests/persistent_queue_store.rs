//! Unit tests of the persistent queue's disk store, compiled here until the
//! exporter wrapper declares the module (`mod persistent;` in
//! collector/src/exporter_helper/mod.rs); then they run as its unit tests.

#[path = "../src/exporter_helper/persistent.rs"]
#[allow(dead_code)]
mod persistent;
