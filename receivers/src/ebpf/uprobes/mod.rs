//! Uprobes: counting calls of chosen user-space functions in every process
//! that runs them.

pub mod cache;
