//! pprof files open with `go tool pprof -top` and show the same functions and
//! counts as the batch they came from; grouping; Pyroscope push.

use profcol_api::component::Kind;
use profcol_api::Exporter;
use profcol_exporters::group::GroupBy;
use profcol_exporters::pprof::{convert, proto, PprofConfig, PprofExporter};
use profcol_testkit::prelude::*;
use prost::Message;
use std::collections::BTreeMap;
use std::io::Read;
use std::sync::{Arc, Mutex};

/// Flat (leaf) and cumulative sample counts per function, from the batch itself.
fn expected(batch: &profcol_api::Profiles) -> (BTreeMap<String, i64>, BTreeMap<String, i64>) {
    let (mut flat, mut cum) = (BTreeMap::new(), BTreeMap::new());
    for s in batch.samples() {
        let n = if s.sample.values.is_empty() {
            s.sample.timestamps_unix_nano.len() as i64
        } else {
            s.sample.values.iter().sum()
        };
        let names: Vec<String> = s.frames().map(|f| f.function_name().unwrap_or("?").to_owned()).collect();
        *flat.entry(names[0].clone()).or_insert(0) += n;
        let mut seen = std::collections::BTreeSet::new();
        for nm in names {
            if seen.insert(nm.clone()) {
                *cum.entry(nm).or_insert(0) += n;
            }
        }
    }
    (flat, cum)
}

/// `go tool pprof -top` rows as name → (flat, cum).
fn go_pprof_top(path: &std::path::Path) -> BTreeMap<String, (i64, i64)> {
    let out = std::process::Command::new("go")
        .args(["tool", "pprof", "-top", "-sample_index=samples", "-nodecount=100000", "-symbolize=none"])
        .arg(path)
        .output()
        .expect("go tool pprof");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "go tool pprof failed: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    let mut rows = BTreeMap::new();
    let mut body = false;
    for line in text.lines() {
        if line.trim_start().starts_with("flat") {
            body = true;
            continue;
        }
        if !body {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 6 {
            rows.insert(f[5..].join(" "), (f[0].parse().unwrap(), f[3].parse().unwrap()));
        }
    }
    assert!(!rows.is_empty(), "no rows in:\n{text}");
    rows
}

fn read_pprof(path: &std::path::Path) -> proto::Profile {
    let gz = std::fs::read(path).unwrap();
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz.as_slice()).read_to_end(&mut raw).unwrap();
    proto::Profile::decode(raw.as_slice()).unwrap()
}

fn files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

#[tokio::test]
async fn files_open_in_go_tool_pprof_with_the_same_counts() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = PprofConfig { directory: Some(dir.path().into()), ..Default::default() };
    let e = PprofExporter::new(settings(Kind::Exporter, "pprof"), cfg).unwrap();
    let batch = cpu_batch(7, 4, 200);
    e.export(&batch).await.unwrap();
    let fs = files(dir.path());
    assert_eq!(fs.len(), 1, "{fs:?}");
    let name = fs[0].file_name().unwrap().to_str().unwrap();
    assert!(name.starts_with("profile-20231114T") && name.ends_with("-all.pb.gz"), "{name}");

    // Structure: the CPU convention and pprof's validity rules.
    let p = read_pprof(&fs[0]);
    convert::check_valid(&p).unwrap();
    let st = |i: i64| p.string_table[i as usize].as_str();
    let types: Vec<_> = p.sample_type.iter().map(|v| (st(v.r#type), st(v.unit))).collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    let pt = p.period_type.unwrap();
    assert_eq!((st(pt.r#type), st(pt.unit), p.period), ("cpu", "nanoseconds", 10_000_000));
    for s in &p.sample {
        assert_eq!(s.value[1], s.value[0] * 10_000_000);
        let keys: Vec<_> = s.label.iter().map(|l| st(l.key)).collect();
        assert_eq!(keys, ["pid", "tid", "comm"]);
    }
    let kmap = p.mapping.iter().find(|m| st(m.filename) == "[kernel.kallsyms]").expect("kernel mapping");
    let kloc = p.location.iter().filter(|l| l.mapping_id == kmap.id).count();
    assert!(kloc > 0);
    let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(total as usize, batch.samples().map(|s| s.sample.values.len()).sum::<usize>());

    if !tool_available("go", &["version"]) {
        return;
    }
    let rows = go_pprof_top(&fs[0]);
    eprintln!("go tool pprof -top: {rows:?}");
    let (flat, cum) = expected(&batch);
    for (name, n) in &flat {
        assert_eq!(rows.get(name).map(|r| r.0), Some(*n), "flat of {name}: go says {:?}", rows.get(name));
    }
    for (name, n) in &cum {
        assert_eq!(rows.get(name).map(|r| r.1), Some(*n), "cum of {name}: go says {:?}", rows.get(name));
    }
    // The top function (by flat) is the same.
    let top_go = rows.iter().max_by_key(|(n, r)| (r.0, std::cmp::Reverse((*n).clone()))).unwrap().0;
    let top_src = flat.iter().max_by_key(|(n, c)| (**c, std::cmp::Reverse((*n).clone()))).unwrap().0;
    assert_eq!(top_go, top_src);
    // Labels are visible to pprof's tag filters.
    let out = std::process::Command::new("go")
        .args(["tool", "pprof", "-tags", "-symbolize=none"])
        .arg(&fs[0])
        .output()
        .unwrap();
    let tags = String::from_utf8_lossy(&out.stdout);
    assert!(tags.contains("comm") && tags.contains("pid") && tags.contains("tid"), "{tags}");
}

#[tokio::test]
async fn group_by_process_and_container() {
    let batch = cpu_batch(3, 4, 20);
    for (by, want) in [
        (GroupBy::Process, vec!["pid-1000", "pid-1001", "pid-1002", "pid-1003"]),
        (GroupBy::Container, vec!["container-c0ffee01", "container-c0ffee03", "host"]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = PprofConfig {
            directory: Some(dir.path().into()),
            group_by: by,
            file_prefix: "cpu".into(),
            ..Default::default()
        };
        let e = PprofExporter::new(settings(Kind::Exporter, "pprof"), cfg).unwrap();
        e.export(&batch).await.unwrap();
        let fs = files(dir.path());
        let mut groups: Vec<String> = fs
            .iter()
            .map(|p| {
                let n = p.file_name().unwrap().to_str().unwrap();
                n.trim_end_matches(".pb.gz").splitn(3, '-').nth(2).unwrap().to_owned()
            })
            .collect();
        groups.sort();
        assert_eq!(groups, want);
        let total: i64 = fs.iter().map(|f| read_pprof(f).sample.iter().map(|s| s.value[0]).sum::<i64>()).sum();
        assert_eq!(total as usize, batch.samples().map(|s| s.sample.values.len()).sum::<usize>());
        // Another batch of the same interval does not overwrite the files.
        e.export(&cpu_batch(4, 4, 20)).await.unwrap();
        assert_eq!(files(dir.path()).len(), 2 * want.len());
        // The same batch again (a retry, or an upstream resend) is not written twice.
        e.export(&batch).await.unwrap();
        assert_eq!(files(dir.path()).len(), 2 * want.len());
    }
}

/// A Pyroscope stand-in on loopback: records each `/ingest` push (its
/// query and body) and answers 503 to the push numbered `fail_call` (from 0).
struct Ingest {
    addr: std::net::SocketAddr,
    calls: Arc<std::sync::atomic::AtomicUsize>,
    pushes: Ingested,
}

impl Ingest {
    async fn start(fail_call: Option<usize>) -> Ingest {
        use axum::extract::Query;
        use axum::http::StatusCode;
        let (calls, pushes) = (Arc::new(std::sync::atomic::AtomicUsize::new(0)), Arc::new(Mutex::default()));
        let (c2, p2) = (Arc::clone(&calls), Arc::clone(&pushes));
        let app = axum::Router::new().route(
            "/ingest",
            axum::routing::post(move |Query(q): Query<BTreeMap<String, String>>, body: axum::body::Bytes| {
                let (c2, p2): (Arc<std::sync::atomic::AtomicUsize>, Ingested) = (c2.clone(), p2.clone());
                async move {
                    if Some(c2.fetch_add(1, std::sync::atomic::Ordering::SeqCst)) == fail_call {
                        return (StatusCode::SERVICE_UNAVAILABLE, "busy");
                    }
                    p2.lock().unwrap().push((q, body.to_vec()));
                    (StatusCode::OK, "ok")
                }
            }),
        );
        let (l, addr) = tokio_listener();
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        Ingest { addr, calls, pushes }
    }

    /// A push exporter to this server; `labels` as configured (None: the default).
    fn exporter(&self, labels: Option<&[&str]>) -> PprofExporter {
        let mut cfg = PprofConfig { endpoint: Some(format!("http://{}", self.addr).into()), ..Default::default() };
        if let Some(l) = labels {
            cfg.labels = l.iter().map(|s| s.to_string()).collect();
        }
        PprofExporter::new(settings(Kind::Exporter, "pprof/pyroscope"), cfg).unwrap()
    }

    /// The `name` (series) of each push so far.
    fn names(&self) -> Vec<String> {
        self.pushes.lock().unwrap().iter().map(|(q, _)| q["name"].clone()).collect()
    }

    /// The pushes so far, taken: query and gunzipped pprof body.
    fn take(&self) -> Vec<(BTreeMap<String, String>, Vec<u8>)> {
        let pushes = std::mem::take(&mut *self.pushes.lock().unwrap());
        pushes
            .into_iter()
            .map(|(q, gz)| {
                let mut raw = Vec::new();
                flate2::read::GzDecoder::new(gz.as_slice()).read_to_end(&mut raw).unwrap();
                (q, raw)
            })
            .collect()
    }
}

type Ingested = Arc<Mutex<Vec<(BTreeMap<String, String>, Vec<u8>)>>>;

/// The label keys of a pprof body as Go's reader sees them (`go tool pprof -raw`).
fn go_pprof_label_keys(raw: &[u8]) -> std::collections::BTreeSet<String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("push.pb");
    std::fs::write(&path, raw).unwrap();
    let out = std::process::Command::new("go")
        .args(["tool", "pprof", "-raw", "-symbolize=none"])
        .arg(&path)
        .output()
        .expect("go tool pprof");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "go tool pprof failed: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("Samples:"), "{text}");
    // -raw prints a sample's labels as `key:[value]` after its stack.
    text.lines()
        .flat_map(|l| l.split_whitespace())
        .filter_map(|w| w.split_once(":[").map(|(k, _)| k.to_owned()))
        .collect()
}

#[tokio::test]
async fn pushes_to_pyroscope_ingest() {
    let ingest = Ingest::start(None).await;
    let e = ingest.exporter(None);
    let batch = cpu_batch(5, 2, 30);
    e.export(&batch).await.unwrap();
    let seen = ingest.take();
    // Two processes of service `demo` on one node: one series.
    assert_eq!(seen.len(), 1);
    for (q, raw) in seen.iter() {
        assert_eq!(q["format"], "pprof");
        assert_eq!(q["name"], "demo{host_name=node-1}");
        let (from, until): (u64, u64) = (q["from"].parse().unwrap(), q["until"].parse().unwrap());
        assert_eq!(from, 1_700_000_050);
        assert_eq!(until, from + 10);
        let p = proto::Profile::decode(raw.as_slice()).unwrap();
        convert::check_valid(&p).unwrap();
        let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
        assert_eq!(total as usize, batch.sample_count(), "every observation of both processes");
    }
    // A server that is down is retryable.
    let cfg =
        PprofConfig { endpoint: Some(format!("http://127.0.0.1:{}", closed_port()).into()), ..Default::default() };
    let e = PprofExporter::new(settings(Kind::Exporter, "pprof/down"), cfg).unwrap();
    assert!(matches!(e.export(&batch).await, Err(profcol_api::ExportError::Retryable { .. })));
}

/// Pyroscope files data under `service_name` plus the series' labels, and
/// makes a series of every label value, the pprof body's sample labels
/// included. By default the series are named by service and node only
/// (bounded: no pid, thread or container), whatever the processes; a label
/// asked for splits them.
#[tokio::test]
async fn pyroscope_series_are_named_by_service_with_bounded_labels() {
    let ingest = Ingest::start(None).await;
    // 6 processes of two services, in and outside containers.
    let mut batch = cpu_batch(7, 6, 20);
    for (k, rp) in batch.0.resource_profiles.iter_mut().enumerate() {
        for kv in &mut rp.resource.as_mut().unwrap().attributes {
            if kv.key == "service.name" {
                kv.value = Some(s(if k < 4 { "checkout" } else { "search" }));
            }
        }
    }
    ingest.exporter(None).export(&batch).await.unwrap();
    let pushed = ingest.take();
    let names: Vec<&str> = pushed.iter().map(|(q, _)| q["name"].as_str()).collect();
    assert_eq!(names, ["checkout{host_name=node-1}", "search{host_name=node-1}"]);
    for (_, raw) in &pushed {
        let keys = go_pprof_label_keys(raw);
        assert!(keys.is_empty(), "no per-sample labels (each would be a series): {keys:?}");
    }
    let total: usize = pushed
        .iter()
        .map(|(_, raw)| {
            proto::Profile::decode(raw.as_slice()).unwrap().sample.iter().map(|s| s.value[0] as usize).sum::<usize>()
        })
        .sum();
    assert_eq!(total, batch.sample_count());

    // Asked for: a series per process.
    ingest.exporter(Some(&["host.name", "process.pid"])).export(&batch).await.unwrap();
    let mut names: Vec<String> = ingest.take().into_iter().map(|(q, _)| q["name"].clone()).collect();
    names.sort();
    let want: Vec<String> = (0..6)
        .map(|p| format!("{}{{host_name=node-1,process_pid={}}}", if p < 4 { "checkout" } else { "search" }, 1000 + p))
        .collect();
    assert_eq!(names, want);
    // Per container: processes outside one share the series without the label.
    ingest.exporter(Some(&["container.id"])).export(&batch).await.unwrap();
    let mut names: Vec<String> = ingest.take().into_iter().map(|(q, _)| q["name"].clone()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "checkout{container_id=c0ffee01}",
            "checkout{container_id=c0ffee03}",
            "checkout{}",
            "search{container_id=c0ffee05}",
            "search{}"
        ]
    );
}

#[tokio::test]
async fn a_retried_batch_does_not_push_the_groups_that_went_out_again() {
    // The second push of the first attempt fails with 503; the host retries the whole batch.
    let ingest = Ingest::start(Some(1)).await;
    // A series per process: two reports per batch.
    let e = ingest.exporter(Some(&["process.pid"]));
    let batch = cpu_batch(5, 2, 30);
    assert!(matches!(e.export(&batch).await, Err(profcol_api::ExportError::Retryable { .. })));
    e.export(&batch).await.unwrap();
    let mut names = ingest.names();
    assert_eq!(ingest.calls.load(std::sync::atomic::Ordering::SeqCst), 3, "{names:?}");
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 2, "each group exactly once: {names:?}");
    // A new batch with other content is pushed in full.
    e.export(&cpu_batch(6, 2, 30)).await.unwrap();
    assert_eq!(ingest.names().len(), 4);
}

#[tokio::test]
async fn a_service_name_from_the_sender_cannot_break_the_pyroscope_name() {
    let ingest = Ingest::start(None).await;
    let mut batch = cpu_batch(5, 1, 10);
    for rp in &mut batch.0.resource_profiles {
        for kv in &mut rp.resource.as_mut().unwrap().attributes {
            if kv.key == "service.name" {
                kv.value = Some(s("shop api{env=prod},x"));
            }
        }
    }
    ingest.exporter(None).export(&batch).await.unwrap();
    let names = ingest.names();
    assert_eq!(names.len(), 1);
    assert!(names[0].starts_with("shop_api_env_prod__x{"), "{}", names[0]);
    assert_eq!(names[0].matches('{').count(), 1, "{}", names[0]);
}

/// Files stay bounded: at most `max_files` of this exporter's files, the
/// oldest removed first, counted in its metrics; a file it did not write is
/// left alone, and the defaults hold at most a day.
#[tokio::test]
async fn the_directory_keeps_at_most_max_files_and_only_its_own_are_removed() {
    let d = PprofConfig::default();
    assert!(d.max_files > 0 && d.max_files <= 17_280, "at most a day of 5 s reports");
    assert!(!d.max_age.is_zero() && d.max_age <= std::time::Duration::from_secs(86_400));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README"), "someone else's").unwrap();
    let cfg = PprofConfig { directory: Some(dir.path().into()), max_files: 3, ..Default::default() };
    let s = settings(Kind::Exporter, "pprof/bounded");
    let e = PprofExporter::new(s.clone(), cfg).unwrap();
    let mut names = Vec::new();
    for k in 0..6u64 {
        let before: std::collections::BTreeSet<_> = files(dir.path()).into_iter().collect();
        e.export(&cpu_batch(k, 1, 20)).await.unwrap();
        let new: Vec<_> = files(dir.path()).into_iter().filter(|f| !before.contains(f)).collect();
        assert_eq!(new.len(), 1, "one report per batch: {new:?}");
        names.push(new[0].clone());
    }
    let mut left = files(dir.path());
    left.retain(|f| f.file_name().unwrap() != "README");
    let mut newest = names[3..].to_vec();
    newest.sort();
    assert_eq!(left, newest, "the three newest remain");
    assert!(dir.path().join("README").exists());
    assert_eq!(s.telemetry.counter_value("pprof_files_removed_total"), 3);
    assert_eq!(s.telemetry.gauge_value("pprof_files"), 3);
}

/// `group_by` is for files and `labels` for the push; each refused with the
/// other destination, saying what to do instead.
#[test]
fn push_and_file_keys_are_checked_against_the_destination() {
    use profcol_api::config::{Problems, Validate};
    let problems = |c: PprofConfig| {
        let mut p = Problems::new();
        c.validate(&mut p);
        p.into_errors().into_iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ")
    };
    let push = || PprofConfig { endpoint: Some("http://127.0.0.1:4040".to_owned().into()), ..Default::default() };
    assert_eq!(problems(push()), "");
    assert_eq!(push().labels, ["host.name"]);
    let e = problems(PprofConfig { group_by: GroupBy::Process, ..push() });
    assert!(e.starts_with("group_by:") && e.contains("add `process.pid`"), "{e}");
    let e = problems(PprofConfig { labels: vec!["service.name".into()], ..push() });
    assert!(e.starts_with("labels[0]:"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let files = PprofConfig { directory: Some(dir.path().into()), ..Default::default() };
    assert_eq!(problems(files.clone()), "");
    let e = problems(PprofConfig { labels: vec!["process.pid".into()], ..files });
    assert!(e.starts_with("labels:") && e.contains("push only"), "{e}");
}
