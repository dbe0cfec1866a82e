//! The HTTP server: `POST /v1development/profiles` (OTLP/HTTP), protobuf
//! (`application/x-protobuf`) or JSON (`application/json`), optionally gzip.
//!
//! Errors answer with a `google.rpc.Status` in the request's encoding, as
//! OTLP/HTTP specifies: 400 malformed, 408 a body that missed its deadlines,
//! 413 too large (also after decompression, or once decoded: the decode
//! budget), 415 unknown content type or encoding, 503 with
//! `Retry-After` when the pipeline pushes back or `max_concurrent_requests`
//! requests are in flight.

use super::body::ReadError;
use super::{tls, HttpConfig, Ingest, IngestError, Slot};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use profcol_api::component::ComponentError;
use profcol_api::model::rpc::RpcStatus;
use profcol_api::model::ExportProfilesServiceResponse;
use profcol_api::Profiles;
use prost::Message;
use std::io::Read;
use std::sync::Arc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, PartialEq)]
enum Encoding {
    Proto,
    Json,
}

impl Encoding {
    fn content_type(self) -> &'static str {
        match self {
            Encoding::Proto => "application/x-protobuf",
            Encoding::Json => "application/json",
        }
    }
}

#[derive(Clone)]
struct AppState {
    ingest: Arc<Ingest>,
    max_size: usize,
}

fn reply(enc: Encoding, status: StatusCode, grpc_code: i32, message: String) -> Response {
    let body = match enc {
        Encoding::Proto => RpcStatus { code: grpc_code, message, details: vec![] }.encode_to_vec(),
        Encoding::Json => serde_json::json!({ "code": grpc_code, "message": message }).to_string().into_bytes(),
    };
    let mut r = (status, [(header::CONTENT_TYPE, enc.content_type())], body).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

fn error(enc: Encoding, e: IngestError) -> Response {
    match e {
        IngestError::Invalid(m) => reply(enc, StatusCode::BAD_REQUEST, 3, m),
        IngestError::TooLarge(m) => reply(enc, StatusCode::PAYLOAD_TOO_LARGE, 8, m),
        IngestError::Unavailable(m) => reply(enc, StatusCode::SERVICE_UNAVAILABLE, 14, m),
        IngestError::Rejected(m) => reply(enc, StatusCode::BAD_REQUEST, 3, m),
        IngestError::TimedOut(m) => reply(enc, StatusCode::REQUEST_TIMEOUT, 4, m),
    }
}

/// Inflates gzip `data`, refusing output past `cap` bytes (memory stays
/// within the cap however far the input would inflate).
pub(crate) fn gunzip_capped(data: &[u8], cap: usize) -> Result<Vec<u8>, IngestError> {
    let mut out = Vec::with_capacity(data.len().saturating_mul(4).min(cap));
    let mut d = flate2::read::MultiGzDecoder::new(data).take((cap as u64).saturating_add(1));
    d.read_to_end(&mut out).map_err(|e| IngestError::Invalid(format!("the gzip body does not inflate: {e}")))?;
    if out.len() > cap {
        return Err(IngestError::TooLarge(format!("the request inflates past the limit of {cap} bytes")));
    }
    Ok(out)
}

async fn export(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let mime = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let enc = match mime.as_str() {
        "application/x-protobuf" | "application/protobuf" => Encoding::Proto,
        "application/json" => Encoding::Json,
        _ => {
            st.ingest.count(&IngestError::Invalid(String::new()));
            return reply(
                Encoding::Json,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                3,
                format!("unsupported Content-Type {ct:?}; send application/x-protobuf or application/json"),
            );
        }
    };
    let ce =
        headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok()).unwrap_or("").trim().to_ascii_lowercase();
    let gzip = match ce.as_str() {
        "" | "identity" => false,
        "gzip" | "x-gzip" => true,
        other => {
            st.ingest.count(&IngestError::Invalid(String::new()));
            return reply(
                enc,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                3,
                format!("unsupported Content-Encoding {other:?}; use gzip or none"),
            );
        }
    };
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    // The slot is held until the pipeline took or refused the batch; the
    // body and its inflated copy are gone by then.
    let (batch, _slot) = match read_and_decode(&st, enc, gzip, declared, body).await {
        Ok(x) => x,
        Err(e) => {
            // A refusal for want of a slot was counted by `admit`.
            if !matches!(e, IngestError::Unavailable(_)) {
                st.ingest.count(&e);
            }
            return error(enc, e);
        }
    };
    let partial_success = match st.ingest.accept(batch).await {
        Ok(p) => p,
        Err(e) => return error(enc, e),
    };
    let ok = ExportProfilesServiceResponse { partial_success };
    let body = match enc {
        Encoding::Proto => ok.encode_to_vec(),
        Encoding::Json => profcol_api::model::otlp_json::encode_response(&ok).into_bytes(),
    };
    (StatusCode::OK, [(header::CONTENT_TYPE, enc.content_type())], body).into_response()
}

const CAP_KEY: &str = "protocols.http.max_recv_msg_size_mib";

/// Reads the body against its deadlines, its cap and the read budget, then
/// takes a slot and inflates and decodes it (after the decode budget). An
/// oversized body is read on and discarded (up to its cap once more, within
/// the deadlines) so the sender reads the 413 instead of a reset connection.
async fn read_and_decode(
    st: &AppState,
    enc: Encoding,
    gzip: bool,
    declared: Option<u64>,
    body: Body,
) -> Result<(Profiles, Slot), IngestError> {
    let max = st.max_size;
    let mut reader = st.ingest.reader(body, max);
    if declared.is_some_and(|n| n > max as u64) {
        reader.drain(max).await;
        return Err(st.ingest.read_error(ReadError::TooLarge, max, CAP_KEY));
    }
    // No slot while the body arrives: a slow sender holds only its bytes.
    let bytes = match reader.rest().await {
        Ok(b) => b,
        Err(e) => {
            if let ReadError::TooLarge = e {
                reader.drain(max).await;
            }
            return Err(st.ingest.read_error(e, max, CAP_KEY));
        }
    };
    let slot = st.ingest.admit().await?;
    let inflated;
    let data: &[u8] = if gzip {
        inflated = gunzip_capped(&bytes, max)?;
        &inflated
    } else {
        &bytes
    };
    let batch = match enc {
        Encoding::Proto => st.ingest.decode_proto(data)?,
        Encoding::Json => st.ingest.decode_json(data)?,
    };
    Ok((batch, slot))
}

/// A listener that does TLS handshakes off the accept path (a slow client
/// cannot hold up others) and hands finished streams to axum.
struct TlsListener {
    rx: tokio::sync::mpsc::Receiver<(tokio_rustls::server::TlsStream<tokio::net::TcpStream>, std::net::SocketAddr)>,
    local: std::net::SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsListener {
    fn new(l: Arc<tokio::net::TcpListener>, cfg: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = l.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let task = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match l.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::debug!("accept: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(tcp)).await {
                        Ok(Ok(s)) => {
                            let _ = tx.send((s, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { rx, local, task })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;
    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(x) => x,
            // The accept task ended (only on abort): wait for shutdown.
            None => std::future::pending().await,
        }
    }
    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

pub(crate) fn serve(
    id: &str,
    listener: Arc<tokio::net::TcpListener>,
    cfg: &HttpConfig,
    ingest: Arc<Ingest>,
    cancel: CancellationToken,
) -> Result<JoinHandle<()>, ComponentError> {
    let path = if cfg.profiles_url_path.starts_with('/') {
        cfg.profiles_url_path.clone()
    } else {
        format!("/{}", cfg.profiles_url_path)
    };
    let state = AppState { ingest, max_size: super::config::mib(cfg.max_recv_msg_size_mib) };
    let app = Router::new().route(&path, post(export)).with_state(state);
    let id = id.to_owned();
    let signal = cancel.cancelled_owned();
    match &cfg.tls {
        None => Ok(tokio::spawn(async move {
            let incoming = profcol_api::listeners::Incoming::new(listener);
            if let Err(e) = axum::serve(incoming, app).with_graceful_shutdown(signal).await {
                tracing::error!(receiver = %id, "HTTP server stopped: {e}");
            }
        })),
        Some(t) => {
            let tc = tls::load_server_config(t)
                .map_err(|e| ComponentError::msg(format!("receiver {id}: protocols.http.tls: {e}")))?;
            let l = TlsListener::new(listener, tc).map_err(|e| ComponentError::io(format!("receiver {id}"), e))?;
            Ok(tokio::spawn(async move {
                if let Err(e) = axum::serve(l, app).with_graceful_shutdown(signal).await {
                    tracing::error!(receiver = %id, "HTTPS server stopped: {e}");
                }
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gunzip_is_capped() {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(&vec![0u8; 4 << 20]).unwrap();
        let bomb = e.finish().unwrap();
        assert!(bomb.len() < 8 << 10, "{}", bomb.len());
        assert!(matches!(gunzip_capped(&bomb, 1 << 20), Err(IngestError::TooLarge(_))));
        assert_eq!(gunzip_capped(&bomb, 8 << 20).unwrap().len(), 4 << 20);
        assert!(matches!(gunzip_capped(b"garbage", 1 << 20), Err(IngestError::Invalid(_))));
    }

    #[test]
    fn gunzip_with_the_largest_cap_inflates_everything() {
        // `max_recv_msg_size_mib` saturates to usize::MAX: the cap + 1 of the
        // reader must not overflow (a panic, or in release a take(0) that
        // turned every gzip body into an empty, accepted request).
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(b"profiles").unwrap();
        let gz = e.finish().unwrap();
        assert_eq!(gunzip_capped(&gz, usize::MAX).unwrap(), b"profiles");
    }
}
