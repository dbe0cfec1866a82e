//! The heap one node-agent report takes on its way through the pipeline,
//! stage by stage, counted by a counting global allocator (bytes asked of
//! the allocator, the most live at once): the same report as
//! `node_pipeline` (its `STACKS` stacks counted in the kernel), built by
//! the receiver, named by kernel_symbols, converted to pprof and encoded
//! (the gzip that follows keeps its state between reports and writes a
//! third of the encoded bytes). A node agent's resident memory
//! peaks while it makes a report (docs/PERFORMANCE.md): what a stage
//! holds on top of the batch is what it adds to that peak.
//!
//!     sudo cargo bench -p profcol --bench report_heap     # root: kallsyms addresses
//!
//! Prints `HEAP stage peak-bytes (live after)` per stage, then the peak of
//! the whole report over the bytes live before it.

use profcol_exporters::group::GroupBy;
use profcol_exporters::pprof::convert::to_pprof;
use profcol_processors::kernel_symbols::symbolize::symbolize;
use profcol_testkit::alloc::{live, peak, reset_peak};

#[global_allocator]
static A: profcol_testkit::alloc::Counting = profcol_testkit::alloc::Counting;

mod common {
    pub(crate) mod node_report;
}
use common::node_report::{Inputs, STACKS};

/// The stages of one report, measured in turn.
struct Report {
    show: bool,
    /// Live bytes when the report started, and the most since.
    start: isize,
    most: isize,
}

impl Report {
    fn new(show: bool) -> Self {
        Report { show, start: live(), most: live() }
    }

    /// Runs `stage`, printing the most it had live on top of what was live
    /// before it, and what it left live.
    fn stage<T>(&mut self, name: &str, run: impl FnOnce() -> T) -> T {
        let before = live();
        reset_peak();
        let out = run();
        let stage_peak = peak();
        self.most = self.most.max(stage_peak);
        if self.show {
            println!("HEAP {name} {} B peak over its input ({} B left live)", stage_peak - before, live() - before);
        }
        out
    }
}

fn main() {
    let inputs = Inputs::new();
    let gens = inputs.store.generations().load();
    // Once for warm-up (lazily made tables), then measured.
    for round in 0..2 {
        let mut r = Report::new(round == 1);
        let batch = r.stage("receiver", || inputs.batch());
        let (batch, _) = r.stage("kernel_symbols", || symbolize(batch, &gens));
        let reports = r.stage("pprof_convert", || to_pprof(&batch, GroupBy::None));
        let encoded: Vec<Vec<u8>> =
            r.stage("pprof_encode", || reports.iter().map(|g| g.report.encode_to_vec()).collect());
        let bytes: usize = encoded.iter().map(Vec::len).sum();
        drop((batch, reports, encoded));
        if r.show {
            println!(
                "HEAP report {} B peak over the bytes live before it ({STACKS} stacks, {bytes} B of pprof)",
                r.most - r.start
            );
        }
    }
}
