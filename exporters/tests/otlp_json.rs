//! OTLP/JSON by the specification, both ways, on every JSON path (file
//! exporter `.jsonl`, `otlp_http` with `encoding: json`, file receiver, the
//! otlp receiver's HTTP JSON), checked against the official protobuf JSON
//! printer and parser (google.protobuf.json_format with PyPI
//! opentelemetry-proto 1.45.x, tests/python/otlp_json.py): what profcol writes
//! the official parser reads, and what the official printer writes profcol
//! reads, with the same canonical sample multiset (and the same message).

use base64::Engine as _;
use profcol_api::component::{Component, Kind};
use profcol_api::model::otlp_json;
use profcol_api::model::{canonical, pb};
use profcol_api::{Exporter, Profiles, Receiver};
use profcol_exporters::otlp::{Compression, HttpEncoding, OtlpHttpConfig, OtlpHttpExporter};
use profcol_receivers::otlp::testing::{collecting_receiver, receiver_config, LOOPBACK};
use profcol_testkit::prelude::*;
use profcol_testkit::raw::http_send;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/otlp_json.py");
const CHECK: &str = "import importlib.metadata as m\n\
from google.protobuf import json_format\n\
from opentelemetry.proto.profiles.v1development import profiles_pb2\n\
v = m.version('opentelemetry-proto')\n\
assert v.startswith('1.45.'), v";

fn batches() -> Vec<Profiles> {
    vec![every_field_batch(1), cpu_batch(2, 3, 30), every_field_batch(3)]
}

/// Same samples (the Must-show check) and, stronger, the same message.
fn assert_same(got: &[Profiles], want: &[Profiles]) {
    assert_eq!(got.len(), want.len(), "documents");
    for (g, w) in got.iter().zip(want) {
        assert!(canonical::samples(g) == canonical::samples(w), "canonical sample multisets differ");
        assert_eq!(g, w);
    }
}

/// Runs tests/python/otlp_json.py in `mode` over `lines`; None when Python
/// or the package is missing outside CI.
fn python(mode: &str, lines: &[String]) -> Option<Vec<String>> {
    if !tool_available("python3", &["-c", CHECK]) {
        return None;
    }
    let mut child = Command::new("python3")
        .args([SCRIPT, mode])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = lines.join("\n");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "the official {mode} failed: {}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8(out.stdout).unwrap().lines().map(str::to_owned).collect())
}

/// The official parser's reading of profcol's documents, back as messages.
fn parsed_by_official(docs: &[String]) -> Option<Vec<Profiles>> {
    let out = python("parse", docs)?;
    Some(out.iter().map(|l| Profiles::decode(&B64.decode(l).unwrap()).unwrap()).collect())
}

/// The official printer's documents for `batches`.
fn printed_by_official(batches: &[Profiles]) -> Option<Vec<String>> {
    python("print", &batches.iter().map(|b| B64.encode(b.encode_to_vec())).collect::<Vec<_>>())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn encoder_writes_the_specification_form() {
    let b = every_field_batch(1);
    let doc: Value = serde_json::from_str(&b.to_json()).unwrap();
    let d = &doc["dictionary"];
    let link = d["linkTable"].as_array().unwrap().last().unwrap();
    let want_link = b.dictionary().unwrap().link_table.last().unwrap();
    // Ids hex, other bytes base64.
    assert_eq!(link["traceId"], hex(&want_link.trace_id));
    assert_eq!(link["spanId"], hex(&want_link.span_id));
    let prof = &doc["resourceProfiles"][0]["scopeProfiles"][0]["profiles"][0];
    assert_eq!(prof["profileId"], "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff");
    assert_eq!(prof["originalPayload"], B64.encode((0..=255u8).collect::<Vec<_>>()));
    // 64-bit integers as decimal strings, 32-bit ones as numbers.
    assert_eq!(d["locationTable"].as_array().unwrap().last().unwrap()["address"], "18446744073709551615");
    assert_eq!(prof["timeUnixNano"], "1700000010000000000");
    assert_eq!(prof["period"], "10000000");
    let odd = prof["samples"].as_array().unwrap().last().unwrap();
    assert_eq!(odd["values"], serde_json::json!(["-5", "3"]));
    assert_eq!(d["locationTable"].as_array().unwrap().last().unwrap()["lines"][0]["line"], "9223372036854775807");
    assert_eq!(odd["timestampsUnixNano"], serde_json::json!(["18446744073709551615", "0"]));
    assert!(odd["stackIndex"].is_number() && odd["linkIndex"].is_number());
    // A oneof member at its default is still written (its presence is the value).
    let attrs = d["attributeTable"].as_array().unwrap();
    assert!(attrs.iter().any(|a| a["value"] == serde_json::json!({ "boolValue": false })));
    assert!(attrs.iter().any(|a| a["value"] == serde_json::json!({ "intValue": "-9223372036854775808" })));
    // The zero entries of the tables: defaults omitted, entries kept.
    assert_eq!(d["stringTable"][0], "");
    assert_eq!(d["mappingTable"][0], serde_json::json!({}));
    walk_form(&doc, "");
}

/// Every key lowerCamelCase; no field at its default, except list entries
/// and oneof members.
fn walk_form(v: &Value, path: &str) {
    match v {
        Value::Object(m) => {
            let oneof = path.ends_with(".value") || path.ends_with(']') && m.len() == 1;
            for (k, v) in m {
                let p = format!("{path}.{k}");
                assert!(!k.contains('_') && k.chars().next().unwrap().is_ascii_lowercase(), "key {p}");
                let default = matches!(v, Value::Number(n) if n.as_i64() == Some(0))
                    || v == "0"
                    || v == ""
                    || v.as_array().is_some_and(Vec::is_empty);
                assert!(oneof || !default, "{p} is at its default and must be omitted");
                walk_form(v, &p);
            }
        }
        Value::Array(a) => a.iter().enumerate().for_each(|(i, v)| walk_form(v, &format!("{path}[{i}]"))),
        _ => {}
    }
}

#[test]
fn decoder_reads_every_proto3_form() {
    // int64 as numbers and strings, ids as base64, snake_case names, nulls,
    // unknown fields, absent fields.
    let doc = br#"{
      "resource_profiles": [{
        "resource": {"attributes": [{"key": "a", "value": {"int_value": 5}}], "futureField": {"x": 1}},
        "scopeProfiles": [{"scope": null, "profiles": [{
          "sampleType": {"typeStrindex": 1, "unitStrindex": "2"},
          "timeUnixNano": 1700000000000000000,
          "profile_id": "AAECAwQFBgcICQoLDA0ODw==",
          "samples": [{"stackIndex": 0, "values": [3, "4"], "timestampsUnixNano": ["18446744073709551615"]}, {}]
        }]}]
      }],
      "dictionary": {
        "stringTable": ["", "samples", "count"],
        "linkTable": [{}, {"traceId": "AAECAwQFBgcICQoLDA0ODw==", "span_id": "0001020304050607"}],
        "locationTable": [{"address": "18446744073709551615", "lines": null}]
      },
      "unknownTopLevel": [1, 2, 3]
    }"#;
    let p = Profiles::from_json(doc).unwrap();
    let rp = &p.0.resource_profiles[0];
    assert_eq!(rp.resource.as_ref().unwrap().attributes[0].value.as_ref().unwrap(), &i(5));
    assert_eq!(rp.scope_profiles[0].scope, None);
    let prof = &rp.scope_profiles[0].profiles[0];
    assert_eq!(prof.sample_type, Some(pb::ValueType { type_strindex: 1, unit_strindex: 2 }));
    assert_eq!(prof.time_unix_nano, 1_700_000_000_000_000_000);
    assert_eq!(prof.profile_id, (0..16).collect::<Vec<u8>>());
    assert_eq!(prof.samples[0].values, [3, 4]);
    assert_eq!(prof.samples[0].timestamps_unix_nano, [u64::MAX]);
    assert_eq!(prof.samples[1], pb::Sample::default());
    let d = p.dictionary().unwrap();
    assert_eq!(d.link_table[1].trace_id, (0..16).collect::<Vec<u8>>());
    assert_eq!(d.link_table[1].span_id, (0..8).collect::<Vec<u8>>());
    assert_eq!(d.location_table[0].address, u64::MAX);
    // Observations: sample 0 counts 3 + 4, sample 1 (no values, no timestamps) counts 1.
    assert_eq!(p.sample_count(), 8);
    assert_eq!(p.sample_messages(), 2);
}

#[test]
fn decoder_errors_say_where_and_what() {
    let cases: [(&[u8], &str); 5] = [
        (
            br#"{"resourceProfiles": [{"scopeProfiles": [{"profiles": [{"samples": [{}, {"values": ["x"]}]}]}]}]}"#,
            "resourceProfiles[0].scopeProfiles[0].profiles[0].samples[1].values[0]: expected a 64-bit integer",
        ),
        (
            br#"{"dictionary": {"locationTable": [{"address": "-1"}]}}"#,
            "dictionary.locationTable[0].address: expected an unsigned 64-bit integer",
        ),
        (
            br#"{"dictionary": {"linkTable": [{"traceId": "0011"}]}}"#,
            "dictionary.linkTable[0].traceId: expected a 16-byte id",
        ),
        (
            br#"{"dictionary": {"stackTable": [{"locationIndices": [4294967296]}]}}"#,
            "dictionary.stackTable[0].locationIndices[0]: expected a 32-bit integer",
        ),
        (br#"[1]"#, "expected a JSON object at the top"),
    ];
    for (doc, want) in cases {
        let e = Profiles::from_json(doc).unwrap_err().to_string();
        assert!(e.contains(want), "{e}\n  should contain {want}");
    }
}

#[test]
fn encoder_and_decoder_round_trip_exactly() {
    for b in batches() {
        assert_eq!(Profiles::from_json(b.to_json().as_bytes()).unwrap(), b);
    }
    let answer = br#"{"partialSuccess":{"rejectedProfiles":"3","errorMessage":"x"}}"#;
    let r = otlp_json::decode_response(answer).unwrap();
    assert_eq!(r.partial_success.as_ref().unwrap().rejected_profiles, 3);
    assert_eq!(otlp_json::encode_response(&r).as_bytes(), answer);
}

fn exporter_from_yaml(ty: &str, yaml: &str) -> Arc<dyn Exporter> {
    let f = profcol_exporters::factories().into_iter().find(|f| f.meta().type_name == ty).unwrap();
    match f.create(settings(Kind::Exporter, ty), &profcol_config::parse_section(yaml).unwrap()).unwrap() {
        Component::Exporter(e) => e,
        _ => unreachable!("an exporter factory"),
    }
}

fn receiver_from_yaml(ty: &str, yaml: &str) -> Arc<dyn Receiver> {
    let f = profcol_receivers::factories().into_iter().find(|f| f.meta().type_name == ty).unwrap();
    match f.create(settings(Kind::Receiver, ty), &profcol_config::parse_section(yaml).unwrap()).unwrap() {
        Component::Receiver(r) => r,
        _ => unreachable!("a receiver factory"),
    }
}

#[tokio::test]
async fn official_parser_reads_the_file_exporters_jsonl() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.jsonl");
    let e = exporter_from_yaml("file", &format!("path: {}\nformat: json", path.display()));
    let want = batches();
    for b in &want {
        e.export(b).await.unwrap();
    }
    e.shutdown().await.unwrap();
    let lines: Vec<String> = std::fs::read_to_string(&path).unwrap().lines().map(str::to_owned).collect();
    let Some(got) = parsed_by_official(&lines) else { return };
    assert_same(&got, &want);
}

struct PyHttp {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    port: u16,
}

impl Drop for PyHttp {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn official_parser_reads_what_otlp_http_json_sends() {
    if !tool_available("python3", &["-c", CHECK]) {
        return;
    }
    let mut child = Command::new("python3")
        .args([SCRIPT, "serve", "--partial", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let port = lines.next().unwrap().unwrap().strip_prefix("PORT ").unwrap().parse().unwrap();
    let mut py = PyHttp { child, lines, port };
    let want = batches();
    for compression in [Compression::None, Compression::Gzip] {
        let cfg = OtlpHttpConfig {
            endpoint: Some(format!("http://127.0.0.1:{}", py.port).into()),
            encoding: HttpEncoding::Json,
            compression,
            ..Default::default()
        };
        let e = OtlpHttpExporter::new(settings(Kind::Exporter, "otlp_http/json"), cfg).unwrap();
        let mut got = Vec::new();
        for b in &want {
            e.export(b).await.unwrap();
            let line = py.lines.next().unwrap().unwrap();
            assert!(!line.starts_with("ERROR"), "the official parser refused the document: {line}");
            got.push(Profiles::decode(&B64.decode(line).unwrap()).unwrap());
        }
        assert_same(&got, &want);
    }
}

#[tokio::test]
async fn file_receiver_reads_the_official_printers_jsonl() {
    let want = batches();
    let Some(docs) = printed_by_official(&want) else { return };
    // The official printer writes ids as base64 and every int64 as a string.
    assert!(docs[0].contains("\"traceId\": \"") && docs[0].contains("\"address\": \"18446744073709551615\""));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("official.jsonl");
    std::fs::write(&path, docs.join("\n")).unwrap();
    let r = receiver_from_yaml("file", &format!("path: {}", path.display()));
    let c = Arc::new(Collector::default());
    r.start(c.next()).await.unwrap();
    let total = want.iter().map(Profiles::sample_count).sum();
    c.wait_for(total, Duration::from_secs(10)).await;
    r.shutdown().await.unwrap();
    let got = c.batches.lock().unwrap().clone();
    assert_same(&got, &want);
}

#[tokio::test]
async fn otlp_receiver_reads_the_official_printers_json() {
    let want = batches();
    let Some(docs) = printed_by_official(&want) else { return };
    let (r, c) = collecting_receiver("otlp/json", receiver_config(None, Some(LOOPBACK))).await;
    let addr = r.http_addr().unwrap();
    for d in &docs {
        let (code, _, text) = http_send(addr, d.clone().into_bytes(), "application/json", false).await;
        assert_eq!(code, 200, "{text}");
        assert_eq!(text, "{}");
    }
    r.shutdown().await.unwrap();
    let got = c.batches.lock().unwrap().clone();
    assert_same(&got, &want);
}
