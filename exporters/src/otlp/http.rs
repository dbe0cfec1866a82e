//! `otlp_http`: OTLP profiles over HTTP (`POST {endpoint}/v1development/profiles`),
//! protobuf by default, JSON as an option.

use super::balancer::{BalancerConfig, Resolver, ResolverConfig, Target};
use super::exporter::{OtlpExporter, Transport};
use super::{check_headers, error_chain, status, ClientTlsConfig, Compression, OtlpCounters, Shape};
use profcol_api::component::{
    factory_with_metrics, Component, ComponentError, CreateSettings, Factory, FactoryMeta, Kind,
};
use profcol_api::config::SecretUrl;
use profcol_api::telemetry::ComponentTelemetry;
use profcol_api::{ExportError, Profiles, Stability};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

pub(crate) const PROFILES_PATH: &str = "/v1development/profiles";

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
    /// Base URL; `/v1development/profiles` is appended (default
    /// `http://localhost:4318`); not with `balancer`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<SecretUrl>,
    /// Spreads batches over several gateways instead of one `endpoint`:
    /// see "Balancing over gateways" in docs/CONFIG.md. Addresses without
    /// a scheme are `https://` unless `tls.insecure` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balancer: Option<BalancerConfig>,
    /// Full URL of the profiles route, used as is (overrides `endpoint`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profiles_endpoint: Option<SecretUrl>,
    /// Body encoding: `proto` or `json`.
    pub encoding: HttpEncoding,
    /// Extra HTTP headers (values are secrets: never printed).
    pub headers: BTreeMap<String, profcol_api::config::Secret>,
    /// Request compression: `gzip` or `none`.
    pub compression: Compression,
    /// `ca_file`, `cert_file`, `key_file` apply to `https://` endpoints.
    pub tls: ClientTlsConfig,
}

impl profcol_api::config::Validate for OtlpHttpConfig {
    fn validate(&self, p: &mut profcol_api::config::Problems) {
        use profcol_api::config::checks;
        match &self.balancer {
            Some(b) => {
                if self.endpoint.is_some() || self.profiles_endpoint.is_some() {
                    p.add(
                        "balancer",
                        "cannot be used with endpoint or profiles_endpoint: the balancer names the addresses; \
                         remove endpoint (or balancer)",
                    );
                }
                p.nested("balancer", b);
                for e in balanced_urls(b, &self.tls) {
                    if e.starts_with("http://") {
                        p.check("", self.tls.check_plaintext(&e));
                    }
                }
            }
            None => {
                let endpoint = self.endpoint();
                p.check("endpoint", checks::http_url(endpoint.expose().trim()));
                if let Some(u) = &self.profiles_endpoint {
                    p.check("profiles_endpoint", checks::http_url(u.expose().trim()));
                }
                if endpoint.expose().trim().starts_with("http://") {
                    p.check("", self.tls.check_plaintext(&endpoint.redacted()));
                }
            }
        }
        if self.tls.server_name_override.is_some() {
            p.add(
                "tls.server_name_override",
                "is not supported by otlp_http; write the name the server's certificate is valid for as the endpoint's host",
            );
        }
        super::validate_headers(p, &self.headers);
        p.nested("tls", &self.tls);
    }
}

const DEFAULT_PORT: u16 = 4318;

/// The base URL of a balanced address: its own scheme, else `https://`
/// unless `tls.insecure`.
fn base_url(address: &str, tls: &ClientTlsConfig) -> String {
    let a = address.trim().trim_end_matches('/');
    if a.contains("://") {
        a.to_owned()
    } else if tls.insecure {
        format!("http://{a}")
    } else {
        format!("https://{a}")
    }
}

/// The base URLs a balancer config can produce (a DNS name: one, for the scheme).
fn balanced_urls(b: &BalancerConfig, tls: &ClientTlsConfig) -> Vec<String> {
    match &b.resolver {
        ResolverConfig::Static(s) => s.endpoints.iter().map(|e| base_url(e, tls)).collect(),
        ResolverConfig::Dns(d) => {
            vec![base_url(&format!("{}:{}", d.hostname.trim(), d.port.unwrap_or(DEFAULT_PORT)), tls)]
        }
    }
}

impl OtlpHttpConfig {
    /// The endpoint in use without a balancer.
    pub(crate) fn endpoint(&self) -> SecretUrl {
        self.endpoint.clone().unwrap_or_else(|| SecretUrl::new("http://localhost:4318"))
    }
}

impl Default for OtlpHttpConfig {
    fn default() -> Self {
        OtlpHttpConfig {
            endpoint: None,
            balancer: None,
            profiles_endpoint: None,
            encoding: HttpEncoding::Proto,
            headers: BTreeMap::new(),
            compression: Compression::Gzip,
            tls: ClientTlsConfig::default(),
        }
    }
}

pub(crate) fn factory_otlp_http() -> Arc<dyn Factory> {
    factory_with_metrics::<OtlpHttpConfig, _>(
        FactoryMeta {
            type_name: "otlp_http",
            kind: Kind::Exporter,
            stability: Stability::Alpha,
            description: "OTLP profiles over HTTP (POST /v1development/profiles), protobuf or JSON",
        },
        super::METRICS,
        |settings, cfg| Ok(Component::Exporter(Arc::new(OtlpHttpExporter::new(settings, cfg)?))),
    )
}

/// The `otlp_http` exporter component.
pub type OtlpHttpExporter = OtlpExporter<HttpTarget>;

/// What every address's sender shares.
pub(crate) struct Shared {
    id: String,
    headers: reqwest::header::HeaderMap,
    encoding: HttpEncoding,
    compression: Compression,
    counters: OtlpCounters,
}

/// One address: a client (its connection pool) and the URL it posts to.
pub struct HttpTarget {
    client: reqwest::Client,
    url: reqwest::Url,
    /// `url` without its credentials, for messages.
    shown: String,
    shared: Arc<Shared>,
}

/// A client as the config says; `pin`: the host name and the one address
/// it is sent to (a DNS balancer's address, so TLS checks the name).
fn client(cfg: &OtlpHttpConfig, pin: Option<(&str, std::net::SocketAddr)>) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(60));
    let (ca, ident) = cfg.tls.load()?;
    if let Some(ca) = ca {
        let certs = reqwest::Certificate::from_pem_bundle(&ca).map_err(|e| format!("tls.ca_file: {e}"))?;
        b = b.tls_built_in_root_certs(false);
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    if let Some((c, k)) = ident {
        let mut pem = k;
        pem.push(b'\n');
        pem.extend_from_slice(&c);
        b = b.identity(reqwest::Identity::from_pem(&pem).map_err(|e| format!("tls.cert_file/key_file: {e}"))?);
    }
    if let Some((host, addr)) = pin {
        b = b.resolve(host, addr);
    }
    b.build().map_err(|e| format!("cannot build the HTTP client: {e}"))
}

/// The profiles URL under a base URL, checked; and how messages show it.
fn profiles_url(url_text: SecretUrl) -> Result<(reqwest::Url, String), String> {
    // Messages and logs show the URL without its credentials.
    let shown = url_text.to_string();
    let url = reqwest::Url::parse(url_text.expose())
        .map_err(|e| format!("endpoint {shown:?} is not a URL ({e}); write e.g. http://host:4318"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("endpoint {shown:?}: the scheme must be http or https"));
    }
    Ok((url, shown))
}

impl Transport for HttpTarget {
    type Config = OtlpHttpConfig;
    type Shared = Shared;
    const DEFAULT_PORT: u16 = DEFAULT_PORT;

    fn balancer(cfg: &OtlpHttpConfig) -> Option<&BalancerConfig> {
        cfg.balancer.as_ref()
    }

    fn names_endpoint(cfg: &OtlpHttpConfig) -> bool {
        cfg.endpoint.is_some() || cfg.profiles_endpoint.is_some()
    }

    fn shared(cfg: &OtlpHttpConfig, id: &str, telemetry: &ComponentTelemetry) -> Result<Shared, String> {
        check_headers(&cfg.headers)?;
        if cfg.tls.server_name_override.is_some() {
            // reqwest checks the certificate against the URL's host only; ignoring
            // the setting would quietly verify another name than the one asked for.
            return Err("tls.server_name_override is not supported by otlp_http; write the name the server's \
                 certificate is valid for as the endpoint's host"
                .into());
        }
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in &cfg.headers {
            // Checked by check_headers above.
            if let (Ok(k), Ok(v)) = (reqwest::header::HeaderName::from_bytes(k.as_bytes()), v.expose().parse()) {
                headers.insert(k, v);
            }
        }
        Ok(Shared {
            counters: OtlpCounters::new(telemetry),
            id: id.to_owned(),
            headers,
            encoding: cfg.encoding,
            compression: cfg.compression,
        })
    }

    fn one(cfg: &OtlpHttpConfig, shared: Arc<Shared>) -> Result<Self, String> {
        let endpoint = cfg.endpoint();
        let url_text = SecretUrl::new(match &cfg.profiles_endpoint {
            Some(u) => u.expose().to_owned(),
            None => format!("{}{PROFILES_PATH}", endpoint.expose().trim_end_matches('/')),
        });
        let (url, shown) = profiles_url(url_text)?;
        if endpoint.expose().trim().starts_with("http://") {
            cfg.tls.check_plaintext(&endpoint.redacted())?;
        }
        Ok(HttpTarget { client: client(cfg, None)?, url, shown, shared })
    }

    fn connect(
        cfg: &OtlpHttpConfig,
        address: &str,
        dns_name: Option<&str>,
        shared: Arc<Shared>,
    ) -> Result<Self, String> {
        connect_address(cfg, address, dns_name, shared)
    }
}

impl OtlpExporter<HttpTarget> {
    pub fn new(settings: CreateSettings, cfg: OtlpHttpConfig) -> Result<Self, ComponentError> {
        super::exporter::new(settings, cfg)
    }

    /// As [`OtlpHttpExporter::new`], with `balancer`'s addresses from
    /// `resolver` (tests decide what a name resolves to).
    pub fn with_resolver(
        settings: CreateSettings,
        cfg: OtlpHttpConfig,
        resolver: Arc<dyn Resolver>,
    ) -> Result<Self, ComponentError> {
        super::exporter::build(settings, cfg, Some(resolver))
    }
}

/// The sender of one balanced address. With a DNS name the URL keeps the
/// name (TLS checks it, `Host` carries it) and the client is pinned to the
/// resolved address.
fn connect_address(
    cfg: &OtlpHttpConfig,
    address: &str,
    dns_name: Option<&str>,
    shared: Arc<Shared>,
) -> Result<HttpTarget, String> {
    let base = base_url(address, &cfg.tls);
    let pinned = dns_name.and_then(|name| Some((name, address.parse::<std::net::SocketAddr>().ok()?)));
    let base = match pinned {
        Some((name, addr)) => {
            format!("{}://{}:{}", base.split_once("://").map_or("https", |(s, _)| s), name, addr.port())
        }
        None => base,
    };
    if base.starts_with("http://") {
        cfg.tls.check_plaintext(&base)?;
    }
    let (url, mut shown) = profiles_url(SecretUrl::new(format!("{base}{PROFILES_PATH}")))?;
    if pinned.is_some() {
        shown = format!("{shown} ({address})");
    }
    Ok(HttpTarget { client: client(cfg, pinned)?, url, shown, shared })
}

impl HttpTarget {
    async fn post(&self, batch: &Profiles) -> Result<(), ExportError> {
        let s = &*self.shared;
        let (ct, body) = match s.encoding {
            HttpEncoding::Proto => ("application/x-protobuf", batch.encode_to_vec()),
            HttpEncoding::Json => ("application/json", batch.to_json().into_bytes()),
        };
        let mut req = self.client.post(self.url.clone()).headers(s.headers.clone()).header("content-type", ct);
        let body = match s.compression {
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
            // reqwest's own message would carry the URL with its credentials.
            let e = e.without_url();
            ExportError::Retryable { message: format!("POST {}: {}", self.shown, error_chain(&e)), retry_after: None }
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
            profcol_api::model::otlp_json::decode_response(&bytes).ok()
        } else {
            prost::Message::decode(bytes.as_ref()).ok()
        };
        match answer.and_then(|a| a.partial_success) {
            Some(p) => s.counters.partial(&s.id, &p, Shape::of(batch)),
            None => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl Target for HttpTarget {
    async fn send(&self, batch: &Profiles) -> Result<(), ExportError> {
        let r = self.post(batch).await;
        if let Err(e) = &r {
            self.shared.counters.count(&self.shared.id, e);
        }
        r
    }
}
