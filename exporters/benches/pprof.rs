//! The pprof exporter's conversion of a batch into reports, per `group_by`:
//! a node agent's report (16 processes, 256 samples each; pid and container
//! on the resource, thread id and name on each sample), converted into
//! pprof profiles (gzip and the write excluded). Every sample's labels and
//! group come from its attributes, so this is where reading them costs.
//!
//! cargo bench -p profcol-exporters --bench pprof

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use profcol_exporters::group::GroupBy;
use profcol_exporters::pprof::convert::to_pprof;
use std::time::Duration;

fn bench(c: &mut Criterion) {
    let batch = profcol_testkit::batch::cpu_batch(1, 16, 256);
    let mut g = c.benchmark_group("pprof_convert");
    g.throughput(Throughput::Elements(batch.sample_messages() as u64));
    g.sample_size(50).measurement_time(Duration::from_secs(5));
    for (name, by) in [("none", GroupBy::None), ("process", GroupBy::Process), ("container", GroupBy::Container)] {
        g.bench_function(name, |b| b.iter(|| to_pprof(std::hint::black_box(&batch), by)));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
