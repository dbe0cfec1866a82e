//! OTLP/JSON: the one encoder and decoder of every JSON path (file exporter
//! and receiver, `otlp_http` out, the otlp receiver's HTTP JSON in).
//!
//! Written by the OTLP specification's JSON rules, which are proto3 JSON with
//! two changes: lowerCamelCase keys, bytes as base64 except trace and span ids
//! (hex), 64-bit integers as decimal strings, enums as integers, fields at
//! their default omitted. On input it accepts what any proto3 JSON printer
//! writes: 64-bit integers as strings or numbers, ids as hex or base64 (their
//! lengths differ), original (snake_case) field names, `null` or absent fields
//! as defaults, unknown fields ignored. The profiles messages (v1.10) hold no
//! enum field, so there is no enum to write or read.
//!
//! `profile_id` is a 16-byte id like `trace_id` and is written as hex too, as
//! the OpenTelemetry Collector's pdata does; it is read as hex or base64.

use super::{any_value::Value as Av, pb, AnyValue, ExportProfilesServiceResponse, InstrumentationScope, KeyValue};
use base64::Engine as _;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesPartialSuccess;
use opentelemetry_proto::tonic::common::v1::{ArrayValue, EntityRef, KeyValueList};
use opentelemetry_proto::tonic::resource::v1::Resource;
use serde_json::{Map, Value};
use std::fmt::Write as _;

// ---------------------------------------------------------------- encoder

/// The OTLP/JSON document of `ProfilesData` (the same document as an
/// `ExportProfilesServiceRequest`: the two messages have the same fields).
pub fn encode(resource_profiles: &[pb::ResourceProfiles], dictionary: Option<&pb::ProfilesDictionary>) -> String {
    let mut out = String::with_capacity(256);
    let mut o = Obj::open(&mut out);
    o.list("resourceProfiles", resource_profiles, resource_profiles_out);
    o.msg("dictionary", dictionary, dictionary_out);
    o.close();
    out
}

/// The OTLP/JSON answer of an export (`{}` when everything was accepted).
pub fn encode_response(r: &ExportProfilesServiceResponse) -> String {
    let mut out = String::new();
    let mut o = Obj::open(&mut out);
    o.msg("partialSuccess", r.partial_success.as_ref(), |out, p: &ExportProfilesPartialSuccess| {
        let mut o = Obj::open(out);
        o.int64("rejectedProfiles", p.rejected_profiles);
        o.str("errorMessage", &p.error_message);
        o.close();
    });
    o.close();
    out
}

/// Writes one JSON object's fields, skipping those at their default.
struct Obj<'a> {
    out: &'a mut String,
    first: bool,
}

impl<'a> Obj<'a> {
    fn open(out: &'a mut String) -> Self {
        out.push('{');
        Obj { out, first: true }
    }

    fn close(self) {
        self.out.push('}');
    }

    fn key(&mut self, k: &str) {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        self.out.push('"');
        self.out.push_str(k);
        self.out.push_str("\":");
    }

    fn str(&mut self, k: &str, v: &str) {
        if !v.is_empty() {
            self.key(k);
            string_out(self.out, v);
        }
    }

    fn int32(&mut self, k: &str, v: i32) {
        if v != 0 {
            self.key(k);
            let _ = write!(self.out, "{v}");
        }
    }

    fn uint32(&mut self, k: &str, v: u32) {
        if v != 0 {
            self.key(k);
            let _ = write!(self.out, "{v}");
        }
    }

    /// int64, uint64 and fixed64 alike: a decimal string.
    fn int64(&mut self, k: &str, v: impl Into<i128> + Copy) {
        let v: i128 = v.into();
        if v != 0 {
            self.key(k);
            let _ = write!(self.out, "\"{v}\"");
        }
    }

    fn bytes(&mut self, k: &str, v: &[u8]) {
        if !v.is_empty() {
            self.key(k);
            self.out.push('"');
            base64::engine::general_purpose::STANDARD.encode_string(v, self.out);
            self.out.push('"');
        }
    }

    /// Trace, span and profile ids: hex.
    fn id(&mut self, k: &str, v: &[u8]) {
        if !v.is_empty() {
            self.key(k);
            self.out.push('"');
            for b in v {
                let _ = write!(self.out, "{b:02x}");
            }
            self.out.push('"');
        }
    }

    fn msg<T>(&mut self, k: &str, v: Option<&T>, f: impl FnOnce(&mut String, &T)) {
        if let Some(v) = v {
            self.key(k);
            f(self.out, v);
        }
    }

    fn list<T>(&mut self, k: &str, v: &[T], f: impl Fn(&mut String, &T)) {
        if v.is_empty() {
            return;
        }
        self.key(k);
        self.out.push('[');
        for (i, item) in v.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            f(self.out, item);
        }
        self.out.push(']');
    }

    fn int32s(&mut self, k: &str, v: &[i32]) {
        self.list(k, v, |out, x| {
            let _ = write!(out, "{x}");
        });
    }

    fn int64s(&mut self, k: &str, v: &[impl Into<i128> + Copy]) {
        self.list(k, v, |out, x| {
            let x: i128 = (*x).into();
            let _ = write!(out, "\"{x}\"");
        });
    }
}

fn string_out(out: &mut String, s: &str) {
    out.push('"');
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let esc = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            c if (c as u32) < 0x20 => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if esc.is_empty() {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push_str(esc);
        }
        start = i + c.len_utf8();
    }
    out.push_str(&s[start..]);
    out.push('"');
}

fn double_out(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("\"NaN\"");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "\"Infinity\"" } else { "\"-Infinity\"" });
    } else {
        // serde_json's shortest round-trip form (ryu).
        out.push_str(&serde_json::Number::from_f64(v).map(|n| n.to_string()).unwrap_or_default());
    }
}

fn resource_profiles_out(out: &mut String, r: &pb::ResourceProfiles) {
    let mut o = Obj::open(out);
    o.msg("resource", r.resource.as_ref(), resource_out);
    o.list("scopeProfiles", &r.scope_profiles, scope_profiles_out);
    o.str("schemaUrl", &r.schema_url);
    o.close();
}

fn resource_out(out: &mut String, r: &Resource) {
    let mut o = Obj::open(out);
    o.list("attributes", &r.attributes, key_value_out);
    o.uint32("droppedAttributesCount", r.dropped_attributes_count);
    o.list("entityRefs", &r.entity_refs, |out, e: &EntityRef| {
        let mut o = Obj::open(out);
        o.str("schemaUrl", &e.schema_url);
        o.str("type", &e.r#type);
        o.list("idKeys", &e.id_keys, |out, s| string_out(out, s));
        o.list("descriptionKeys", &e.description_keys, |out, s| string_out(out, s));
        o.close();
    });
    o.close();
}

fn scope_profiles_out(out: &mut String, s: &pb::ScopeProfiles) {
    let mut o = Obj::open(out);
    o.msg("scope", s.scope.as_ref(), |out, sc: &InstrumentationScope| {
        let mut o = Obj::open(out);
        o.str("name", &sc.name);
        o.str("version", &sc.version);
        o.list("attributes", &sc.attributes, key_value_out);
        o.uint32("droppedAttributesCount", sc.dropped_attributes_count);
        o.close();
    });
    o.list("profiles", &s.profiles, profile_out);
    o.str("schemaUrl", &s.schema_url);
    o.close();
}

fn value_type_out(out: &mut String, v: &pb::ValueType) {
    let mut o = Obj::open(out);
    o.int32("typeStrindex", v.type_strindex);
    o.int32("unitStrindex", v.unit_strindex);
    o.close();
}

fn profile_out(out: &mut String, p: &pb::Profile) {
    let mut o = Obj::open(out);
    o.msg("sampleType", p.sample_type.as_ref(), value_type_out);
    o.list("samples", &p.samples, |out, s: &pb::Sample| {
        let mut o = Obj::open(out);
        o.int32("stackIndex", s.stack_index);
        o.int32s("attributeIndices", &s.attribute_indices);
        o.int32("linkIndex", s.link_index);
        o.int64s("values", &s.values);
        o.int64s("timestampsUnixNano", &s.timestamps_unix_nano);
        o.close();
    });
    o.int64("timeUnixNano", p.time_unix_nano);
    o.int64("durationNano", p.duration_nano);
    o.msg("periodType", p.period_type.as_ref(), value_type_out);
    o.int64("period", p.period);
    o.id("profileId", &p.profile_id);
    o.uint32("droppedAttributesCount", p.dropped_attributes_count);
    o.str("originalPayloadFormat", &p.original_payload_format);
    o.bytes("originalPayload", &p.original_payload);
    o.int32s("attributeIndices", &p.attribute_indices);
    o.close();
}

fn dictionary_out(out: &mut String, d: &pb::ProfilesDictionary) {
    let mut o = Obj::open(out);
    o.list("mappingTable", &d.mapping_table, |out, m: &pb::Mapping| {
        let mut o = Obj::open(out);
        o.int64("memoryStart", m.memory_start);
        o.int64("memoryLimit", m.memory_limit);
        o.int64("fileOffset", m.file_offset);
        o.int32("filenameStrindex", m.filename_strindex);
        o.int32s("attributeIndices", &m.attribute_indices);
        o.close();
    });
    o.list("locationTable", &d.location_table, |out, l: &pb::Location| {
        let mut o = Obj::open(out);
        o.int32("mappingIndex", l.mapping_index);
        o.int64("address", l.address);
        o.list("lines", &l.lines, |out, ln: &pb::Line| {
            let mut o = Obj::open(out);
            o.int32("functionIndex", ln.function_index);
            o.int64("line", ln.line);
            o.int64("column", ln.column);
            o.close();
        });
        o.int32s("attributeIndices", &l.attribute_indices);
        o.close();
    });
    o.list("functionTable", &d.function_table, |out, f: &pb::Function| {
        let mut o = Obj::open(out);
        o.int32("nameStrindex", f.name_strindex);
        o.int32("systemNameStrindex", f.system_name_strindex);
        o.int32("filenameStrindex", f.filename_strindex);
        o.int64("startLine", f.start_line);
        o.close();
    });
    o.list("linkTable", &d.link_table, |out, l: &pb::Link| {
        let mut o = Obj::open(out);
        o.id("traceId", &l.trace_id);
        o.id("spanId", &l.span_id);
        o.close();
    });
    o.list("stringTable", &d.string_table, |out, s| string_out(out, s));
    o.list("attributeTable", &d.attribute_table, |out, kv: &pb::KeyValueAndUnit| {
        let mut o = Obj::open(out);
        o.int32("keyStrindex", kv.key_strindex);
        o.msg("value", kv.value.as_ref(), any_value_out);
        o.int32("unitStrindex", kv.unit_strindex);
        o.close();
    });
    o.list("stackTable", &d.stack_table, |out, s: &pb::Stack| {
        let mut o = Obj::open(out);
        o.int32s("locationIndices", &s.location_indices);
        o.close();
    });
    o.close();
}

fn key_value_out(out: &mut String, kv: &KeyValue) {
    let mut o = Obj::open(out);
    o.str("key", &kv.key);
    o.msg("value", kv.value.as_ref(), any_value_out);
    o.int32("keyStrindex", kv.key_strindex);
    o.close();
}

/// A oneof member is written even at its default: its presence is the value.
fn any_value_out(out: &mut String, v: &AnyValue) {
    let mut o = Obj::open(out);
    match &v.value {
        None => {}
        Some(Av::StringValue(s)) => {
            o.key("stringValue");
            string_out(o.out, s);
        }
        Some(Av::BoolValue(b)) => {
            o.key("boolValue");
            o.out.push_str(if *b { "true" } else { "false" });
        }
        Some(Av::IntValue(i)) => {
            o.key("intValue");
            let _ = write!(o.out, "\"{i}\"");
        }
        Some(Av::DoubleValue(d)) => {
            o.key("doubleValue");
            double_out(o.out, *d);
        }
        Some(Av::ArrayValue(a)) => {
            o.key("arrayValue");
            let mut a_o = Obj::open(o.out);
            a_o.list("values", &a.values, any_value_out);
            a_o.close();
        }
        Some(Av::KvlistValue(l)) => {
            o.key("kvlistValue");
            let mut l_o = Obj::open(o.out);
            l_o.list("values", &l.values, key_value_out);
            l_o.close();
        }
        Some(Av::BytesValue(b)) => {
            o.key("bytesValue");
            o.out.push('"');
            base64::engine::general_purpose::STANDARD.encode_string(b, o.out);
            o.out.push('"');
        }
        Some(Av::StringValueStrindex(i)) => {
            o.key("stringValueStrindex");
            let _ = write!(o.out, "{i}");
        }
    }
    o.close();
}

// ---------------------------------------------------------------- decoder

/// A document that is not OTLP/JSON: where (a JSON path) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", path_prefix(.path))]
pub struct JsonError {
    /// Innermost segment first (errors gain their path on the way out).
    path: Vec<String>,
    message: String,
}

fn path_prefix(path: &[String]) -> String {
    if path.is_empty() {
        return String::new();
    }
    let mut s = String::new();
    for seg in path.iter().rev() {
        if !seg.starts_with('[') && !s.is_empty() {
            s.push('.');
        }
        s.push_str(seg);
    }
    s + ": "
}

impl JsonError {
    fn new(message: impl Into<String>) -> Self {
        JsonError { path: Vec::new(), message: message.into() }
    }

    /// Where the error is, e.g. `resourceProfiles[0].scopeProfiles[0].profiles[1].samples[3].values[0]`.
    pub fn path(&self) -> String {
        let p = path_prefix(&self.path);
        p.strip_suffix(": ").unwrap_or(&p).to_owned()
    }
}

type R<T> = Result<T, JsonError>;

trait At<T> {
    fn at(self, seg: impl FnOnce() -> String) -> R<T>;
}

impl<T> At<T> for R<T> {
    fn at(self, seg: impl FnOnce() -> String) -> R<T> {
        self.map_err(|mut e| {
            e.path.push(seg());
            e
        })
    }
}

/// Decodes `ProfilesData` (or `ExportProfilesServiceRequest`: the same fields).
pub fn decode(text: &[u8]) -> R<pb::ProfilesData> {
    let doc: Value = serde_json::from_slice(text).map_err(|e| JsonError::new(format!("not JSON: {e}")))?;
    if !doc.is_object() {
        return Err(JsonError::new(format!("expected a JSON object at the top, found {}", kind(&doc))));
    }
    let mut d = pb::ProfilesData::default();
    for (k, v) in fields(&doc)? {
        match k.as_str() {
            "resourceProfiles" | "resource_profiles" => {
                d.resource_profiles = list(v, resource_profiles).at(|| k.clone())?
            }
            "dictionary" => d.dictionary = msg(v, dictionary).at(|| k.clone())?,
            _ => {}
        }
    }
    Ok(d)
}

/// Decodes the answer of an OTLP/HTTP JSON export.
pub fn decode_response(text: &[u8]) -> R<ExportProfilesServiceResponse> {
    let doc: Value = serde_json::from_slice(text).map_err(|e| JsonError::new(format!("not JSON: {e}")))?;
    let mut r = ExportProfilesServiceResponse::default();
    for (k, v) in fields(&doc)? {
        if let "partialSuccess" | "partial_success" = k.as_str() {
            r.partial_success = msg(v, |v| {
                let mut p = ExportProfilesPartialSuccess::default();
                for (k, v) in fields(v)? {
                    match k.as_str() {
                        "rejectedProfiles" | "rejected_profiles" => p.rejected_profiles = int64(v).at(|| k.clone())?,
                        "errorMessage" | "error_message" => p.error_message = string(v).at(|| k.clone())?,
                        _ => {}
                    }
                }
                Ok(p)
            })
            .at(|| k.clone())?;
        }
    }
    Ok(r)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

static NO_FIELDS: std::sync::LazyLock<Map<String, Value>> = std::sync::LazyLock::new(Map::new);

/// A message's fields; `null` is the message with every field at its default.
fn fields(v: &Value) -> R<&Map<String, Value>> {
    match v {
        Value::Object(m) => Ok(m),
        Value::Null => Ok(&NO_FIELDS),
        other => Err(JsonError::new(format!("expected an object, found {}", kind(other)))),
    }
}

/// An optional message field: present (even `{}`) or not.
fn msg<T>(v: &Value, f: impl FnOnce(&Value) -> R<T>) -> R<Option<T>> {
    match v {
        Value::Null => Ok(None),
        v => f(v).map(Some),
    }
}

fn list<T>(v: &Value, f: impl Fn(&Value) -> R<T>) -> R<Vec<T>> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(a) => a.iter().enumerate().map(|(i, v)| f(v).at(|| format!("[{i}]"))).collect(),
        other => Err(JsonError::new(format!("expected an array, found {}", kind(other)))),
    }
}

/// An integer written as a number or a decimal string, in `[min, max]`.
fn integer(v: &Value, min: i128, max: i128, what: &str) -> R<i128> {
    let n: Option<i128> = match v {
        Value::Null => return Ok(0),
        Value::Number(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from))
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 1.8e19).map(|f| f as i128)),
        Value::String(s) => s.parse::<i128>().ok(),
        _ => None,
    };
    match n {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(JsonError::new(format!("expected {what} (a decimal string or number), found {v}"))),
    }
}

fn int32(v: &Value) -> R<i32> {
    integer(v, i32::MIN.into(), i32::MAX.into(), "a 32-bit integer").map(|n| n as i32)
}

fn uint32(v: &Value) -> R<u32> {
    integer(v, 0, u32::MAX.into(), "an unsigned 32-bit integer").map(|n| n as u32)
}

fn int64(v: &Value) -> R<i64> {
    integer(v, i64::MIN.into(), i64::MAX.into(), "a 64-bit integer").map(|n| n as i64)
}

fn uint64(v: &Value) -> R<u64> {
    integer(v, 0, u64::MAX.into(), "an unsigned 64-bit integer").map(|n| n as u64)
}

fn double(v: &Value) -> R<f64> {
    match v {
        Value::Null => Ok(0.0),
        Value::Number(n) => n.as_f64().ok_or_else(|| JsonError::new(format!("expected a double, found {n}"))),
        Value::String(s) => match s.as_str() {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            s => s.parse().map_err(|_| JsonError::new(format!("expected a double, found {v}"))),
        },
        other => Err(JsonError::new(format!("expected a double, found {}", kind(other)))),
    }
}

fn boolean(v: &Value) -> R<bool> {
    match v {
        Value::Null => Ok(false),
        Value::Bool(b) => Ok(*b),
        other => Err(JsonError::new(format!("expected true or false, found {}", kind(other)))),
    }
}

fn string(v: &Value) -> R<String> {
    match v {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        other => Err(JsonError::new(format!("expected a string, found {}", kind(other)))),
    }
}

/// Base64, standard or URL-safe alphabet, padded or not (proto3 JSON).
fn bytes(v: &Value) -> R<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
    let s = string(v)?;
    let trimmed = s.trim_end_matches('=');
    let engine = if trimmed.contains(['-', '_']) { &URL_SAFE_NO_PAD } else { &STANDARD_NO_PAD };
    engine.decode(trimmed).map_err(|e| JsonError::new(format!("expected base64 bytes: {e}")))
}

/// A trace (16 bytes), span (8) or profile (16) id: hex as the OTLP
/// specification writes it, or base64 as generic proto3 JSON printers do.
fn id(v: &Value, len: usize) -> R<Vec<u8>> {
    let s = string(v)?;
    if s.is_empty() {
        return Ok(Vec::new());
    }
    let out = if s.len() == 2 * len && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        (0..len).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap_or(0)).collect()
    } else {
        bytes(v)?
    };
    if out.len() != len {
        return Err(JsonError::new(format!(
            "expected a {len}-byte id as {} hex digits or base64, found {s:?} ({} bytes)",
            2 * len,
            out.len()
        )));
    }
    Ok(out)
}

fn resource_profiles(v: &Value) -> R<pb::ResourceProfiles> {
    let mut r = pb::ResourceProfiles::default();
    for (k, v) in fields(v)? {
        let at = || k.clone();
        match k.as_str() {
            "resource" => r.resource = msg(v, resource).at(at)?,
            "scopeProfiles" | "scope_profiles" => r.scope_profiles = list(v, scope_profiles).at(at)?,
            "schemaUrl" | "schema_url" => r.schema_url = string(v).at(at)?,
            _ => {}
        }
    }
    Ok(r)
}

fn resource(v: &Value) -> R<Resource> {
    let mut r = Resource::default();
    for (k, v) in fields(v)? {
        let at = || k.clone();
        match k.as_str() {
            "attributes" => r.attributes = list(v, key_value).at(at)?,
            "droppedAttributesCount" | "dropped_attributes_count" => r.dropped_attributes_count = uint32(v).at(at)?,
            "entityRefs" | "entity_refs" => r.entity_refs = list(v, entity_ref).at(at)?,
            _ => {}
        }
    }
    Ok(r)
}

fn entity_ref(v: &Value) -> R<EntityRef> {
    let mut e = EntityRef::default();
    for (k, v) in fields(v)? {
        let at = || k.clone();
        match k.as_str() {
            "schemaUrl" | "schema_url" => e.schema_url = string(v).at(at)?,
            "type" => e.r#type = string(v).at(at)?,
            "idKeys" | "id_keys" => e.id_keys = list(v, string).at(at)?,
            "descriptionKeys" | "description_keys" => e.description_keys = list(v, string).at(at)?,
            _ => {}
        }
    }
    Ok(e)
}

fn scope_profiles(v: &Value) -> R<pb::ScopeProfiles> {
    let mut s = pb::ScopeProfiles::default();
    for (k, v) in fields(v)? {
        let at = || k.clone();
        match k.as_str() {
            "scope" => s.scope = msg(v, scope).at(at)?,
            "profiles" => s.profiles = list(v, profile).at(at)?,
            "schemaUrl" | "schema_url" => s.schema_url = string(v).at(at)?,
            _ => {}
        }
    }
    Ok(s)
}

fn scope(v: &Value) -> R<InstrumentationScope> {
    let mut s = InstrumentationScope::default();
    for (k, v) in fields(v)? {
        let at = || k.clone();
        match k.as_str() {
            "name" => s.name = string(v).at(at)?,
            "version" => s.version = string(v).at(at)?,
            "attributes" => s.attributes = list(v, key_value).at(at)?,
            "droppedAttributesCount" | "dropped_attributes_count" => s.dropped_attributes_count = uint32(v).at(at)?,
            _ => {}
        }
    }
    Ok(s)
}

fn value_type(v: &Value) -> R<pb::ValueType> {
    let mut t = pb::ValueType::default();
    for (k, v) in fields(v)? {
        let at = || k.clone();
        match k.as_str() {
            "typeStrindex" | "type_strindex" => t.type_strindex = int32(v).at(at)?,
            "unitStrindex" | "unit_strindex" => t.unit_strindex = int32(v).at(at)?,
            _ => {}
        }
    }
    Ok(t)
}

fn profile(v: &Value) -> R<pb::Profile> {
    let mut p = pb::Profile::default();
    for (k, v) in fields(v)? {
        let at = || k.clone();
        match k.as_str() {
            "sampleType" | "sample_type" => p.sample_type = msg(v, value_type).at(at)?,
            "samples" => p.samples = list(v, sample).at(at)?,
            "timeUnixNano" | "time_unix_nano" => p.time_unix_nano = uint64(v).at(at)?,
            "durationNano" | "duration_nano" => p.duration_nano = uint64(v).at(at)?,
            "periodType" | "period_type" => p.period_type = msg(v, value_type).at(at)?,
            "period" => p.period = int64(v).at(at)?,
            "profileId" | "profile_id" => p.profile_id = id(v, 16).at(at)?,
            "droppedAttributesCount" | "dropped_attributes_count" => p.dropped_attributes_count = uint32(v).at(at)?,
            "originalPayloadFormat" | "original_payload_format" => p.original_payload_format = string(v).at(at)?,
            "originalPayload" | "original_payload" => p.original_payload = bytes(v).at(at)?,
            "attributeIndices" | "attribute_indices" => p.attribute_indices = list(v, int32).at(at)?,
            _ => {}
        }
    }
    Ok(p)
}

fn sample(v: &Value) -> R<pb::Sample> {
    let mut s = pb::Sample::default();
    for (k, v) in fields(v)? {
        let at = || k.clone();
        match k.as_str() {
            "stackIndex" | "stack_index" => s.stack_index = int32(v).at(at)?,
            "attributeIndices" | "attribute_indices" => s.attribute_indices = list(v, int32).at(at)?,
            "linkIndex" | "link_index" => s.link_index = int32(v).at(at)?,
            "values" => s.values = list(v, int64).at(at)?,
            "timestampsUnixNano" | "timestamps_unix_nano" => s.timestamps_unix_nano = list(v, uint64).at(at)?,
            _ => {}
        }
    }
    Ok(s)
}

fn dictionary(v: &Value) -> R<pb::ProfilesDictionary> {
    let mut d = pb::ProfilesDictionary::default();
    for (k, v) in fields(v)? {
        let at = || k.clone();
        match k.as_str() {
            "mappingTable" | "mapping_table" => d.mapping_table = list(v, mapping).at(at)?,
            "locationTable" | "location_table" => d.location_table = list(v, location).at(at)?,
            "functionTable" | "function_table" => d.function_table = list(v, function).at(at)?,
            "linkTable" | "link_table" => d.link_table = list(v, link).at(at)?,
            "stringTable" | "string_table" => d.string_table = list(v, string).at(at)?,
            "attributeTable" | "attribute_table" => d.attribute_table = list(v, key_value_and_unit).at(at)?,
            "stackTable" | "stack_table" => d.stack_table = list(v, stack).at(at)?,
            _ => {}
        }
    }
    Ok(d)
}

fn mapping(v: &Value) -> R<pb::Mapping> {
    let mut m = pb::Mapping::default();
    for (k, v) in fields(v)? {
        let at = || k.clone();
        match k.as_str() {
            "memoryStart" | "memory_start" => m.memory_start = uint64(v).at(at)?,
            "memoryLimit" | "memory_limit" => m.memory_limit = uint64(v).at(at)?,
            "fileOffset" | "file_offset" => m.file_offset = uint64(v).at(at)?,
            "filenameStrindex" | "filename_strindex" => m.filename_strindex = int32(v).at(at)?,
            "attributeIndices" | "attribute_indices" => m.attribute_indices = list(v, int32).at(at)?,
            _ => {}
        }
    }
    Ok(m)
}

fn location(v: &Value) -> R<pb::Location> {
    let mut l = pb::Location::default();
    for (k, v) in fields(v)? {
        let at = || k.clone();
        match k.as_str() {
            "mappingIndex" | "mapping_index" => l.mapping_index = int32(v).at(at)?,
            "address" => l.address = uint64(v).at(at)?,
            "lines" => l.lines = list(v, line).at(at)?,
            "attributeIndices" | "attribute_indices" => l.attribute_indices = list(v, int32).at(at)?,
            _ => {}
        }
    }
    Ok(l)
}

fn line(v: &Value) -> R<pb::Line> {
    let mut l = pb::Line::default();
    for (k, v) in fields(v)? {
        let at = || k.clone();
        match k.as_str() {
            "functionIndex" | "function_index" => l.function_index = int32(v).at(at)?,
            "line" => l.line = int64(v).at(at)?,
            "column" => l.column = int64(v).at(at)?,
            _ => {}
        }
    }
    Ok(l)
}

fn function(v: &Value) -> R<pb::Function> {
    let mut f = pb::Function::default();
    for (k, v) in fields(v)? {
        let at = || k.clone();
        match k.as_str() {
            "nameStrindex" | "name_strindex" => f.name_strindex = int32(v).at(at)?,
            "systemNameStrindex" | "system_name_strindex" => f.system_name_strindex = int32(v).at(at)?,
            "filenameStrindex" | "filename_strindex" => f.filename_strindex = int32(v).at(at)?,
            "startLine" | "start_line" => f.start_line = int64(v).at(at)?,
            _ => {}
        }
    }
    Ok(f)
}

fn link(v: &Value) -> R<pb::Link> {
    let mut l = pb::Link::default();
    for (k, v) in fields(v)? {
        let at = || k.clone();
        match k.as_str() {
            "traceId" | "trace_id" => l.trace_id = id(v, 16).at(at)?,
            "spanId" | "span_id" => l.span_id = id(v, 8).at(at)?,
            _ => {}
        }
    }
    Ok(l)
}

fn key_value_and_unit(v: &Value) -> R<pb::KeyValueAndUnit> {
    let mut kv = pb::KeyValueAndUnit::default();
    for (k, v) in fields(v)? {
        let at = || k.clone();
        match k.as_str() {
            "keyStrindex" | "key_strindex" => kv.key_strindex = int32(v).at(at)?,
            "value" => kv.value = msg(v, any_value).at(at)?,
            "unitStrindex" | "unit_strindex" => kv.unit_strindex = int32(v).at(at)?,
            _ => {}
        }
    }
    Ok(kv)
}

fn stack(v: &Value) -> R<pb::Stack> {
    let mut s = pb::Stack::default();
    for (k, v) in fields(v)? {
        if let "locationIndices" | "location_indices" = k.as_str() {
            s.location_indices = list(v, int32).at(|| k.clone())?;
        }
    }
    Ok(s)
}

fn key_value(v: &Value) -> R<KeyValue> {
    let mut kv = KeyValue::default();
    for (k, v) in fields(v)? {
        let at = || k.clone();
        match k.as_str() {
            "key" => kv.key = string(v).at(at)?,
            "value" => kv.value = msg(v, any_value).at(at)?,
            "keyStrindex" | "key_strindex" => kv.key_strindex = int32(v).at(at)?,
            _ => {}
        }
    }
    Ok(kv)
}

fn any_value(v: &Value) -> R<AnyValue> {
    let mut out: Option<Av> = None;
    for (k, v) in fields(v)? {
        let at = || k.clone();
        // proto3 JSON: a oneof member set to null is not set.
        if v.is_null() {
            continue;
        }
        let member = match k.as_str() {
            "stringValue" | "string_value" => Av::StringValue(string(v).at(at)?),
            "boolValue" | "bool_value" => Av::BoolValue(boolean(v).at(at)?),
            "intValue" | "int_value" => Av::IntValue(int64(v).at(at)?),
            "doubleValue" | "double_value" => Av::DoubleValue(double(v).at(at)?),
            "arrayValue" | "array_value" => Av::ArrayValue(array_value(v).at(at)?),
            "kvlistValue" | "kvlist_value" => Av::KvlistValue(kvlist_value(v).at(at)?),
            "bytesValue" | "bytes_value" => Av::BytesValue(bytes(v).at(at)?),
            "stringValueStrindex" | "string_value_strindex" => Av::StringValueStrindex(int32(v).at(at)?),
            _ => continue,
        };
        if out.is_some() {
            return Err(JsonError::new(format!("an AnyValue holds one value; {k:?} is a second one")));
        }
        out = Some(member);
    }
    Ok(AnyValue { value: out })
}

fn array_value(v: &Value) -> R<ArrayValue> {
    let mut a = ArrayValue::default();
    for (k, v) in fields(v)? {
        if k == "values" {
            a.values = list(v, any_value).at(|| k.clone())?;
        }
    }
    Ok(a)
}

fn kvlist_value(v: &Value) -> R<KeyValueList> {
    let mut l = KeyValueList::default();
    for (k, v) in fields(v)? {
        if k == "values" {
            l.values = list(v, key_value).at(|| k.clone())?;
        }
    }
    Ok(l)
}
