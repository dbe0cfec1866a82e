//! The `pprof` exporter: each batch (one report interval) becomes one gzipped
//! `profile.proto` per group, written to `directory` or pushed to a
//! Pyroscope server's `/ingest?name=&from=&until=&format=pprof`.
//!
//! One exporter has one destination (`directory` or `endpoint`) so that a
//! retried export never writes a report twice; configure two `pprof/...`
//! exporters for both.

pub mod convert;
pub mod proto;
mod retention;

use retention::Retention;

use crate::delivered::Delivered;
use crate::file_names::{sanitize, time_range, unique_path};
use crate::group::{GroupBy, MAX_GROUPS, OVERFLOW_GROUP};
use crate::otlp::status;
use crate::output::write_atomic;
use profcol_api::component::{
    factory_with_metrics, Component, ComponentError, CreateSettings, Factory, FactoryMeta, Kind,
};
use profcol_api::model::{keys, Resource};
use profcol_api::telemetry::MetricDef;
use profcol_api::{ExportError, Exporter, Profiles, Stability};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// `exporters: pprof: ...`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PprofConfig {
    /// Write `{file_prefix}-{YYYYmmddTHHMMSSZ}-{group}.pb.gz` files here.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-profcol-creates" = "directory"))]
    pub directory: Option<PathBuf>,
    /// First part of each file name (no '/').
    pub file_prefix: String,
    /// `directory` only: keep at most this many of the files this exporter
    /// wrote, removing the oldest first (0: no limit).
    pub max_files: usize,
    /// `directory` only: remove the files this exporter wrote once they are
    /// older than this (0s: no limit).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub max_age: Duration,
    /// Push to this Pyroscope server (base URL, e.g. http://pyroscope:4040).
    /// Credentials in it (`https://user:password@host`) are never shown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<profcol_api::config::SecretUrl>,
    /// Pyroscope application name; default: the resource's `service.name`,
    /// else `profcol`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub application_name: Option<String>,
    /// Push only: the resource attributes that label a Pyroscope series
    /// (`app{host_name=...}`, dots become underscores), besides its
    /// `service.name`. One report is pushed per series; keep them bounded:
    /// `process.pid` or `container.id` make a series per process or container.
    pub labels: Vec<String>,
    /// Extra HTTP headers for the push (e.g. `authorization`, `x-scope-orgid`).
    pub headers: BTreeMap<String, profcol_api::config::Secret>,
    /// CA (PEM) to trust for an `https://` endpoint, instead of the system's roots.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// `directory` only: one report per batch (`none`), per process
    /// (`process`) or per container (`container`). The push makes one per
    /// series (see `labels`).
    pub group_by: GroupBy,
    /// `directory` only: permissions of the files it creates (octal string).
    pub file_mode: profcol_api::config::Mode,
    /// `directory` only: permissions of the directories it creates (octal string).
    pub dir_mode: profcol_api::config::Mode,
}

impl profcol_api::config::Validate for PprofConfig {
    fn validate(&self, p: &mut profcol_api::config::Problems) {
        use profcol_api::config::checks;
        match (&self.directory, &self.endpoint) {
            (Some(d), None) => p.check("directory", checks::writable_dir(d)),
            (None, Some(e)) => {
                p.check("endpoint", checks::http_url(e.expose()));
                crate::otlp::validate_headers(p, &self.headers);
                if let Some(ca) = &self.ca_file {
                    p.check("ca_file", checks::pem_certificates(ca));
                }
            }
            (Some(_), Some(_)) => {
                p.add("endpoint", "set either `directory` or `endpoint`, not both (use two pprof exporters for both)")
            }
            (None, None) => p.add("", "set `directory` (files) or `endpoint` (Pyroscope push)"),
        }
        if self.directory.is_some() && !self.headers.is_empty() {
            p.add("headers", "apply to the Pyroscope push only; remove them or set `endpoint` instead of `directory`");
        }
        if self.endpoint.is_some() && self.group_by != GroupBy::None {
            p.add(
                "group_by",
                "applies to files: the push sends one report per series (service.name and `labels`); add \
                 `process.pid` or `container.id` to `labels` to split by them",
            );
        }
        if self.directory.is_some() && self.labels != default_labels() {
            p.add("labels", "apply to the Pyroscope push only; remove them or set `endpoint` instead of `directory`");
        }
        for (i, l) in self.labels.iter().enumerate() {
            if l.is_empty() || l == keys::SERVICE_NAME {
                p.add(
                    &format!("labels[{i}]"),
                    format!("{l:?}: name a resource attribute other than service.name (which names the application)"),
                );
            }
        }
        if self.file_prefix.is_empty() || self.file_prefix.contains('/') {
            p.add("file_prefix", "must be a non-empty file name prefix without '/' (default profile)");
        }
    }
}

impl Default for PprofConfig {
    fn default() -> Self {
        PprofConfig {
            directory: None,
            file_prefix: "profile".into(),
            // A report every 5 s (the node agent's default) is 17,280 a day:
            // both bounds hold less than a day.
            max_files: 10_000,
            max_age: Duration::from_secs(24 * 3600),
            endpoint: None,
            application_name: None,
            labels: default_labels(),
            headers: BTreeMap::new(),
            ca_file: None,
            group_by: GroupBy::None,
            file_mode: crate::output::DEFAULT_FILE_MODE,
            dir_mode: crate::output::DEFAULT_DIR_MODE,
        }
    }
}

/// The push's series labels by default: bounded, one value per node.
fn default_labels() -> Vec<String> {
    vec![keys::HOST_NAME.to_owned()]
}

pub fn factory_pprof() -> Arc<dyn Factory> {
    factory_with_metrics::<PprofConfig, _>(
        FactoryMeta {
            type_name: "pprof",
            kind: Kind::Exporter,
            stability: Stability::Alpha,
            description: "gzipped pprof profile.proto per report and group: files, or push to Pyroscope /ingest",
        },
        METRICS,
        |settings, cfg| Ok(Component::Exporter(Arc::new(PprofExporter::new(settings, cfg)?))),
    )
}

enum Dest {
    Files(PathBuf, Arc<Retention>),
    /// `base` prints without its credentials.
    Push {
        client: reqwest::Client,
        base: profcol_api::config::SecretUrl,
        headers: reqwest::header::HeaderMap,
    },
}

pub(crate) const REPORTS: MetricDef =
    MetricDef::counter("pprof_reports_total", "1", "pprof reports written or pushed.");
pub(crate) const FILES_REMOVED: MetricDef =
    MetricDef::counter("pprof_files_removed_total", "1", "pprof files removed by max_files / max_age.");
pub(crate) const FILES: MetricDef =
    MetricDef::gauge("pprof_files", "1", "pprof files this exporter keeps in its directory.");

/// Every series of the exporter (the files' only with `directory`).
pub(crate) const METRICS: &[MetricDef] = &[REPORTS, FILES_REMOVED, FILES];

/// The `pprof` exporter component.
pub struct PprofExporter {
    id: String,
    cfg: PprofConfig,
    dest: Dest,
    written: profcol_api::telemetry::Counter,
    /// Reports that went out, so a retried batch skips them.
    delivered: Delivered,
    /// The deflate state, reset for each report rather than made anew.
    deflate: std::sync::Mutex<flate2::Compress>,
}

impl PprofExporter {
    pub fn new(settings: CreateSettings, cfg: PprofConfig) -> Result<Self, ComponentError> {
        let id = settings.id.to_string();
        let err = ComponentError::msg;
        let dest = match (&cfg.directory, &cfg.endpoint) {
            (Some(d), None) => {
                crate::output::create_dirs(d, cfg.dir_mode)
                    .map_err(|e| err(format!("directory {}: cannot create it: {e}", d.display())))?;
                let t = &settings.telemetry;
                let retention = Retention::new(
                    &sanitize(&cfg.file_prefix),
                    cfg.max_files,
                    cfg.max_age,
                    t.counter_of(&FILES_REMOVED),
                    t.gauge_of(&FILES),
                );
                retention.adopt(d).map_err(|e| err(format!("directory {}: cannot list it: {e}", d.display())))?;
                Dest::Files(d.clone(), Arc::new(retention))
            }
            (None, Some(e)) => {
                crate::otlp::check_headers(&cfg.headers).map_err(err)?;
                // Errors show the URL without its credentials.
                let url = reqwest::Url::parse(e.expose())
                    .map_err(|x| err(format!("endpoint {:?} is not a URL: {x}", e.redacted())))?;
                if !matches!(url.scheme(), "http" | "https") {
                    return Err(err(format!("endpoint {:?}: the scheme must be http or https", e.redacted())));
                }
                let mut b = reqwest::Client::builder().use_rustls_tls().connect_timeout(Duration::from_secs(5));
                if let Some(ca) = &cfg.ca_file {
                    let pem = std::fs::read(ca).map_err(|x| err(format!("ca_file {}: {x}", ca.display())))?;
                    b = b.tls_built_in_root_certs(false);
                    for c in reqwest::Certificate::from_pem_bundle(&pem).map_err(|x| err(format!("ca_file: {x}")))? {
                        b = b.add_root_certificate(c);
                    }
                }
                let mut headers = reqwest::header::HeaderMap::new();
                for (k, v) in &cfg.headers {
                    if let (Ok(k), Ok(v)) = (reqwest::header::HeaderName::from_bytes(k.as_bytes()), v.expose().parse())
                    {
                        headers.insert(k, v);
                    }
                }
                let client = b.build().map_err(|x| err(format!("cannot build the HTTP client: {x}")))?;
                let base = profcol_api::config::SecretUrl::new(e.expose().trim_end_matches('/'));
                Dest::Push { client, base, headers }
            }
            (Some(_), Some(_)) => {
                return Err(err(
                    "set either `directory` or `endpoint`, not both (use two pprof exporters for both)".into()
                ))
            }
            (None, None) => return Err(err("set `directory` (files) or `endpoint` (Pyroscope push)".into())),
        };
        let written = settings.telemetry.counter_of(&REPORTS);
        let deflate = std::sync::Mutex::new(flate2::Compress::new(flate2::Compression::fast(), false));
        Ok(PprofExporter { id, cfg, dest, written, delivered: Default::default(), deflate })
    }

    /// Pyroscope's `name` parameter of a resource's samples, which names
    /// their series: `app{k=v,...}` with the application (`application_name`,
    /// else `service.name`, else `profcol`) and the `labels` the resource has,
    /// label names made of `[A-Za-z0-9_]` (dots become underscores).
    fn series(&self, resource: Option<&Resource>) -> String {
        let attr = |key: &str| {
            let kv = resource?.attributes.iter().find(|kv| kv.key == key)?;
            profcol_model_rules::folded::value_text(kv.value.as_ref()?).map(|v| v.into_owned())
        };
        let app = self.cfg.application_name.clone().or_else(|| attr(keys::SERVICE_NAME)).unwrap_or_default();
        // `service.name` comes from whoever sent the data: a `{`, `,` or space
        // in it would make the whole name unparsable to Pyroscope.
        let app: String = app
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
            .collect();
        let app = if app.is_empty() { "profcol".to_owned() } else { app };
        let mut labels: Vec<String> = self
            .cfg
            .labels
            .iter()
            .filter_map(|k| {
                let v = attr(k)?;
                let k: String = k.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
                let v: String = v.chars().filter(|c| !matches!(c, ',' | '{' | '}' | '=') && !c.is_control()).collect();
                Some(format!("{k}={v}"))
            })
            .collect();
        labels.sort();
        labels.dedup();
        format!("{app}{{{}}}", labels.join(","))
    }

    /// The reports of a batch: per `group_by` group for files; per series
    /// for the push, without per-sample `pid`/`tid`/`comm` labels (Pyroscope
    /// makes a series of every label value, which is what `labels` bounds).
    fn reports(&self, batch: &Profiles) -> Vec<convert::GroupProfile> {
        match self.dest {
            Dest::Files(..) => convert::to_pprof(batch, self.cfg.group_by),
            Dest::Push { .. } => convert::to_pprof_with(batch, &|r| self.series(r), false),
        }
    }
}

/// gzip (RFC 1952) at level 1, through a deflate state kept between reports:
/// making one allocates and clears ~300 KiB, as much CPU as compressing one
/// of the node agent's reports. Level 1: on the node agent's reports (20
/// profiles of ~25 KB) zlib's level 6 took 2.5× the time of level 1 for 3%
/// fewer bytes, and gzip was the largest part of the pipeline's own CPU
/// (docs/PERFORMANCE.md).
fn gzip(deflate: &mut flate2::Compress, bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    // Magic, deflate, no flags, no mtime, "fastest" (XFL 4), unknown OS.
    const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 255];
    deflate.reset();
    let mut out = Vec::with_capacity(HEADER.len() + bytes.len() / 3 + 64);
    out.extend_from_slice(&HEADER);
    loop {
        if out.len() == out.capacity() {
            out.reserve(out.capacity());
        }
        let (read, written) = (deflate.total_in(), deflate.total_out());
        let rest = &bytes[read as usize..];
        match deflate.compress_vec(rest, &mut out, flate2::FlushCompress::Finish)? {
            flate2::Status::StreamEnd => break,
            _ if deflate.total_in() == read && deflate.total_out() == written && out.len() < out.capacity() => {
                return Err(std::io::Error::other("deflate made no progress"));
            }
            _ => {}
        }
    }
    let mut crc = flate2::Crc::new();
    crc.update(bytes);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    // ISIZE: the input's length modulo 2^32.
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    Ok(out)
}

#[async_trait::async_trait]
impl Exporter for PprofExporter {
    async fn export(&self, batch: &Profiles) -> Result<(), ExportError> {
        if batch.is_empty() {
            return Ok(());
        }
        let groups = self.reports(batch);
        if groups.len() > MAX_GROUPS {
            tracing::warn!(
                exporter = %self.id,
                "the batch has more than {} groups; the samples of the rest are in the group {:?}",
                MAX_GROUPS,
                OVERFLOW_GROUP
            );
        }
        // The batch's time, for a group whose samples carry none; the
        // conversion timed every other group on its walk.
        let bt0 = if groups.iter().all(|g| g.start > 0) { 0 } else { time_range(batch).0 };
        for g in &groups {
            if let Err(e) = g.report.check_valid() {
                // A bug of ours, not the backend's: never retried.
                return Err(ExportError::permanent(format!("the pprof profile for {} is invalid: {e}", g.group)));
            }
            let raw = g.report.encode_to_vec();
            let key = Delivered::key(&g.group, [raw.as_slice()]);
            if self.delivered.contains(key) {
                tracing::debug!(exporter = %self.id, group = %g.group, "report delivered by an earlier attempt; skipped");
                continue;
            }
            let data = {
                let mut deflate = self.deflate.lock().unwrap_or_else(|p| p.into_inner());
                gzip(&mut deflate, &raw).map_err(|e| ExportError::permanent(format!("gzip: {e}")))?
            };
            match &self.dest {
                Dest::Files(dir, retention) => {
                    let (dir, prefix, group) = (dir.clone(), sanitize(&self.cfg.file_prefix), g.group.clone());
                    let mode = self.cfg.file_mode;
                    let retention = Arc::clone(retention);
                    let t = if g.start > 0 { g.start } else { bt0 };
                    let path = tokio::task::spawn_blocking(move || {
                        let p = unique_path(&dir, &prefix, t, &group, "pb.gz");
                        write_atomic(&p, &data, mode)?;
                        retention.record(p.clone(), std::time::SystemTime::now());
                        Ok::<_, std::io::Error>(p)
                    })
                    .await
                    .map_err(|e| ExportError::retryable(format!("writer task: {e}")))?
                    .map_err(|e| ExportError::retryable(format!("writing the pprof file: {e}")))?;
                    tracing::debug!(exporter = %self.id, path = %path.display(), "pprof written");
                }
                Dest::Push { client, base, headers } => {
                    let (from, until) = if g.start > 0 { (g.start, g.end.max(g.start)) } else { (bt0, bt0) };
                    let (from, until) =
                        (from / 1_000_000_000, until.div_ceil(1_000_000_000).max(from / 1_000_000_000 + 1));
                    let name = &g.group;
                    let url = format!("{}/ingest", base.expose());
                    let resp = client
                        .post(&url)
                        .headers(headers.clone())
                        .query(&[
                            ("name", name.as_str()),
                            ("from", &from.to_string()),
                            ("until", &until.to_string()),
                            ("format", "pprof"),
                            ("spyName", "profcol"),
                        ])
                        .header("content-type", "application/octet-stream")
                        .body(data)
                        .send()
                        .await
                        .map_err(|e| ExportError::Retryable {
                            // reqwest's error would print the URL with its credentials.
                            message: format!("POST {base}/ingest: {}", crate::otlp::error_chain(&e.without_url())),
                            retry_after: None,
                        })?;
                    let code = resp.status().as_u16();
                    if !(200..300).contains(&code) {
                        let ra = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
                        let body = crate::otlp::read_answer(resp, crate::otlp::MAX_ANSWER_BYTES).await;
                        let e = status::from_http(code, ra.as_deref(), &body, false);
                        if let ExportError::Permanent { .. } = &e {
                            tracing::error!(exporter = %self.id, "Pyroscope refused the profile: {e}");
                        }
                        return Err(e);
                    }
                }
            }
            self.written.inc();
            self.delivered.insert(key);
        }
        // Reported after the rest is written; permanent, so nothing is written twice.
        let skipped: Vec<String> = groups
            .iter()
            .filter(|g| g.skipped_samples > 0)
            .map(|g| format!("{} in group {}", g.skipped_samples, g.group))
            .collect();
        if !skipped.is_empty() {
            return Err(ExportError::permanent(format!(
                "samples left out of the pprof reports ({}): a report holds at most {} sample types, and the reports \
                 of one batch at most {} stack frames; send smaller batches or fewer sample types per batch \
                 (e.g. a pipeline per profile type)",
                skipped.join(", "),
                convert::MAX_SAMPLE_TYPES,
                convert::MAX_FRAMES
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    fn gunzip(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(data).read_to_end(&mut out).expect("a valid gzip member (CRC and length checked)");
        out
    }

    #[test]
    fn gzip_members_decode_and_the_state_is_reused() {
        let mut deflate = flate2::Compress::new(flate2::Compression::fast(), false);
        // Incompressible bytes larger than the first output guess: the
        // output grows while deflate runs.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..300_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let text = b"profile.proto ".repeat(5000);
        for input in [&b""[..], b"a", &text, &noise, &text] {
            let z = super::gzip(&mut deflate, input).unwrap();
            assert_eq!(&z[..3], &[0x1f, 0x8b, 8]);
            assert_eq!(gunzip(&z), input, "{} bytes", input.len());
        }
        assert!(super::gzip(&mut deflate, &text).unwrap().len() < text.len() / 10);
    }
}
