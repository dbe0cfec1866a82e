//! From sampled stacks to the batch sent downstream.
//!
//! - [`stack_end`]: cuts the frames at a stack's end that are no code.
//! - [`kernel_text`]: where the kernel's own text lies (stacks there may be counted in the kernel).
//! - [`counted`]: stacks counted in the kernel: their records and the counts read at each report.
//! - [`aggregate`]: one report interval's samples, and the batch it makes.
//!
//! `recorded/` holds ring buffer records of a real run, as test fixtures.

pub mod aggregate;
pub mod counted;
pub(crate) mod kernel_text;
pub(crate) mod stack_end;
