//! `balancer:` on the OTLP exporters: the load of many agents spread over a
//! tier of gateways (the OTel Collector's loadbalancing exporter's model).
//!
//! A Kubernetes Service balances connections, not requests, and an OTLP
//! connection lives for hours: behind one address every agent stays on the
//! gateway pod it first reached. The balancer instead resolves a name (DNS,
//! e.g. a headless Service) or takes a static list, holds one connection per
//! address (each made exactly as `endpoint` would be, with the exporter's
//! own TLS, headers, compression), and picks an address per batch: round
//! robin, or by a resource attribute's value (`routing_key`) so that all
//! profiles of, say, one service meet on one gateway. It re-resolves every
//! `interval`; an address that disappears is dropped from the list at once
//! and its connection closes when the requests already on it finish. A batch
//! that fails with a retryable error is sent to another address (up to
//! [`MAX_ATTEMPTS`] in all) before the exporter reports the failure to the
//! host, whose queue and retry schedule stay the exporter's, not per address.

use crate::delivered::Delivered;
use profcol_api::model::{any_value, pb, AnyValue};
use profcol_api::telemetry::{ComponentTelemetry, Counter, Gauge, MetricDef};
use profcol_api::{ExportError, Profiles};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

/// Addresses one batch is tried on before the export fails: the first and
/// two others. Enough to step over a gateway that just went away, without
/// sweeping a whole tier when the backend behind it is down.
pub(crate) const MAX_ATTEMPTS: usize = 3;

/// `balancer: { resolver: ..., routing_key: ... }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BalancerConfig {
    /// Where the gateway addresses come from: `dns: {hostname, port, interval}`
    /// or `static: {endpoints: [host:port, ...]}`.
    pub resolver: ResolverConfig,
    /// Resource attribute whose value picks the address (e.g. `service.name`):
    /// every batch with the same value goes to the same gateway while the
    /// address list stays the same (a batch with several values is split).
    /// Unset: round robin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_key: Option<String>,
}

/// `resolver: { dns: ... } | { static: ... }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum ResolverConfig {
    /// A DNS name whose A/AAAA records are the gateways (a headless Service).
    Dns(DnsResolverConfig),
    /// A fixed list of gateways.
    Static(StaticResolverConfig),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DnsResolverConfig {
    /// The name to resolve, e.g. `profcol-gateway-headless.profcol.svc.cluster.local`.
    pub hostname: String,
    /// Port of every resolved address (default: 4317 for `otlp`, 4318 for `otlp_http`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// How often the name is resolved again (gateways added and removed).
    #[serde(with = "humantime_serde", default = "default_interval")]
    #[schemars(with = "profcol_api::config::schema::DurationText")]
    pub interval: Duration,
}

fn default_interval() -> Duration {
    Duration::from_secs(5)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StaticResolverConfig {
    /// `host:port` (or `http(s)://host:port`) of each gateway.
    pub endpoints: Vec<String>,
}

impl profcol_api::config::Validate for BalancerConfig {
    fn validate(&self, p: &mut profcol_api::config::Problems) {
        use profcol_api::config::checks;
        match &self.resolver {
            ResolverConfig::Dns(d) => {
                let h = d.hostname.trim();
                if h.is_empty() {
                    p.add("resolver.dns.hostname", "is empty; name the gateways' DNS name (a headless Service)");
                } else {
                    // The name alone: the port is `port`, the scheme `tls`.
                    p.check("resolver.dns.hostname", checks::host_port(&format!("{h}:1"), false).map_err(|_| {
                        format!("{h:?} is not a host name; write the name only (no scheme, no port), e.g. gateway.profcol.svc")
                    }));
                }
                if d.port == Some(0) {
                    p.add("resolver.dns.port", "0 is not a port; use 1-65535");
                }
                if d.interval < Duration::from_millis(100) || d.interval > Duration::from_secs(3600) {
                    p.add(
                        "resolver.dns.interval",
                        format!(
                            "{} is out of range; use 100ms to 1h (default 5s)",
                            humantime::format_duration(d.interval)
                        ),
                    );
                }
            }
            ResolverConfig::Static(s) => {
                if s.endpoints.is_empty() {
                    p.add("resolver.static.endpoints", "is empty; list at least one gateway as host:port");
                }
                for (i, e) in s.endpoints.iter().enumerate() {
                    let e = e.trim();
                    let r = match e.split_once("://") {
                        Some(_) => checks::http_url(e),
                        None => checks::host_port(e, false),
                    };
                    p.check(&format!("resolver.static.endpoints.{i}"), r);
                    if s.endpoints[..i].iter().any(|o| o.trim() == e) {
                        p.add(&format!("resolver.static.endpoints.{i}"), format!("{e:?} is listed twice"));
                    }
                }
            }
        }
        if self.routing_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
            p.add("routing_key", "is empty; name a resource attribute (e.g. service.name) or remove the key");
        }
    }
}

/// Says what a name resolves to: `host:port` strings, as `endpoint` takes
/// them. Behind a trait so tests decide what a name resolves to.
#[async_trait::async_trait]
pub trait Resolver: Send + Sync + 'static {
    async fn resolve(&self) -> Result<Vec<String>, String>;
    /// For messages: the name or list being resolved.
    fn describe(&self) -> String;
}

/// The system resolver (getaddrinfo through tokio).
pub(crate) struct DnsResolver {
    pub(crate) hostname: String,
    pub(crate) port: u16,
}

#[async_trait::async_trait]
impl Resolver for DnsResolver {
    async fn resolve(&self) -> Result<Vec<String>, String> {
        let addrs = tokio::net::lookup_host((self.hostname.as_str(), self.port))
            .await
            .map_err(|e| format!("cannot resolve {:?}: {e}", self.hostname))?;
        // SocketAddr's Display brackets IPv6: "[fd00::1]:4317".
        Ok(addrs.map(|a| a.to_string()).collect())
    }
    fn describe(&self) -> String {
        format!("dns {}:{}", self.hostname, self.port)
    }
}

/// A fixed list.
pub(crate) struct StaticResolver(pub(crate) Vec<String>);

#[async_trait::async_trait]
impl Resolver for StaticResolver {
    async fn resolve(&self) -> Result<Vec<String>, String> {
        Ok(self.0.clone())
    }
    fn describe(&self) -> String {
        format!("static {:?}", self.0)
    }
}

impl BalancerConfig {
    /// The resolver the config names; `default_port` for `dns` without a port.
    pub(crate) fn resolver(&self, default_port: u16) -> Arc<dyn Resolver> {
        match &self.resolver {
            ResolverConfig::Dns(d) => {
                Arc::new(DnsResolver { hostname: d.hostname.trim().to_owned(), port: d.port.unwrap_or(default_port) })
            }
            ResolverConfig::Static(s) => {
                Arc::new(StaticResolver(s.endpoints.iter().map(|e| e.trim().to_owned()).collect()))
            }
        }
    }

    /// How often addresses are resolved again (a static list: never changes,
    /// but is looked at once a minute all the same, which costs nothing).
    pub(crate) fn interval(&self) -> Duration {
        match &self.resolver {
            ResolverConfig::Dns(d) => d.interval,
            ResolverConfig::Static(_) => Duration::from_secs(60),
        }
    }

    /// The DNS name, for TLS: the certificate is checked against it, not
    /// against the address it resolved to.
    pub(crate) fn dns_name(&self) -> Option<&str> {
        match &self.resolver {
            ResolverConfig::Dns(d) => Some(d.hostname.trim()),
            ResolverConfig::Static(_) => None,
        }
    }
}

/// One address's sender: what the exporter does with `endpoint`.
#[async_trait::async_trait]
pub trait Target: Send + Sync + 'static {
    async fn send(&self, batch: &Profiles) -> Result<(), ExportError>;
}

/// Makes the sender of one address (no I/O: connections are lazy).
pub(crate) type Connect<T> = Box<dyn Fn(&str) -> Result<T, String> + Send + Sync>;

struct Member<T> {
    address: String,
    target: T,
    /// Retryable failures in a row; a member that has some is tried after
    /// the healthy ones until `down_until` (ms on the balancer's clock).
    failures: AtomicU32,
    down_until: AtomicU64,
}

impl<T> Member<T> {
    fn is_down(&self, now: u64) -> bool {
        self.down_until.load(Ordering::Relaxed) > now
    }

    /// Backs off 0.5 s, 1 s, 2 s, ... up to 30 s while it keeps failing.
    fn failed(&self, now: u64) {
        let n = self.failures.fetch_add(1, Ordering::Relaxed).min(6);
        self.down_until.store(now + (500u64 << n).min(30_000), Ordering::Relaxed);
    }

    fn succeeded(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
            self.down_until.store(0, Ordering::Relaxed);
        }
    }
}

pub(crate) const ENDPOINTS: MetricDef =
    MetricDef::gauge("balancer_endpoints", "1", "Gateway addresses the balancer currently sends to.");
pub(crate) const FAILOVERS: MetricDef =
    MetricDef::counter("balancer_failovers_total", "1", "Batches sent to another address after a retryable failure.");
pub(crate) const RESOLVE_FAILURES: MetricDef = MetricDef::counter(
    "balancer_resolve_failures_total",
    "1",
    "Resolutions that failed (the previous address list was kept).",
);

/// The balancer of one exporter.
pub(crate) struct Balancer<T: Target> {
    id: String,
    resolver: Arc<dyn Resolver>,
    interval: Duration,
    connect: Connect<T>,
    routing_key: Option<String>,
    members: RwLock<Arc<[Arc<Member<T>>]>>,
    next: AtomicUsize,
    epoch: Instant,
    /// Parts of split batches that went out while another part failed, so
    /// that the host's retry of the batch sends only what is missing.
    delivered: Delivered,
    any_delivered: AtomicBool,
    refreshing: tokio::sync::Mutex<()>,
    stop: tokio_util::sync::CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    endpoints: Gauge,
    failovers: Counter,
    resolve_failures: Counter,
}

impl<T: Target> Balancer<T> {
    pub(crate) fn new(
        id: &str,
        telemetry: &ComponentTelemetry,
        resolver: Arc<dyn Resolver>,
        interval: Duration,
        routing_key: Option<String>,
        connect: Connect<T>,
    ) -> Arc<Self> {
        Arc::new(Balancer {
            id: id.to_owned(),
            resolver,
            interval,
            connect,
            routing_key: routing_key.map(|k| k.trim().to_owned()),
            members: RwLock::new(Arc::from(Vec::new())),
            next: AtomicUsize::new(0),
            epoch: Instant::now(),
            delivered: Delivered::default(),
            any_delivered: AtomicBool::new(false),
            refreshing: tokio::sync::Mutex::new(()),
            stop: tokio_util::sync::CancellationToken::new(),
            task: Mutex::new(None),
            endpoints: telemetry.gauge_of(&ENDPOINTS),
            failovers: telemetry.counter_of(&FAILOVERS),
            resolve_failures: telemetry.counter_of(&RESOLVE_FAILURES),
        })
    }

    /// Resolves once, then again every `interval` until [`Balancer::shutdown`].
    /// A name that does not resolve yet is an outage to ride out (logged,
    /// retried), not a start-up failure.
    pub(crate) async fn start(self: &Arc<Self>) {
        self.refresh().await;
        let weak: Weak<Self> = Arc::downgrade(self);
        let (stop, interval) = (self.stop.clone(), self.interval);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(interval) => {}
                }
                let Some(b) = weak.upgrade() else { return };
                b.refresh().await;
            }
        });
        *self.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
    }

    pub(crate) async fn shutdown(&self) {
        self.stop.cancel();
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = task {
            let _ = t.await;
        }
    }

    /// The addresses in use, sorted.
    pub(crate) fn addresses(&self) -> Vec<String> {
        self.current().iter().map(|m| m.address.clone()).collect()
    }

    fn current(&self) -> Arc<[Arc<Member<T>>]> {
        self.members.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Resolves and swaps in the new list: members whose address stays keep
    /// their connection, new ones are connected, removed ones leave the list
    /// (requests already on them finish; the connection closes with the last).
    pub(crate) async fn refresh(&self) {
        let _one_at_a_time = self.refreshing.lock().await;
        let mut addresses = match self.resolver.resolve().await {
            Ok(a) => a,
            Err(e) => {
                self.resolve_failures.inc();
                let kept = self.current().len();
                tracing::warn!(exporter = %self.id, "balancer: {e}; keeping the {kept} addresses resolved before");
                return;
            }
        };
        addresses.sort();
        addresses.dedup();
        let current = self.current();
        if current.iter().map(|m| m.address.as_str()).eq(addresses.iter().map(String::as_str)) {
            return;
        }
        let mut next = Vec::with_capacity(addresses.len());
        for a in addresses {
            if let Some(m) = current.iter().find(|m| m.address == a) {
                next.push(m.clone());
                continue;
            }
            match (self.connect)(&a) {
                Ok(target) => next.push(Arc::new(Member {
                    address: a,
                    target,
                    failures: AtomicU32::new(0),
                    down_until: AtomicU64::new(0),
                })),
                Err(e) => tracing::warn!(exporter = %self.id, "balancer: cannot use address {a}: {e}"),
            }
        }
        let added: Vec<&str> = next
            .iter()
            .filter(|m| !current.iter().any(|c| c.address == m.address))
            .map(|m| m.address.as_str())
            .collect();
        let removed: Vec<&str> = current
            .iter()
            .filter(|c| !next.iter().any(|m| m.address == c.address))
            .map(|m| m.address.as_str())
            .collect();
        tracing::info!(
            exporter = %self.id,
            "balancer: {} now has {} addresses (added {added:?}, removed {removed:?})",
            self.resolver.describe(),
            next.len()
        );
        self.endpoints.set(next.len() as i64);
        *self.members.write().unwrap_or_else(|p| p.into_inner()) = Arc::from(next);
    }

    /// The list, resolved now if it is empty (before `start`, or while the
    /// name resolved to nothing).
    async fn members_now(&self) -> Result<Arc<[Arc<Member<T>>]>, ExportError> {
        let m = self.current();
        if !m.is_empty() {
            return Ok(m);
        }
        self.refresh().await;
        let m = self.current();
        if m.is_empty() {
            return Err(ExportError::Retryable {
                message: format!("balancer: {} has no address to send to", self.resolver.describe()),
                retry_after: None,
            });
        }
        Ok(m)
    }

    pub(crate) async fn export(&self, batch: &Profiles) -> Result<(), ExportError> {
        let members = self.members_now().await?;
        let Some(key) = &self.routing_key else {
            let start = self.next.fetch_add(1, Ordering::Relaxed);
            let order = round_robin(&members, start, self.now_ms());
            return self.send_in_order(&order, batch).await;
        };
        let parts = match split_by_attribute(batch, key) {
            Split::One(value) => {
                let order = by_key(&members, &value, self.now_ms());
                return self.send_in_order(&order, batch).await;
            }
            Split::Parts(parts) => parts,
        };
        let check_delivered = self.any_delivered.load(Ordering::Relaxed);
        let sends = parts.iter().map(|(value, part)| {
            let members = &members;
            async move {
                let key = check_delivered.then(|| Delivered::key(value, [part.encode_to_vec().as_slice()]));
                if key.is_some_and(|k| self.delivered.contains(k)) {
                    return Ok(());
                }
                let order = by_key(members, value, self.now_ms());
                self.send_in_order(&order, part).await
            }
        });
        let results = futures::future::join_all(sends).await;
        let failed = results.iter().filter(|r| r.is_err()).count();
        if failed == 0 {
            return Ok(());
        }
        // The host retries the whole batch: remember what went out.
        for ((value, part), r) in parts.iter().zip(&results) {
            if r.is_ok() {
                self.delivered.insert(Delivered::key(value, [part.encode_to_vec().as_slice()]));
                self.any_delivered.store(true, Ordering::Relaxed);
            }
        }
        let n = parts.len();
        let mut errors = results.into_iter().filter_map(Result::err);
        let mut first = errors.next().expect("failed > 0");
        // Retryable wins: the host retries, and delivered parts are skipped.
        if !matches!(first, ExportError::Retryable { .. }) {
            if let Some(r) = errors.find(|e| matches!(e, ExportError::Retryable { .. })) {
                first = r;
            }
        }
        Err(match first {
            ExportError::Retryable { message, retry_after } => ExportError::Retryable {
                message: format!("{failed} of {n} parts (by {key}) failed: {message}"),
                retry_after,
            },
            ExportError::Permanent { message } => {
                ExportError::Permanent { message: format!("{failed} of {n} parts (by {key}) failed: {message}") }
            }
            other => other,
        })
    }

    /// Tries `order` until one address takes the batch. A permanent answer
    /// ends it (another gateway would refuse the same batch).
    async fn send_in_order(&self, order: &[Arc<Member<T>>], batch: &Profiles) -> Result<(), ExportError> {
        let mut last = None;
        for (i, m) in order.iter().take(MAX_ATTEMPTS).enumerate() {
            if i > 0 {
                self.failovers.inc();
            }
            match m.target.send(batch).await {
                Ok(()) => {
                    m.succeeded();
                    return Ok(());
                }
                Err(ExportError::Retryable { message, retry_after }) => {
                    m.failed(self.now_ms());
                    tracing::debug!(exporter = %self.id, "balancer: {} failed ({message}); trying another", m.address);
                    last = Some((m.address.clone(), message, retry_after));
                }
                Err(e) => return Err(e),
            }
        }
        let tried = order.len().min(MAX_ATTEMPTS);
        let (address, message, retry_after) = last.unwrap_or_default();
        Err(ExportError::Retryable {
            message: format!("tried {tried} gateway addresses; the last, {address}: {message}"),
            retry_after,
        })
    }
}

/// What an OTLP exporter sends through: its one `endpoint`, or a balancer.
pub(crate) enum Route<T: Target> {
    One(T),
    Balanced(Arc<Balancer<T>>),
}

impl<T: Target> Route<T> {
    /// A balanced route splits batches by resource, so it takes them unpacked.
    pub(crate) fn reads_packed(&self) -> bool {
        matches!(self, Route::One(_))
    }

    pub(crate) async fn start(&self) {
        if let Route::Balanced(b) = self {
            b.start().await;
        }
    }

    pub(crate) async fn export(&self, batch: &Profiles) -> Result<(), ExportError> {
        match self {
            Route::One(t) => t.send(batch).await,
            Route::Balanced(b) => b.export(batch).await,
        }
    }

    pub(crate) async fn shutdown(&self) {
        if let Route::Balanced(b) = self {
            b.shutdown().await;
        }
    }

    /// The addresses the balancer sends to (empty without a balancer).
    pub(crate) fn addresses(&self) -> Vec<String> {
        match self {
            Route::One(_) => Vec::new(),
            Route::Balanced(b) => b.addresses(),
        }
    }
}

/// Healthy members from `start` on, then those backing off (a last resort).
fn round_robin<T>(members: &[Arc<Member<T>>], start: usize, now: u64) -> Vec<Arc<Member<T>>> {
    let n = members.len();
    let rotated = (0..n).map(|i| &members[(start + i) % n]);
    let (up, down): (Vec<_>, Vec<_>) = rotated.cloned().partition(|m| !m.is_down(now));
    up.into_iter().chain(down).collect()
}

/// Rendezvous (highest random weight) order for `value`: every agent ranks
/// the same list the same way, so a value stays on one gateway, and adding
/// or removing a gateway moves only the values that rank it first. Members
/// backing off go last, so a value's fallback is stable too.
fn by_key<T>(members: &[Arc<Member<T>>], value: &str, now: u64) -> Vec<Arc<Member<T>>> {
    let mut ranked: Vec<(bool, u64, Arc<Member<T>>)> =
        members.iter().map(|m| (m.is_down(now), score(value, &m.address), m.clone())).collect();
    ranked.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    ranked.into_iter().map(|(_, _, m)| m).collect()
}

/// A hash that every agent version computes alike (FNV-1a, then a
/// splitmix64 finish so that near-equal inputs spread): std's hasher is
/// not promised to stay the same across Rust releases.
pub(crate) fn score(value: &str, address: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in value.bytes().chain([0xff]).chain(address.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

pub(crate) enum Split {
    /// Every resource has this value (or none: "").
    One(String),
    /// Per value, the resources that have it (dictionary compacted per part).
    Parts(Vec<(String, Profiles)>),
}

/// Groups the batch's resources by the value of their attribute `key`.
pub(crate) fn split_by_attribute(batch: &Profiles, key: &str) -> Split {
    let value_of = |rp: &pb::ResourceProfiles| -> String {
        rp.resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|kv| kv.key == key))
            .and_then(|kv| kv.value.as_ref())
            .map(text)
            .unwrap_or_default()
    };
    let rps = &batch.0.resource_profiles;
    let Some(first) = rps.first().map(value_of) else {
        return Split::One(String::new());
    };
    if rps.iter().skip(1).all(|rp| value_of(rp) == first) {
        return Split::One(first);
    }
    let mut groups: Vec<(String, Vec<pb::ResourceProfiles>)> = Vec::new();
    for rp in rps {
        let v = value_of(rp);
        match groups.iter_mut().find(|(g, _)| *g == v) {
            Some((_, list)) => list.push(rp.clone()),
            None => groups.push((v, vec![rp.clone()])),
        }
    }
    Split::Parts(
        groups
            .into_iter()
            .map(|(v, resource_profiles)| {
                let data = pb::ProfilesData { resource_profiles, dictionary: batch.0.dictionary.clone() };
                let mut part = Profiles::from(data);
                part.compact();
                (v, part)
            })
            .collect(),
    )
}

/// An attribute value as the text it is keyed by.
fn text(v: &AnyValue) -> String {
    match &v.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BytesValue(b)) => b.iter().map(|x| format!("{x:02x}")).collect(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendezvous_moves_only_what_ranked_the_removed_address_first() {
        let all = ["10.0.0.1:4317", "10.0.0.2:4317", "10.0.0.3:4317"];
        fn best<'a>(list: &[&'a str], v: &str) -> &'a str {
            list.iter().max_by_key(|a| score(v, a)).unwrap()
        }
        let values: Vec<String> = (0..300).map(|i| format!("service-{i}")).collect();
        let mut per = [0usize; 3];
        for v in &values {
            per[all.iter().position(|a| *a == best(&all, v)).unwrap()] += 1;
        }
        assert!(per.iter().all(|&n| n >= 60), "300 values spread over 3 addresses: {per:?}");
        let two = [all[0], all[2]];
        for v in &values {
            let before = best(&all, v);
            if before != all[1] {
                assert_eq!(best(&two, v), before, "{v} moved though its address stayed");
            }
        }
    }

    #[test]
    fn score_is_pinned_so_agents_of_every_version_agree() {
        // Computed independently (FNV-1a 64 + splitmix64 finish); a change
        // here would move every routed value to another gateway mid-upgrade.
        assert_eq!(score("checkout", "10.0.0.1:4317"), 0x6f1f_87a4_7cc4_b68b);
        assert_eq!(score("", ""), 0x4f2d_b50f_1240_40cd);
    }

    fn problems(yaml: &str) -> Vec<String> {
        use profcol_api::config::Validate;
        let cfg: super::super::OtlpGrpcConfig = profcol_config::parse_section(yaml).unwrap().decode().unwrap();
        let mut p = profcol_api::config::Problems::new();
        cfg.validate(&mut p);
        p.into_errors().into_iter().map(|e| format!("{}: {}", e.path, e.message)).collect()
    }

    #[test]
    fn config_errors_say_what_to_do() {
        let both = problems("endpoint: a:1\nbalancer: {resolver: {static: {endpoints: [b:1]}}}\ntls: {insecure: true}");
        assert!(both.iter().any(|e| e.starts_with("balancer: cannot be used with endpoint")), "{both:?}");
        let ok = problems(
            "balancer: {resolver: {dns: {hostname: gw.svc, port: 4317, interval: 2s}}, routing_key: service.name}",
        );
        assert!(ok.is_empty(), "{ok:?}");
        let bad = problems(
            "balancer: {resolver: {static: {endpoints: [b:1, 'b:1', 'c', 'http://d:2']}}, routing_key: ' '}\ntls: {insecure: true}",
        );
        assert!(bad.iter().any(|e| e.contains("endpoints.1") && e.contains("listed twice")), "{bad:?}");
        assert!(bad.iter().any(|e| e.contains("endpoints.2") && e.contains("no port")), "{bad:?}");
        assert!(!bad.iter().any(|e| e.contains("endpoints.3")), "a URL is fine: {bad:?}");
        assert!(bad.iter().any(|e| e.starts_with("balancer.routing_key")), "{bad:?}");
        let dns = problems("balancer: {resolver: {dns: {hostname: 'http://gw:4317', interval: 10ms}}}");
        assert!(dns.iter().any(|e| e.contains("dns.hostname") && e.contains("name only")), "{dns:?}");
        assert!(dns.iter().any(|e| e.contains("dns.interval") && e.contains("100ms to 1h")), "{dns:?}");
        let empty = problems("balancer: {resolver: {static: {endpoints: []}}}");
        assert!(empty.iter().any(|e| e.contains("is empty")), "{empty:?}");
        let plain_tls =
            problems("balancer: {resolver: {static: {endpoints: ['http://a:1']}}}\ntls: {ca_file: /nonexistent}");
        assert!(plain_tls.iter().any(|e| e.contains("plain text")), "{plain_tls:?}");
    }

    #[test]
    fn a_batch_of_several_services_splits_by_value_and_keeps_every_sample() {
        use profcol_api::model::{KeyValue, ProfileMeta, Resource};
        use profcol_api::ProfilesBuilder;
        let mut b = ProfilesBuilder::new();
        for svc in ["a", "b", "a", ""] {
            let attributes = if svc.is_empty() {
                Vec::new()
            } else {
                vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue { value: Some(any_value::Value::StringValue(svc.into())) }),
                    ..Default::default()
                }]
            };
            let r = b.resource(Resource { attributes, ..Default::default() });
            let p = b.profile(r, &ProfileMeta::cpu(1, 0, 0));
            let f = b.function(&format!("f_{svc}"), "", "x.c", 0);
            let l = b.line_location(f, 1);
            let st = b.stack(&[l]);
            b.sample(p, pb::Sample { stack_index: st, values: vec![2], ..Default::default() });
        }
        let batch = b.build();
        let Split::Parts(parts) = split_by_attribute(&batch, "service.name") else { panic!("three values") };
        let values: Vec<&str> = parts.iter().map(|(v, _)| v.as_str()).collect();
        assert_eq!(values, ["a", "b", ""]);
        assert_eq!(parts[0].1 .0.resource_profiles.len(), 2);
        let total: usize = parts.iter().map(|(_, p)| p.sample_count()).sum();
        assert_eq!(total, batch.sample_count());
        for (_, p) in &parts {
            p.validate().unwrap();
        }
        assert!(matches!(split_by_attribute(&batch, "host.name"), Split::One(v) if v.is_empty()));
    }

    /// A sender that records what it got, fails when told, can hold a
    /// request until released, and notes when it is dropped (closed).
    struct Fake {
        address: String,
        log: Arc<Mutex<Vec<String>>>,
        fail: Arc<Mutex<Vec<String>>>,
        hold: Arc<tokio::sync::Semaphore>,
        dropped: Arc<Mutex<Vec<String>>>,
    }

    #[async_trait::async_trait]
    impl Target for Fake {
        async fn send(&self, _: &Profiles) -> Result<(), ExportError> {
            let _permit = self.hold.acquire().await.unwrap();
            if self.fail.lock().unwrap().contains(&self.address) {
                return Err(ExportError::Retryable { message: "refused".into(), retry_after: None });
            }
            self.log.lock().unwrap().push(self.address.clone());
            Ok(())
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            self.dropped.lock().unwrap().push(self.address.clone());
        }
    }

    struct Listed(Mutex<Vec<String>>);
    #[async_trait::async_trait]
    impl Resolver for Listed {
        async fn resolve(&self) -> Result<Vec<String>, String> {
            Ok(self.0.lock().unwrap().clone())
        }
        fn describe(&self) -> String {
            "test".into()
        }
    }

    #[allow(clippy::type_complexity)]
    fn fakes(
        addresses: &[&str],
    ) -> (Arc<Balancer<Fake>>, Arc<Listed>, [Arc<Mutex<Vec<String>>>; 3], Arc<tokio::sync::Semaphore>) {
        let (log, fail, dropped) = Default::default();
        let (log, fail, dropped): (Arc<Mutex<Vec<String>>>, Arc<Mutex<Vec<String>>>, Arc<Mutex<Vec<String>>>) =
            (log, fail, dropped);
        let hold = Arc::new(tokio::sync::Semaphore::new(1000));
        let resolver = Arc::new(Listed(Mutex::new(addresses.iter().map(|a| a.to_string()).collect())));
        let (l, f, d, h) = (log.clone(), fail.clone(), dropped.clone(), hold.clone());
        let connect: Connect<Fake> = Box::new(move |a: &str| {
            Ok(Fake { address: a.into(), log: l.clone(), fail: f.clone(), hold: h.clone(), dropped: d.clone() })
        });
        let id = "otlp/test".parse().unwrap();
        let t = ComponentTelemetry::detached(profcol_api::component::Kind::Exporter, &id);
        let b = Balancer::new("otlp/test", &t, resolver.clone(), Duration::from_secs(3600), None, connect);
        (b, resolver, [log, fail, dropped], hold)
    }

    #[tokio::test]
    async fn round_robin_fails_over_and_backs_off_a_failing_address() {
        let (b, _, [log, fail, _], _) = fakes(&["a:1", "b:1", "c:1"]);
        let batch = Profiles::empty();
        for _ in 0..6 {
            b.export(&batch).await.unwrap();
        }
        assert_eq!(*log.lock().unwrap(), ["a:1", "b:1", "c:1", "a:1", "b:1", "c:1"]);
        log.lock().unwrap().clear();
        fail.lock().unwrap().push("b:1".into());
        for _ in 0..6 {
            b.export(&batch).await.unwrap();
        }
        // b failed once (its batch went to c), then it is backed off.
        let l = log.lock().unwrap().clone();
        assert!(!l.contains(&"b:1".to_string()) && l.len() == 6, "{l:?}");
        assert_eq!(b.failovers.get(), 1);
        fail.lock().unwrap().extend(["a:1".into(), "c:1".into()]);
        let e = b.export(&batch).await.unwrap_err();
        assert!(
            matches!(&e, ExportError::Retryable { message, .. } if message.starts_with("tried 3 gateway addresses")),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_removed_address_finishes_its_request_then_closes() {
        let (b, resolver, [log, _, dropped], hold) = fakes(&["a:1", "b:1"]);
        b.refresh().await;
        // Hold every request: the next one (to a:1) stays in flight.
        let all = hold.acquire_many(1000).await.unwrap();
        let in_flight = {
            let b = b.clone();
            tokio::spawn(async move { b.export(&Profiles::empty()).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        *resolver.0.lock().unwrap() = vec!["b:1".into(), "c:1".into()];
        b.refresh().await;
        assert_eq!(b.addresses(), ["b:1", "c:1"]);
        assert!(dropped.lock().unwrap().is_empty(), "a:1 closed while a request was on it");
        drop(all);
        in_flight.await.unwrap().unwrap();
        assert_eq!(*log.lock().unwrap(), ["a:1"], "the request in flight finished on a:1");
        assert_eq!(*dropped.lock().unwrap(), ["a:1"], "and a:1 closed after it");
        b.export(&Profiles::empty()).await.unwrap();
        assert_ne!(log.lock().unwrap()[1], "a:1");
    }
}
