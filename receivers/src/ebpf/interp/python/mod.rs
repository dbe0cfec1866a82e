//! CPython: which processes run it ([`detect`]), where its structs keep
//! the frame chain and names ([`offsets`]), and names and lines of the
//! frames the BPF walker recorded ([`namer`], [`linetable`]).
//!
//! The walker starts at `_PyRuntime` (its address per process is in
//! [`detect::PythonProcess`]), follows interpreters → thread states →
//! frames with the [`offsets::PyOffsets`] of the process's version, and
//! records per frame the code object's address and the raw 8 bytes at
//! `frame_instr`, skipping 3.12+ C-entry frames
//! ([`offsets::cstack_owner`]); [`namer::PyNamer::frame`] names that pair.
//! The `names_and_lines_*` tests do that walk in user space against real
//! interpreters.

pub(crate) mod detect;
pub(crate) mod linetable;
pub(crate) mod namer;
pub(crate) mod offsets;

#[cfg(test)]
mod tests;
