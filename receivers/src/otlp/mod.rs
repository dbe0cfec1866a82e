//! The `otlp` receiver: OTLP profiles over gRPC (default `localhost:4317`)
//! and HTTP (default `localhost:4318`, `POST /v1development/profiles`,
//! protobuf or JSON by `Content-Type`).
//!
//! Every request is size-capped (also after gzip decompression), decoded
//! without trusting it, and checked with [`Profiles::validate`]: malformed
//! input gets gRPC `INVALID_ARGUMENT` / HTTP 400 with the reason, never a
//! panic. When the pipeline does not take a batch within
//! `backpressure_timeout` (or refuses it) the sender is told to retry:
//! gRPC `UNAVAILABLE` / HTTP 503.
//!
//! At most `max_concurrent_requests` requests (gRPC and HTTP together) are
//! decoded and pushed at once: a request takes a slot once its whole body
//! arrived and keeps it until the pipeline took or refused its batch. Bodies
//! being read hold no slot (a slow sender cannot keep others from one, however
//! many connections it opens); their bytes are counted against a budget of
//! `max_concurrent_requests` × the size cap as they arrive (see [`body`]). So
//! the receiver's memory is bounded by slots × (2 × size cap + decode budget)
//! however many senders there are. A body must arrive within `read_timeout`
//! (and keep up `min_read_rate_kib` past it), or the sender gets
//! DEADLINE_EXCEEDED / 408. The decode budget (`max_decoded_size_mib`) is
//! checked on the bytes before decoding (`model::decode_budget`): a request
//! that would expand past it is refused unread. A request that finds no slot
//! (or no room in the read budget) free within `MAX_SLOT_WAIT` (1 s, at most
//! `backpressure_timeout`) is told to retry, as for backpressure.

mod body;
mod config;
mod grpc;
mod http;
#[cfg(feature = "test-support")]
pub mod testing;
mod tls;

pub use config::{GrpcConfig, HttpConfig, OtlpReceiverConfig, Protocols, TlsServerConfig};

use profcol_api::component::{
    factory_with_metrics, Component, ComponentError, ConsumeError, CreateSettings, Factory, FactoryMeta, Kind, Next,
};
use profcol_api::listeners;
use profcol_api::model::{decode_budget, DecodeError, ExportProfilesPartialSuccess};
use profcol_api::telemetry::{ComponentTelemetry, Counter, MetricDef};
use profcol_api::{Profiles, Receiver, Stability};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long [`Receiver::shutdown`] waits for in-flight requests.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The longest a request waits for one of the `max_concurrent_requests`
/// slots (never longer than `backpressure_timeout`). With a healthy pipeline
/// a slot frees within milliseconds, so this absorbs bursts; when all slots
/// wait on a slow pipeline they are likely to wait up to
/// `backpressure_timeout`, and a longer wait would only hold the sender's
/// connection and eat its export timeout (default 5 s, like
/// `backpressure_timeout`) before the same retry-later answer. 1 s matches
/// the `Retry-After: 1` of the 503.
pub(crate) const MAX_SLOT_WAIT: Duration = Duration::from_secs(1);

const INVALID_REQUESTS: MetricDef =
    MetricDef::counter("invalid_requests_total", "1", "Requests refused as malformed or too large.");
const PARTIAL_REQUESTS: MetricDef = MetricDef::counter(
    "partial_requests_total",
    "1",
    "Requests accepted in part: invalid profiles dropped, the sender told with partial_success.",
);
const BACKPRESSURE_REFUSALS: MetricDef = MetricDef::counter(
    "backpressure_refusals_total",
    "1",
    "Requests answered with retry-later because the pipeline pushed back \
     (or max_concurrent_requests were in flight).",
);
const INFLIGHT_REFUSALS: MetricDef = MetricDef::counter(
    "inflight_refusals_total",
    "1",
    "Requests answered with retry-later because max_concurrent_requests were in flight.",
);
const DECODE_BUDGET_REFUSALS: MetricDef = MetricDef::counter(
    "decode_budget_refusals_total",
    "1",
    "Requests refused unread because they would decode past max_decoded_size_mib.",
);
const READ_TIMEOUTS: MetricDef = MetricDef::counter(
    "read_timeouts_total",
    "1",
    "Requests whose body did not arrive within read_timeout / min_read_rate_kib (DEADLINE_EXCEEDED / 408).",
);
/// The receiver's own series.
pub(crate) const METRICS: &[MetricDef] = &[
    INVALID_REQUESTS,
    PARTIAL_REQUESTS,
    BACKPRESSURE_REFUSALS,
    INFLIGHT_REFUSALS,
    DECODE_BUDGET_REFUSALS,
    READ_TIMEOUTS,
];

pub fn factory_otlp() -> Arc<dyn Factory> {
    factory_with_metrics::<OtlpReceiverConfig, _>(
        FactoryMeta {
            type_name: "otlp",
            kind: Kind::Receiver,
            stability: Stability::Alpha,
            description: "OTLP profiles over gRPC (:4317) and HTTP (:4318, /v1development/profiles)",
        },
        METRICS,
        |settings, cfg| Ok(Component::Receiver(Arc::new(OtlpReceiver::new(settings, cfg)?))),
    )
}

/// Why a request was not taken.
#[derive(Debug)]
pub(crate) enum IngestError {
    /// The request is malformed (bad bytes, broken invariants): do not retry.
    Invalid(String),
    /// Too big (before or after decompression).
    TooLarge(String),
    /// The pipeline pushed back: retry later.
    Unavailable(String),
    /// A processor refused the data for good: a retry would fail the same way.
    Rejected(String),
    /// The body did not arrive within its deadlines (`read_timeout`, `min_read_rate_kib`).
    TimedOut(String),
}

/// What both servers share: validation and the push into the pipeline.
pub(crate) struct Ingest {
    next: Next,
    backpressure_timeout: Duration,
    telemetry: ComponentTelemetry,
    invalid: Counter,
    /// Requests accepted in part (invalid profiles dropped, partial_success answered).
    partial_requests: Counter,
    busy: Counter,
    /// `max_concurrent_requests` permits, shared by the gRPC and HTTP servers.
    slots: Arc<tokio::sync::Semaphore>,
    max_concurrent: usize,
    slot_wait: Duration,
    /// Requests refused because no slot freed within `slot_wait`.
    inflight_refused: Counter,
    /// `max_decoded_size_mib` in bytes.
    max_decoded: usize,
    /// Requests refused because they would decode past `max_decoded`.
    over_budget: Counter,
    read_timeout: Duration,
    /// `min_read_rate_kib` in bytes per second.
    min_read_rate: f64,
    /// Requests whose body missed its deadlines.
    read_timeouts: Counter,
    /// Bytes of bodies being read or decoded, shared by both servers.
    read_budget: body::ReadBudget,
    /// Its size, for the message.
    read_budget_bytes: usize,
}

/// One of the `max_concurrent_requests` slots; freed on drop.
pub(crate) type Slot = tokio::sync::OwnedSemaphorePermit;

impl Ingest {
    /// Decodes a protobuf request, after checking what it would decode to
    /// against `max_decoded_size_mib` (one pass over the bytes, nothing
    /// allocated): a request over the budget is never decoded.
    pub(crate) fn decode_proto(&self, bytes: &[u8]) -> Result<Profiles, IngestError> {
        // Most requests are small enough that their length alone proves they
        // fit; only larger ones are walked.
        if decode_budget::proto_size_bound(bytes.len()) > self.max_decoded {
            decode_budget::proto_decoded_size(bytes, self.max_decoded).map_err(|e| self.budget_error(e))?;
        }
        // Packed: a batch forwarded as it came holds its samples at ~1× their
        // wire size; the host unpacks it for whatever reads them.
        Profiles::decode_packed(bytes).map_err(|e| match e {
            DecodeError::Protobuf(e) => {
                IngestError::Invalid(format!("not a valid ExportProfilesServiceRequest protobuf: {e}"))
            }
            e => IngestError::Invalid(e.to_string()),
        })
    }

    /// Decodes an OTLP/JSON request, after the same budget check as
    /// [`Ingest::decode_proto`] (JSON counts its parse tree as well).
    pub(crate) fn decode_json(&self, bytes: &[u8]) -> Result<Profiles, IngestError> {
        decode_budget::json_decoded_size(bytes, self.max_decoded).map_err(|e| self.budget_error(e))?;
        // `ExportProfilesServiceRequest` and `ProfilesData` have the same fields.
        Profiles::from_json(bytes)
            .map_err(|e| IngestError::Invalid(format!("not a valid ExportProfilesServiceRequest JSON document: {e}")))
    }

    fn budget_error(&self, e: decode_budget::BudgetError) -> IngestError {
        match e {
            decode_budget::BudgetError::OverBudget { .. } => {
                self.over_budget.inc();
                IngestError::TooLarge(format!(
                    "the request would take more than this gateway's max_decoded_size_mib ({} MiB) once decoded \
                     ({e}); send smaller requests",
                    self.max_decoded as f64 / 1048576.0
                ))
            }
            decode_budget::BudgetError::Malformed(m) => {
                IngestError::Invalid(format!("not a valid ExportProfilesServiceRequest protobuf: {m}"))
            }
        }
    }

    /// Takes a slot for one request, waiting up to `slot_wait` for one to
    /// free. Call once the request's body is read (a body being read holds
    /// only its bytes of the read budget), and hold the slot until
    /// [`Ingest::accept`] returned: a request without a slot never has its
    /// inflated or decoded form in memory.
    pub(crate) async fn admit(&self) -> Result<Slot, IngestError> {
        // `timeout` polls the acquire first, so a free slot is taken even
        // when the wait is zero.
        match tokio::time::timeout(self.slot_wait, self.slots.clone().acquire_owned()).await {
            Ok(Ok(slot)) => Ok(slot),
            // Err(Closed) cannot happen (the semaphore is never closed); answer retry-later anyway.
            Ok(Err(_)) | Err(_) => {
                self.inflight_refused.inc();
                self.busy.inc();
                Err(IngestError::Unavailable(format!(
                    "this gateway has {} {} in flight (its max_concurrent_requests) and none finished \
                     within {}; retry later",
                    self.max_concurrent,
                    if self.max_concurrent == 1 { "request" } else { "requests" },
                    humantime::format_duration(self.slot_wait)
                )))
            }
        }
    }

    /// The deadlines and cap of a body of at most `max` bytes.
    pub(crate) fn read_limits(&self, max: usize) -> body::ReadLimits {
        body::ReadLimits { read_timeout: self.read_timeout, min_rate: self.min_read_rate, max }
    }

    /// A reader of `body`, at most `max` bytes, within the deadlines and the read budget.
    pub(crate) fn reader<B>(&self, body: B, max: usize) -> body::BodyReader<B>
    where
        B: http_body::Body<Data = bytes::Bytes>,
        B::Error: std::fmt::Display,
    {
        body::BodyReader::new(body, self.read_limits(max), self.read_budget.clone())
    }

    /// What the sender is told when its body was not read; `cap_key` names
    /// the size limit it passed (the server's config key). A refusal for want
    /// of room in the read budget is counted here, as [`Ingest::admit`] counts its own.
    pub(crate) fn read_error(&self, e: body::ReadError, max: usize, cap_key: &str) -> IngestError {
        match e {
            body::ReadError::TooLarge => IngestError::TooLarge(format!(
                "the request body is larger than this gateway's {cap_key} ({max} bytes); send smaller requests"
            )),
            body::ReadError::TimedOut { received, waited } => IngestError::TimedOut(format!(
                "the request body did not arrive in time: {received} bytes in {:.1} s (read_timeout {}, then at \
                 least {} KiB/s); send it faster",
                waited.as_secs_f64(),
                humantime::format_duration(self.read_timeout),
                self.min_read_rate / 1024.0
            )),
            body::ReadError::Broken(why) => {
                IngestError::Invalid(format!("the request body did not arrive whole: {why}"))
            }
            body::ReadError::Busy => {
                self.inflight_refused.inc();
                self.busy.inc();
                IngestError::Unavailable(format!(
                    "this gateway holds {} MiB of request bodies (max_concurrent_requests × max_recv_msg_size_mib) \
                     and none finished within {}; retry later",
                    self.read_budget_bytes >> 20,
                    humantime::format_duration(self.slot_wait)
                ))
            }
        }
    }

    /// Counts an error the server found before [`Ingest::accept`].
    pub(crate) fn count(&self, e: &IngestError) {
        match e {
            IngestError::TimedOut(_) => self.read_timeouts.inc(),
            IngestError::Invalid(_) | IngestError::TooLarge(_) => self.invalid.inc(),
            IngestError::Unavailable(_) => self.busy.inc(),
            // Counted as refused by `Next::send`.
            IngestError::Rejected(_) => {}
        }
    }

    /// Validates a decoded request and pushes it into the pipeline. Profiles
    /// that break an invariant are dropped and the rest is taken: the answer
    /// is then a `partial_success` naming how many profiles were rejected and
    /// why (OTLP: the sender must not retry it). A request with nothing valid
    /// left, or a broken dictionary, is refused whole.
    pub(crate) async fn accept(
        &self,
        mut batch: Profiles,
    ) -> Result<Option<ExportProfilesPartialSuccess>, IngestError> {
        let partial = match batch.drop_invalid_profiles() {
            Ok(None) => None,
            Ok(Some(d)) if batch.profiles().next().is_some() => {
                self.telemetry.refused.add(d.samples);
                self.partial_requests.inc();
                Some(ExportProfilesPartialSuccess {
                    rejected_profiles: i64::try_from(d.profiles).unwrap_or(i64::MAX),
                    error_message: format!(
                        "{} invalid {} dropped, the rest accepted; the first: {}",
                        d.profiles,
                        if d.profiles == 1 { "profile" } else { "profiles" },
                        d.first
                    ),
                })
            }
            Ok(Some(d)) => {
                let e = IngestError::Invalid(d.first.to_string());
                self.count(&e);
                return Err(e);
            }
            Err(e) => {
                let e = IngestError::Invalid(e.to_string());
                self.count(&e);
                return Err(e);
            }
        };
        if batch.is_empty() && batch.0.resource_profiles.is_empty() {
            return Ok(partial);
        }
        let n = batch.sample_count() as u64;
        match tokio::time::timeout(self.backpressure_timeout, self.next.send(batch)).await {
            Ok(Ok(())) => Ok(partial),
            Ok(Err(ConsumeError::Rejected(why))) => {
                Err(IngestError::Rejected(format!("the pipeline rejected the batch ({why}); do not retry it")))
            }
            Ok(Err(e)) => {
                let e = IngestError::Unavailable(format!("the pipeline refused the batch ({e}); retry later"));
                self.count(&e);
                Err(e)
            }
            Err(_) => {
                self.telemetry.refused.add(n);
                let e = IngestError::Unavailable(format!(
                    "the pipeline did not take the batch within {}; retry later",
                    humantime::format_duration(self.backpressure_timeout)
                ));
                self.count(&e);
                Err(e)
            }
        }
    }
}

struct Running {
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

/// The `otlp` receiver component.
pub struct OtlpReceiver {
    settings: CreateSettings,
    cfg: OtlpReceiverConfig,
    running: Mutex<Option<Running>>,
    addrs: Mutex<(Option<SocketAddr>, Option<SocketAddr>)>,
}

impl OtlpReceiver {
    pub fn new(settings: CreateSettings, cfg: OtlpReceiverConfig) -> Result<Self, ComponentError> {
        // The same check `profcol validate` runs; kept here for callers
        // that build the receiver directly.
        let mut problems = profcol_api::config::Problems::new();
        profcol_api::config::Validate::validate(&cfg, &mut problems);
        if let Some(e) = problems.into_errors().into_iter().next() {
            return Err(ComponentError::msg(format!("receiver {}: {e}", settings.id)));
        }
        Ok(OtlpReceiver { settings, cfg, running: Mutex::new(None), addrs: Mutex::new((None, None)) })
    }

    /// The address the gRPC server listens on, once started.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.addrs.lock().unwrap_or_else(|p| p.into_inner()).0
    }

    /// The address the HTTP server listens on, once started.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.addrs.lock().unwrap_or_else(|p| p.into_inner()).1
    }
}

/// Listens on `endpoint` (host:port): the socket a running instance of this
/// process listens on there (see [`listeners`]), or a new one, with an error
/// that says what to do.
pub(crate) async fn bind(
    id: &str,
    proto: &str,
    endpoint: &str,
) -> Result<Arc<tokio::net::TcpListener>, ComponentError> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(endpoint)
        .await
        .map_err(|e| {
            ComponentError::msg(format!(
                "receiver {id}: protocols.{proto}.endpoint {endpoint:?} is not a host:port that resolves: {e}"
            ))
        })?
        .collect();
    // Prefer IPv4 for `localhost` so the usual clients find us.
    let addr = addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()).copied().ok_or_else(|| {
        ComponentError::msg(format!("receiver {id}: protocols.{proto}.endpoint {endpoint:?} resolves to no address"))
    })?;
    if addr.port() != 0 {
        if let Some(l) = listeners::find("otlp", addr) {
            return Ok(l);
        }
    }
    let l = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
            " (another process, perhaps another collector, holds the port; stop it or change the endpoint)"
        } else {
            ""
        };
        ComponentError::msg(format!(
            "receiver {id}: cannot listen on {addr} (protocols.{proto}.endpoint {endpoint:?}): {e}{hint}"
        ))
    })?;
    let l = Arc::new(l);
    listeners::register("otlp", &l);
    Ok(l)
}

#[async_trait::async_trait]
impl Receiver for OtlpReceiver {
    async fn start(&self, next: Next) -> Result<(), ComponentError> {
        let id = self.settings.id.to_string();
        let tel = &self.settings.telemetry;
        // Room for max_concurrent_requests bodies of the larger cap (gRPC's
        // with its 5-byte message prefix).
        let cap = [
            self.cfg.protocols.grpc.as_ref().map(|g| config::mib(g.max_recv_msg_size_mib).saturating_add(5)),
            self.cfg.protocols.http.as_ref().map(|h| config::mib(h.max_recv_msg_size_mib)),
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(1);
        let read_budget_bytes =
            cap.saturating_mul(self.cfg.max_concurrent_requests).min(tokio::sync::Semaphore::MAX_PERMITS);
        let slot_wait = self.cfg.backpressure_timeout.min(MAX_SLOT_WAIT);
        let ingest = Arc::new(Ingest {
            next,
            backpressure_timeout: self.cfg.backpressure_timeout,
            telemetry: tel.clone(),
            invalid: tel.counter_of(&INVALID_REQUESTS),
            partial_requests: tel.counter_of(&PARTIAL_REQUESTS),
            busy: tel.counter_of(&BACKPRESSURE_REFUSALS),
            slots: Arc::new(tokio::sync::Semaphore::new(self.cfg.max_concurrent_requests)),
            max_concurrent: self.cfg.max_concurrent_requests,
            slot_wait,
            inflight_refused: tel.counter_of(&INFLIGHT_REFUSALS),
            max_decoded: config::mib(self.cfg.max_decoded_size_mib),
            over_budget: tel.counter_of(&DECODE_BUDGET_REFUSALS),
            read_timeout: self.cfg.read_timeout,
            min_read_rate: self.cfg.min_read_rate_kib * 1024.0,
            read_timeouts: tel.counter_of(&READ_TIMEOUTS),
            read_budget: body::ReadBudget::new(read_budget_bytes, slot_wait),
            read_budget_bytes,
        });
        let cancel = CancellationToken::new();
        let mut tasks = Vec::new();
        let (mut grpc_addr, mut http_addr) = (None, None);
        // Bind both first so a taken port fails start-up before anything runs.
        // Started again after a shutdown (a reload that failed puts the old
        // instance back): the same ports, even where the config says port 0.
        let (was_grpc, was_http) = *self.addrs.lock().unwrap_or_else(|p| p.into_inner());
        let endpoint = |configured: &str, was: Option<SocketAddr>| match was {
            Some(a) if configured.ends_with(":0") => format!("{}:{}", configured.trim_end_matches(":0"), a.port()),
            _ => configured.to_owned(),
        };
        let grpc_l = match &self.cfg.protocols.grpc {
            Some(g) => Some((bind(&id, "grpc", &endpoint(&g.endpoint, was_grpc)).await?, g)),
            None => None,
        };
        let http_l = match &self.cfg.protocols.http {
            Some(h) => Some((bind(&id, "http", &endpoint(&h.endpoint, was_http)).await?, h)),
            None => None,
        };
        if let Some((l, g)) = grpc_l {
            grpc_addr = l.local_addr().ok();
            tasks.push(grpc::serve(&id, l, g, ingest.clone(), cancel.clone())?);
        }
        if let Some((l, h)) = http_l {
            http_addr = l.local_addr().ok();
            match http::serve(&id, l, h, ingest.clone(), cancel.clone()) {
                Ok(t) => tasks.push(t),
                Err(e) => {
                    // A failed start leaves nothing running: the gRPC server goes too.
                    cancel.cancel();
                    for t in tasks {
                        let _ = t.await;
                    }
                    return Err(e);
                }
            }
        }
        tracing::info!(receiver = %id, grpc = ?grpc_addr, http = ?http_addr, "otlp receiver listening");
        *self.addrs.lock().unwrap_or_else(|p| p.into_inner()) = (grpc_addr, http_addr);
        *self.running.lock().unwrap_or_else(|p| p.into_inner()) = Some(Running { cancel, tasks });
        Ok(())
    }

    /// The TCP ports it listens on: once started, the ports it bound; before,
    /// the configured ones (port 0, any free port, clashes with nothing),
    /// except those where a running instance listens at the same address:
    /// that socket is shared ([`listeners`]), so a reload that keeps an
    /// endpoint stops nothing first and a failed one closes no port.
    fn exclusive_resources(&self) -> Vec<String> {
        let (grpc, http) = *self.addrs.lock().unwrap_or_else(|p| p.into_inner());
        let configured = |e: Option<&str>| {
            e.filter(|e| !listeners::shared("otlp", e))
                .and_then(|e| e.rsplit_once(':'))
                .and_then(|(_, p)| p.parse::<u16>().ok())
                .filter(|p| *p != 0)
        };
        [
            grpc.map(|a| a.port())
                .or_else(|| configured(self.cfg.protocols.grpc.as_ref().map(|g| g.endpoint.as_str()))),
            http.map(|a| a.port())
                .or_else(|| configured(self.cfg.protocols.http.as_ref().map(|h| h.endpoint.as_str()))),
        ]
        .into_iter()
        .flatten()
        .map(|p| format!("tcp port {p}"))
        .collect()
    }

    async fn shutdown(&self) -> Result<(), ComponentError> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(Running { cancel, tasks }) = running else { return Ok(()) };
        cancel.cancel();
        for mut t in tasks {
            match tokio::time::timeout(SHUTDOWN_GRACE, &mut t).await {
                Ok(_) => {}
                Err(_) => {
                    tracing::warn!(receiver = %self.settings.id, "in-flight requests did not finish within {SHUTDOWN_GRACE:?}; closing them");
                    t.abort();
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profcol_api::component::ComponentId;

    fn create(cfg: OtlpReceiverConfig) -> Result<OtlpReceiver, ComponentError> {
        let id: ComponentId = "otlp".parse().unwrap();
        let settings = CreateSettings {
            telemetry: ComponentTelemetry::detached(Kind::Receiver, &id),
            id,
            services: Default::default(),
        };
        OtlpReceiver::new(settings, cfg)
    }

    #[test]
    fn a_size_cap_that_is_not_a_positive_number_is_a_config_error() {
        for bad in [0.0, -1.0, f64::NAN] {
            let mut cfg = OtlpReceiverConfig::default();
            cfg.protocols.grpc = Some(GrpcConfig { max_recv_msg_size_mib: bad, ..Default::default() });
            let e = create(cfg).err().expect("refused").to_string();
            assert!(e.contains("protocols.grpc.max_recv_msg_size_mib"), "{e}");
            let mut cfg = OtlpReceiverConfig::default();
            cfg.protocols.http = Some(HttpConfig { max_recv_msg_size_mib: bad, ..Default::default() });
            let e = create(cfg).err().expect("refused").to_string();
            assert!(e.contains("protocols.http.max_recv_msg_size_mib"), "{e}");
        }
        let mut cfg = OtlpReceiverConfig::default();
        cfg.protocols.http = Some(HttpConfig { max_recv_msg_size_mib: 0.5, ..Default::default() });
        create(cfg).unwrap();
    }

    fn http_only(max_concurrent_requests: usize) -> OtlpReceiverConfig {
        let mut cfg = OtlpReceiverConfig { max_concurrent_requests, ..Default::default() };
        cfg.protocols.http = Some(HttpConfig::default());
        cfg
    }

    #[test]
    fn max_concurrent_requests_defaults_to_16_and_0_is_a_config_error() {
        assert_eq!(OtlpReceiverConfig::default().max_concurrent_requests, 16);
        let e = create(http_only(0)).err().expect("refused").to_string();
        assert!(e.contains("otlp") && e.contains("max_concurrent_requests") && e.contains("not 0"), "{e}");
        // Past what a semaphore holds: refused, not a panic at start.
        let e = create(http_only(usize::MAX)).err().expect("refused").to_string();
        assert!(e.contains("max_concurrent_requests"), "{e}");
        create(http_only(1)).unwrap();
    }

    #[test]
    fn max_concurrent_requests_is_read_from_yaml() {
        let cfg: OtlpReceiverConfig =
            profcol_config::parse_section("protocols: {grpc: {}}\nmax_concurrent_requests: 2\n")
                .unwrap()
                .decode()
                .unwrap();
        assert_eq!(cfg.max_concurrent_requests, 2);
        assert_eq!(cfg.backpressure_timeout, Duration::from_secs(5));
        let cfg: OtlpReceiverConfig =
            profcol_config::parse_section("protocols: {grpc: {}}\n").unwrap().decode().unwrap();
        assert_eq!(cfg.max_concurrent_requests, 16);
        let e = create(
            profcol_config::parse_section("protocols: {http: {}}\nmax_concurrent_requests: 0\n")
                .unwrap()
                .decode()
                .unwrap(),
        )
        .err()
        .expect("refused")
        .to_string();
        assert!(e.contains("max_concurrent_requests"), "{e}");
    }

    #[tokio::test]
    async fn a_request_waits_at_most_the_slot_wait_then_is_told_to_retry() {
        let id: ComponentId = "otlp".parse().unwrap();
        let tel = ComponentTelemetry::detached(Kind::Receiver, &id);
        let ingest = |bp: Duration| Ingest {
            next: Next::new(vec![], tel.clone()),
            backpressure_timeout: bp,
            telemetry: tel.clone(),
            invalid: tel.counter_of(&INVALID_REQUESTS),
            partial_requests: tel.counter_of(&PARTIAL_REQUESTS),
            busy: tel.counter_of(&BACKPRESSURE_REFUSALS),
            slots: Arc::new(tokio::sync::Semaphore::new(1)),
            max_concurrent: 1,
            slot_wait: bp.min(MAX_SLOT_WAIT),
            inflight_refused: tel.counter_of(&INFLIGHT_REFUSALS),
            max_decoded: usize::MAX,
            over_budget: tel.counter_of(&DECODE_BUDGET_REFUSALS),
            read_timeout: Duration::from_secs(5),
            min_read_rate: 65536.0,
            read_timeouts: tel.counter_of(&READ_TIMEOUTS),
            read_budget: body::ReadBudget::new(1 << 20, bp.min(MAX_SLOT_WAIT)),
            read_budget_bytes: 1 << 20,
        };
        // A zero wait still takes a free slot.
        let i = ingest(Duration::ZERO);
        let held = i.admit().await.unwrap();
        let t = std::time::Instant::now();
        let e = i.admit().await.unwrap_err();
        assert!(t.elapsed() < Duration::from_millis(500));
        assert!(matches!(&e, IngestError::Unavailable(m) if m.contains("has 1 request in flight")), "{e:?}");
        drop(held);
        let _again = i.admit().await.unwrap();
        // The wait is capped at MAX_SLOT_WAIT even with a long backpressure_timeout.
        let i = ingest(Duration::from_secs(60));
        let _held = i.admit().await.unwrap();
        let t = std::time::Instant::now();
        i.admit().await.unwrap_err();
        let waited = t.elapsed();
        assert!(waited >= MAX_SLOT_WAIT && waited < MAX_SLOT_WAIT * 3, "{waited:?}");
        assert_eq!(tel.counter_of(&INFLIGHT_REFUSALS).get(), 2);
        assert_eq!(tel.counter_of(&BACKPRESSURE_REFUSALS).get(), 2);
    }
}
