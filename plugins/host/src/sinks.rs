//! Delivery of an exporter plugin's outputs: append to a file, or POST to an
//! HTTP endpoint. The plugin itself needs no file or network access.

use crate::config::{HttpSink, Sink};
use std::io::Write;
use std::time::Duration;

/// A delivery failed; `permanent` when a retry would fail the same way.
#[derive(Debug)]
pub struct DeliveryError {
    pub message: String,
    pub permanent: bool,
}

pub struct Sinks {
    http: reqwest::Client,
}

impl Sinks {
    pub fn new() -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("cannot create the HTTP client: {e}"))?;
        Ok(Sinks { http })
    }

    /// Delivers the pieces meant for one sink, in order.
    pub async fn deliver(&self, sink: &Sink, pieces: &[(&str, &[u8])]) -> Result<(), DeliveryError> {
        match sink {
            Sink::File(path) => {
                let path = path.clone();
                let data: Vec<u8> = pieces.iter().flat_map(|(_, d)| d.iter().copied()).collect();
                tokio::task::spawn_blocking(move || {
                    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
                    // One write: a reader (or a crash) never sees half of one batch's output.
                    f.write_all(&data)
                })
                .await
                .map_err(|e| DeliveryError { message: e.to_string(), permanent: false })?
                .map_err(|e| DeliveryError { message: format!("file: {e}"), permanent: false })
            }
            Sink::Http(h) => {
                for (content_type, data) in pieces {
                    self.post(h, content_type, data).await?;
                }
                Ok(())
            }
        }
    }

    async fn post(&self, h: &HttpSink, content_type: &str, data: &[u8]) -> Result<(), DeliveryError> {
        let mut req = self.http.post(&h.endpoint).header("content-type", content_type).body(data.to_vec());
        for (k, v) in &h.headers {
            req = req.header(k, v);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| DeliveryError { message: format!("POST {}: {e}", h.endpoint), permanent: false })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        let permanent = status.is_client_error() && status.as_u16() != 429 && status.as_u16() != 408;
        Err(DeliveryError { message: format!("POST {}: HTTP {status}", h.endpoint), permanent })
    }
}
