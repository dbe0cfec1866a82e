//! eBPF programs.
