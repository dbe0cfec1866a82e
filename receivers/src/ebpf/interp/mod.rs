//! Interpreter frames: for each runtime, a walker in the BPF program
//! (`ebpf/bpf/python.h`) that appends the frames of the sampled thread to
//! the record, and a namer here that turns them into function, file and
//! line from the process's memory, cached per process. [`processes`] finds
//! the processes each walker is for and names their records' frames;
//! [`merge`] puts them where their eval calls are in the native stack;
//! [`functions`] holds the functions met, each once.

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
