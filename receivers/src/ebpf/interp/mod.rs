//! Interpreted runtimes: frames of the interpreted program beside the
//! native ones.
//!
//! An interpreter is supported by two halves: a BPF walker that follows the
//! runtime's own frame list at sample time and records, per frame, the
//! code object and the instruction word (cheap, no strings), and a
//! user-space namer that turns (code object, instruction) into a function
//! name, file and line by reading the process's memory once per code object.
//!
//! - [`python`]: CPython 3.9 to 3.14.

// The receiver wires these in; until then only the tests use them.
#![cfg_attr(not(test), allow(dead_code))]

pub(crate) mod python;
