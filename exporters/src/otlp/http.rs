//! `otlp_http`: OTLP profiles over HTTP (`POST {endpoint}/v1development/profiles`),
//! protobuf by default, JSON as an option.

use super::{check_headers, error_chain, status, ClientTlsConfig, Compression, OtlpCounters, Shape};
use profcol_api::component::{factory, Component, ComponentError, CreateSettings, Factory, FactoryMeta, Kind};
use profcol_api::model::ExportProfilesServiceResponse;
use profcol_api::{ExportError, Exporter, Profiles, Stability};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

pub const PROFILES_PATH: &str = "/v1development/profiles";

/// `encoding: proto | json`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HttpEncoding {
    #[default]
    Proto,
    Json,
}

/// `exporters: otlp_http: ...`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpHttpConfig {
    /// Base URL; `/v1development/profiles` is appended.
    pub endpoint: String,
    /// Full URL of the profiles route, used as is (overrides `endpoint`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profiles_endpoint: Option<String>,
    pub encoding: HttpEncoding,
    pub headers: BTreeMap<String, profcol_api::config::Secret>,
    pub compression: Compression,
    /// `ca_file`, `cert_file`, `key_file` apply to `https://` endpoints.
    pub tls: ClientTlsConfig,
}

impl profcol_api::config::Validate for OtlpHttpConfig {}

impl Default for OtlpHttpConfig {
    fn default() -> Self {
        OtlpHttpConfig {
            endpoint: "http://localhost:4318".into(),
            profiles_endpoint: None,
            encoding: HttpEncoding::Proto,
            headers: BTreeMap::new(),
            compression: Compression::Gzip,
            tls: ClientTlsConfig::default(),
        }
    }
}

pub fn factory_otlp_http() -> Arc<dyn Factory> {
    factory::<OtlpHttpConfig, _>(
        FactoryMeta {
            type_name: "otlp_http",
            kind: Kind::Exporter,
            stability: Stability::Alpha,
            description: "OTLP profiles over HTTP (POST /v1development/profiles), protobuf or JSON",
        },
        |settings, cfg| Ok(Component::Exporter(Arc::new(OtlpHttpExporter::new(settings, cfg)?))),
    )
}

/// The `otlp_http` exporter component.
pub struct OtlpHttpExporter {
    id: String,
    client: reqwest::Client,
    url: reqwest::Url,
    headers: reqwest::header::HeaderMap,
    encoding: HttpEncoding,
    compression: Compression,
    counters: OtlpCounters,
}

impl OtlpHttpExporter {
    pub fn new(settings: CreateSettings, cfg: OtlpHttpConfig) -> Result<Self, ComponentError> {
        let id = settings.id.to_string();
        let err = |m: String| ComponentError::msg(format!("exporter {id}: {m}"));
        check_headers(&cfg.headers).map_err(err)?;
        let url_text = match &cfg.profiles_endpoint {
            Some(u) => u.clone(),
            None => format!("{}{PROFILES_PATH}", cfg.endpoint.trim_end_matches('/')),
        };
        let url = reqwest::Url::parse(&url_text)
            .map_err(|e| err(format!("endpoint {url_text:?} is not a URL ({e}); write e.g. http://host:4318")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(err(format!("endpoint {url_text:?}: the scheme must be http or https")));
        }
        if cfg.endpoint.trim().starts_with("http://") {
            cfg.tls.check_plaintext(&cfg.endpoint).map_err(err)?;
        }
        if cfg.tls.server_name_override.is_some() {
            // reqwest checks the certificate against the URL's host only; ignoring
            // the setting would quietly verify another name than the one asked for.
            return Err(err("tls.server_name_override is not supported by otlp_http; write the name the server's \
                 certificate is valid for as the endpoint's host"
                .into()));
        }
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in &cfg.headers {
            // Checked by check_headers above.
            if let (Ok(k), Ok(v)) = (reqwest::header::HeaderName::from_bytes(k.as_bytes()), v.expose().parse()) {
                headers.insert(k, v);
            }
        }
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(60));
        let (ca, ident) = cfg.tls.load().map_err(err)?;
        if let Some(ca) = ca {
            let certs = reqwest::Certificate::from_pem_bundle(&ca).map_err(|e| err(format!("tls.ca_file: {e}")))?;
            b = b.tls_built_in_root_certs(false);
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        if let Some((c, k)) = ident {
            let mut pem = k;
            pem.push(b'\n');
            pem.extend_from_slice(&c);
            b = b.identity(reqwest::Identity::from_pem(&pem).map_err(|e| err(format!("tls.cert_file/key_file: {e}")))?);
        }
        let client = b.build().map_err(|e| err(format!("cannot build the HTTP client: {e}")))?;
        Ok(OtlpHttpExporter {
            counters: OtlpCounters::new(&settings.telemetry),
            id,
            client,
            url,
            headers,
            encoding: cfg.encoding,
            compression: cfg.compression,
        })
    }

    async fn send(&self, batch: &Profiles) -> Result<(), ExportError> {
        let (ct, body) = match self.encoding {
            HttpEncoding::Proto => ("application/x-protobuf", batch.encode_to_vec()),
            HttpEncoding::Json => ("application/json", batch.to_json().into_bytes()),
        };
        let mut req = self.client.post(self.url.clone()).headers(self.headers.clone()).header("content-type", ct);
        let body = match self.compression {
            Compression::None => body,
            Compression::Gzip => {
                req = req.header("content-encoding", "gzip");
                let mut e =
                    flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 4), flate2::Compression::fast());
                e.write_all(&body).and_then(|_| e.finish()).map_err(|e| ExportError::permanent(format!("gzip: {e}")))?
            }
        };
        let resp = req.body(body).send().await.map_err(|e| {
            // No answer at all (refused, reset, timed out): the backend may come back.
            ExportError::Retryable { message: format!("POST {}: {}", self.url, error_chain(&e)), retry_after: None }
        })?;
        let code = resp.status().as_u16();
        let retry_after = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let json = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        let bytes = super::read_answer(resp, super::MAX_ANSWER_BYTES).await;
        if !(200..300).contains(&code) {
            return Err(status::from_http(code, retry_after.as_deref(), &bytes, json));
        }
        let answer = if json {
            serde_json::from_slice::<ExportProfilesServiceResponse>(&bytes).ok()
        } else {
            prost::Message::decode(bytes.as_ref()).ok()
        };
        match answer.and_then(|a| a.partial_success) {
            Some(p) => self.counters.partial(&self.id, &p, Shape::of(batch)),
            None => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl Exporter for OtlpHttpExporter {
    async fn export(&self, batch: &Profiles) -> Result<(), ExportError> {
        let r = self.send(batch).await;
        if let Err(e) = &r {
            self.counters.count(&self.id, e);
        }
        r
    }
}
