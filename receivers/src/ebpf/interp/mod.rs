//! Interpreted runtimes: frames of the interpreted program beside the
//! native ones.
//!
//! An interpreter is supported by two halves: a BPF walker that follows the
//! runtime's own frame list at sample time and records, per frame, the
//! code object and the instruction word (cheap, no strings;
//! `ebpf/bpf/python.h`), and a user-space namer that turns (code object,
//! instruction) into a function name, file and line by reading the
//! process's memory once per code object. [`processes`] finds the processes
//! each walker is for and names their records' frames; [`merge`] puts them
//! where their eval calls are in the native stack; [`functions`] holds the
//! functions met, each once.
//!
//! - [`python`]: CPython 3.9 to 3.14.

pub mod functions;
pub(crate) mod merge;
pub(crate) mod processes;
pub(crate) mod python;

use crate::ebpf::metrics as m;
use profcol_api::telemetry::{ComponentTelemetry, Counter, Gauge};
use profcol_ebpf::python::WalkEnd;

/// Why an interpreter process is not walked (the `reason` label).
pub(crate) const REFUSED_REASONS: [&str; 4] = ["unsupported", "unreadable", "layout", "map_full"];

/// Name lookup outcomes (the `outcome` label).
const LOOKUP_OUTCOMES: [&str; 3] = ["hit", "read", "error"];

/// The interpreter series of one receiver (Python's: the only walker).
pub(crate) struct InterpCounters {
    pub processes: Gauge,
    pub cache_bytes: Gauge,
    pub frames: Counter,
    /// By [`WalkEnd`] (`None` where it is not a cut).
    pub walks_cut: Vec<Option<Counter>>,
    /// hit, read, error.
    pub lookups: [Counter; 3],
    /// By [`REFUSED_REASONS`].
    pub refused: Vec<Counter>,
}

impl InterpCounters {
    pub(crate) fn new(t: &ComponentTelemetry) -> Self {
        const PY: &str = "python";
        InterpCounters {
            processes: t.gauge_by(&m::INTERPRETER_PROCESSES, PY),
            cache_bytes: t.gauge_by(&m::INTERPRETER_CACHE_BYTES, PY),
            frames: t.counter_by(&m::INTERPRETER_FRAMES, PY),
            walks_cut: WalkEnd::ALL
                .iter()
                .map(|e| e.cut_reason().map(|r| t.counter_by2(&m::INTERPRETER_WALKS_CUT, PY, r)))
                .collect(),
            lookups: LOOKUP_OUTCOMES.map(|o| t.counter_by2(&m::INTERPRETER_NAME_LOOKUPS, PY, o)),
            refused: REFUSED_REASONS.iter().map(|r| t.counter_by2(&m::INTERPRETER_REFUSED, PY, r)).collect(),
        }
    }

    pub(crate) fn count_end(&self, end: WalkEnd) {
        if let Some(Some(c)) = self.walks_cut.get(end as usize) {
            c.inc();
        }
    }
}
