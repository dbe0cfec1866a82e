//! `health_check`: HTTP 200 while every pipeline runs, 503 otherwise.

use super::HostStatus;
use async_trait::async_trait;
use axum::http::StatusCode;
use profcol_api::component::{
    factory as make_factory, Component, ComponentError, Extension, Factory, FactoryMeta, Kind, Stability,
};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HealthCheckConfig {
    pub endpoint: String,
    pub path: String,
}

impl profcol_api::config::Validate for HealthCheckConfig {}

impl Default for HealthCheckConfig {
    fn default() -> Self {
        HealthCheckConfig { endpoint: "localhost:13133".into(), path: "/".into() }
    }
}

struct HealthCheck {
    cfg: HealthCheckConfig,
    status: HostStatus,
    stop: CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

pub fn factory(status: HostStatus) -> Arc<dyn Factory> {
    make_factory::<HealthCheckConfig, _>(
        FactoryMeta {
            type_name: "health_check",
            kind: Kind::Extension,
            stability: Stability::Beta,
            description: "HTTP health endpoint: 200 while every pipeline runs, 503 otherwise",
        },
        move |_set, cfg| {
            Ok(Component::Extension(Arc::new(HealthCheck {
                cfg,
                status: status.clone(),
                stop: CancellationToken::new(),
                task: Mutex::new(None),
            })))
        },
    )
}

#[async_trait]
impl Extension for HealthCheck {
    async fn start(&self) -> Result<(), ComponentError> {
        let listener = tokio::net::TcpListener::bind(&self.cfg.endpoint).await.map_err(|e| {
            ComponentError::io(
                format!("health_check cannot listen on {} (set endpoint to a free address)", self.cfg.endpoint),
                e,
            )
        })?;
        if let Ok(a) = listener.local_addr() {
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
        let stop = self.stop.clone();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
        });
        *self.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        Ok(())
    }

    async fn shutdown(&self) -> Result<(), ComponentError> {
        self.stop.cancel();
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = task {
            let _ = t.await;
        }
        Ok(())
    }
}
