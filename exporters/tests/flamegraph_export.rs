//! The flamegraph exporter writes an inferno SVG (and folded stacks) per group.

use profcol_api::component::Kind;
use profcol_api::Exporter;
use profcol_exporters::flamegraph::{FlamegraphConfig, FlamegraphExporter};
use profcol_exporters::group::GroupBy;
use profcol_testkit::prelude::*;

#[tokio::test]
async fn svg_and_folded_per_group() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = FlamegraphConfig {
        directory: dir.path().into(),
        folded: true,
        group_by: GroupBy::Process,
        ..Default::default()
    };
    let e = FlamegraphExporter::new(settings(Kind::Exporter, "flamegraph"), cfg).unwrap();
    let batch = cpu_batch(2, 2, 50);
    e.export(&batch).await.unwrap();
    let mut names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(names[0].starts_with("flamegraph-20231114T") && names[0].ends_with("-pid-1000.folded"), "{names:?}");
    let mut total = 0u64;
    for n in &names {
        let text = std::fs::read_to_string(dir.path().join(n)).unwrap();
        if n.ends_with(".svg") {
            assert!(text.contains("<svg") && text.contains("main") && text.contains("do_syscall_64"), "{n}");
        } else {
            for line in text.lines() {
                let (stack, count) = line.rsplit_once(' ').unwrap();
                assert!(stack.split(';').nth(1) == Some("main"), "root after comm is main: {line}");
                total += count.parse::<u64>().unwrap();
            }
        }
    }
    assert_eq!(total as usize, batch.samples().map(|s| s.sample.values.len()).sum::<usize>());
}
