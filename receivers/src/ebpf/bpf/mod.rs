//! The BPF side of the receiver, as the kernel sees it.
//!
//! - [`loader`]: loads the BPF object with aya, attaches one cpu-clock perf event per online CPU, follows hotplug.
//! - [`privileges`]: whether this process may sample the whole host, and what to grant when not.

pub(crate) mod loader;
pub mod privileges;
