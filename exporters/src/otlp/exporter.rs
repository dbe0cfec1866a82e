//! The OTLP exporter, one for both transports: it sends each batch to its
//! `endpoint`, or through a [`Balancer`] over many addresses; the transport
//! (gRPC in `grpc`, HTTP in `http`) says only how one address is sent to.

use super::balancer::{Balancer, BalancerConfig, Connect, Resolver, Route, Target};
use profcol_api::component::{ComponentError, CreateSettings};
use profcol_api::telemetry::ComponentTelemetry;
use profcol_api::{ExportError, Exporter, Profiles};
use std::sync::Arc;

/// An OTLP exporter component; `T` is its transport's sender of one address.
pub struct OtlpExporter<T: Target> {
    pub(super) route: Route<T>,
}

/// What a transport gives the exporter: its config, and the sender of the
/// config's one endpoint or of one balanced address.
pub(crate) trait Transport: Target + Sized {
    /// `exporters: otlp: ...` or `exporters: otlp_http: ...`.
    type Config: Clone + Send + Sync + 'static;
    /// What every address's sender shares: the request settings, made once.
    type Shared: Send + Sync + 'static;
    /// Port of a DNS balancer's addresses when the config names none.
    const DEFAULT_PORT: u16;

    fn balancer(cfg: &Self::Config) -> Option<&BalancerConfig>;
    /// The config names an endpoint of its own (refused beside a balancer).
    fn names_endpoint(cfg: &Self::Config) -> bool;
    /// The config's request settings, checked; `id` and `telemetry` are the exporter's.
    fn shared(cfg: &Self::Config, id: &str, telemetry: &ComponentTelemetry) -> Result<Self::Shared, String>;
    /// The sender of the config's endpoint (no balancer).
    fn one(cfg: &Self::Config, shared: Arc<Self::Shared>) -> Result<Self, String>;
    /// The sender of one balanced address; `dns_name`: the name it was
    /// resolved from, which TLS checks the server against.
    fn connect(
        cfg: &Self::Config,
        address: &str,
        dns_name: Option<&str>,
        shared: Arc<Self::Shared>,
    ) -> Result<Self, String>;
}

/// The exporter the config describes, its balancer's addresses (if any)
/// resolved as the config says.
pub(crate) fn new<T: Transport>(settings: CreateSettings, cfg: T::Config) -> Result<OtlpExporter<T>, ComponentError> {
    let resolver = T::balancer(&cfg).map(|b| b.resolver(T::DEFAULT_PORT));
    build(settings, cfg, resolver)
}

/// The exporter the config describes; `resolver` gives its balancer's
/// addresses (tests decide what a name resolves to).
pub(crate) fn build<T: Transport>(
    settings: CreateSettings,
    cfg: T::Config,
    resolver: Option<Arc<dyn Resolver>>,
) -> Result<OtlpExporter<T>, ComponentError> {
    let id = settings.id.to_string();
    let err = ComponentError::msg;
    let shared = Arc::new(T::shared(&cfg, &id, &settings.telemetry).map_err(err)?);
    let route = match (T::balancer(&cfg), resolver) {
        (Some(b), Some(resolver)) => {
            if T::names_endpoint(&cfg) {
                return Err(err("endpoint and balancer are both set; keep one".into()));
            }
            let dns_name = b.dns_name().map(str::to_owned);
            let (interval, key) = (b.interval(), b.routing_key.clone());
            let conn_cfg = cfg.clone();
            let connect: Connect<T> =
                Box::new(move |address: &str| T::connect(&conn_cfg, address, dns_name.as_deref(), shared.clone()));
            Route::Balanced(Balancer::new(&id, &settings.telemetry, resolver, interval, key, connect))
        }
        (None, Some(_)) => return Err(err("a resolver was given but the config has no balancer".into())),
        _ => Route::One(T::one(&cfg, shared).map_err(err)?),
    };
    Ok(OtlpExporter { route })
}

impl<T: Target> OtlpExporter<T> {
    /// The addresses the balancer sends to (empty without a balancer).
    pub fn balanced_addresses(&self) -> Vec<String> {
        self.route.addresses()
    }
}

#[async_trait::async_trait]
impl<T: Target> Exporter for OtlpExporter<T> {
    async fn start(&self) -> Result<(), ComponentError> {
        self.route.start().await;
        Ok(())
    }

    async fn export(&self, batch: &Profiles) -> Result<(), ExportError> {
        self.route.export(batch).await
    }

    /// Encodes and counts through `Profiles` alone (a balanced route excepted).
    fn reads_packed(&self) -> bool {
        self.route.reads_packed()
    }

    async fn shutdown(&self) -> Result<(), ComponentError> {
        self.route.shutdown().await;
        Ok(())
    }
}
