//! `health_check`: HTTP 200 while every pipeline runs, 503 otherwise.

use super::HostStatus;
use async_trait::async_trait;
use axum::http::StatusCode;
use profcol_api::component::{
    factory as make_factory, Component, ComponentError, Extension, Factory, FactoryMeta, Kind, Stability,
};
use profcol_api::listeners;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub(super) struct HealthCheckConfig {
    /// Listen address, host:port.
    pub endpoint: String,
    /// URL path answered (starts with '/').
    pub path: String,
}

impl profcol_api::config::Validate for HealthCheckConfig {
    fn validate(&self, p: &mut profcol_api::config::Problems) {
        p.check("endpoint", profcol_api::config::checks::host_port(&self.endpoint, true));
        if !self.path.starts_with('/') {
            p.add("path", format!("{:?} must start with '/' (default /)", self.path));
        }
    }
}

impl Default for HealthCheckConfig {
    fn default() -> Self {
        HealthCheckConfig { endpoint: "localhost:13133".into(), path: "/".into() }
    }
}

/// Its listeners' owner in [`listeners`].
const OWNER: &str = "health_check";

struct HealthCheck {
    cfg: HealthCheckConfig,
    status: HostStatus,
    /// While started: how to stop the server, and its task.
    running: Mutex<Option<(CancellationToken, tokio::task::JoinHandle<()>)>>,
    /// The address it bound last; a start after a shutdown binds it again.
    bound: Mutex<Option<std::net::SocketAddr>>,
}

pub(super) fn factory(status: HostStatus) -> Arc<dyn Factory> {
    make_factory::<HealthCheckConfig, _>(
        FactoryMeta {
            type_name: OWNER,
            kind: Kind::Extension,
            stability: Stability::Beta,
            description: "HTTP health endpoint: 200 while every pipeline runs, 503 otherwise",
        },
        move |_set, cfg| {
            Ok(Component::Extension(Arc::new(HealthCheck {
                cfg,
                status: status.clone(),
                running: Mutex::new(None),
                bound: Mutex::new(None),
            })))
        },
    )
}

#[async_trait]
impl Extension for HealthCheck {
    async fn start(&self) -> Result<(), ComponentError> {
        // Started again (a reload that failed puts the old instance back): the same port.
        let was = *self.bound.lock().unwrap_or_else(|p| p.into_inner());
        let endpoint = match was {
            Some(a) => a.to_string(),
            None => self.cfg.endpoint.clone(),
        };
        // The socket of a running instance on that address, if any: a reload
        // then stops nothing first and the port never closes.
        let addrs: Vec<std::net::SocketAddr> =
            tokio::net::lookup_host(&endpoint).await.map(Iterator::collect).unwrap_or_default();
        let running = addrs.iter().filter(|a| a.port() != 0).find_map(|a| listeners::find(OWNER, *a));
        let listener = match running {
            Some(l) => l,
            None => {
                let l = tokio::net::TcpListener::bind(&endpoint).await.map_err(|e| {
                    ComponentError::io(
                        format!("endpoint: cannot listen on {endpoint} (set endpoint to a free address)"),
                        e,
                    )
                })?;
                let l = Arc::new(l);
                listeners::register(OWNER, &l);
                l
            }
        };
        if let Ok(a) = listener.local_addr() {
            *self.bound.lock().unwrap_or_else(|p| p.into_inner()) = Some(a);
            tracing::info!(address = %a, path = %self.cfg.path, "health_check listening");
        }
        let status = self.status.clone();
        let app = axum::Router::new().route(
            &self.cfg.path,
            axum::routing::get(move || {
                let status = status.clone();
                async move {
                    if status.running() {
                        (StatusCode::OK, "{\"status\":\"Server available\"}")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "{\"status\":\"Server not available\"}")
                    }
                }
            }),
        );
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listeners::Incoming::new(listener), app)
                .with_graceful_shutdown(token.cancelled_owned())
                .await;
        });
        *self.running.lock().unwrap_or_else(|p| p.into_inner()) = Some((stop, task));
        Ok(())
    }

    async fn shutdown(&self) -> Result<(), ComponentError> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((stop, task)) = running {
            stop.cancel();
            let _ = task.await;
        }
        Ok(())
    }

    /// Its TCP port: the one it bound, else the configured one (0: none),
    /// unless a running instance listens there: that socket is shared
    /// ([`listeners`]), so a reload that keeps the endpoint stops nothing first.
    fn exclusive_resources(&self) -> Vec<String> {
        let bound = self.bound.lock().unwrap_or_else(|p| p.into_inner()).map(|a| a.port());
        let configured = Some(self.cfg.endpoint.as_str())
            .filter(|e| !listeners::shared(OWNER, e))
            .and_then(|e| e.rsplit_once(':'))
            .and_then(|(_, p)| p.parse::<u16>().ok());
        bound.or(configured).filter(|p| *p != 0).map(|p| vec![format!("tcp port {p}")]).unwrap_or_default()
    }
}
