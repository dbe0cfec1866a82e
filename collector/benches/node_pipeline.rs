//! The node agent's work per report, stage by stage, on one report of its
//! shape: the receiver's batch (`STACKS` distinct stacks of 20 kernel and
//! 15 user frames, counted in the kernel), the kernel_symbols processor
//! on this machine's /proc/kallsyms, and the pprof exporter's conversion
//! and encoding (gzip and the file write excluded).
//!
//!     sudo cargo bench -p profcol --bench node_pipeline     # root: kallsyms addresses
//!
//! Prints one `STAGE name us/report` line per stage: the median and the
//! fastest of `ROUNDS` (the fastest is the steadier on a shared machine).

use profcol_exporters::group::GroupBy;
use profcol_exporters::pprof::convert::to_pprof;
use profcol_processors::kernel_symbols::symbolize::symbolize;
use std::time::{Duration, Instant};

mod common {
    pub(crate) mod node_report;
}
use common::node_report::{Inputs, STACKS};

const ROUNDS: usize = 100;

/// "median (fastest)" of the rounds, in µs.
fn median(mut v: Vec<Duration>) -> String {
    v.sort();
    format!("{:.0} ({:.0})", v[v.len() / 2].as_secs_f64() * 1e6, v[0].as_secs_f64() * 1e6)
}

fn main() {
    let inputs = Inputs::new();
    let gens = inputs.store.generations().load();
    let (mut receiver, mut kernel_symbols, mut pprof) = (Vec::new(), Vec::new(), Vec::new());
    let mut bytes = 0;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let batch = inputs.batch();
        receiver.push(t.elapsed());
        let t = Instant::now();
        let (batch, outcome) = symbolize(batch, &gens);
        kernel_symbols.push(t.elapsed());
        assert!(outcome.resolved > 0, "kernel frames named");
        let t = Instant::now();
        let reports = to_pprof(&batch, GroupBy::None);
        bytes = reports.iter().map(|g| g.report.encode_to_vec().len()).sum::<usize>();
        pprof.push(t.elapsed());
        drop((batch, reports));
    }
    println!("STAGE receiver {} us/report ({STACKS} stacks)", median(receiver));
    println!("STAGE kernel_symbols {} us/report", median(kernel_symbols));
    println!("STAGE pprof {} us/report ({bytes} bytes encoded)", median(pprof));
}
