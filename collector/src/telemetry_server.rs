//! Serves self-telemetry as Prometheus text at `/metrics`.

use profcol_api::telemetry::{Level, Telemetry};
use profcol_config::TelemetryConfig;

/// Where `/metrics` is served: `metrics.address` (the shorthand) and each
/// pull reader; nowhere at `level: none`.
pub fn pull_addresses(cfg: &TelemetryConfig) -> Vec<String> {
    if cfg.metrics.level == Level::None {
        return vec![];
    }
    let mut out: Vec<String> = Some(cfg.metrics.address.clone()).filter(|a| !a.is_empty()).into_iter().collect();
    for r in &cfg.metrics.readers {
        if let Some(p) = &r.pull {
            out.push(format!("{}:{}", p.exporter.prometheus.host, p.exporter.prometheus.port));
        }
    }
    out
}

pub async fn serve(address: &str, telemetry: Telemetry) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(address).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot serve metrics on {address}: {e} (set service::telemetry::metrics::address to a free address, or \"\" to turn it off)"
        )
    })?;
    // The bound address, so `address: 127.0.0.1:0` can be found (tests).
    if let Ok(a) = listener.local_addr() {
        tracing::info!(address = %a, "serving metrics at /metrics");
    }
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let t = telemetry.clone();
            async move { ([("content-type", "text/plain; version=0.0.4")], t.render()) }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(())
}
