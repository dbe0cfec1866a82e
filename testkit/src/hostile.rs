//! What a hostile sender sends an OTLP receiver: requests that expand when
//! decoded, and connections that send headers and then stall. Raw bytes and
//! raw sockets, so nothing in between repairs them.

use std::io::Write;
use std::net::SocketAddr;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A length-delimited protobuf field: key, varint length, payload.
pub fn delimited(tag: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(payload.len() + 8);
    varint(&mut v, u64::from(tag << 3 | 2));
    varint(&mut v, payload.len() as u64);
    v.extend_from_slice(payload);
    v
}

fn varint(v: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        v.push((n as u8) | 0x80);
        n >>= 7;
    }
    v.push(n as u8);
}

/// An `ExportProfilesServiceRequest` of about `wire_bytes` bytes made of
/// empty `Sample`s (2 bytes each on the wire, 80 bytes decoded in a
/// vector): the expansion request. Valid protobuf.
pub fn expansion_request(wire_bytes: usize) -> Vec<u8> {
    let samples = wire_bytes.saturating_sub(16) / 2;
    let mut profile = Vec::with_capacity(samples * 2);
    for _ in 0..samples {
        profile.extend_from_slice(&[2 << 3 | 2, 0]);
    }
    // resource_profiles(1) { scope_profiles(2) { profiles(2) { samples(2)... } } }
    delimited(1, &delimited(2, &delimited(2, &profile)))
}

/// The same in OTLP/JSON: `{}` samples, 3 bytes each.
pub fn json_expansion_request(text_bytes: usize) -> Vec<u8> {
    let samples = text_bytes.saturating_sub(80) / 3;
    let mut s = String::with_capacity(text_bytes);
    s.push_str(r#"{"resourceProfiles":[{"scopeProfiles":[{"profiles":[{"samples":["#);
    for k in 0..samples {
        s.push_str(if k == 0 { "{}" } else { ",{}" });
    }
    s.push_str("]}]}]}]}");
    s.into_bytes()
}

/// `inflated` zero bytes, gzipped (a ~1000:1 bomb).
pub fn gzip_bomb(inflated: usize) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let chunk = vec![0u8; 1 << 20];
    let mut left = inflated;
    while left > 0 {
        let n = left.min(chunk.len());
        e.write_all(&chunk[..n]).expect("writing into memory");
        left -= n;
    }
    e.finish().expect("writing into memory")
}

/// An HTTP/1.1 request to the profiles route that announces a body of
/// `content_length` bytes, sends `sent` of them (zeros) and then nothing.
pub struct StalledHttp {
    stream: TcpStream,
}

impl StalledHttp {
    pub async fn open(addr: SocketAddr, content_length: usize, sent: usize) -> std::io::Result<StalledHttp> {
        let mut stream = TcpStream::connect(addr).await?;
        let head = format!(
            "POST /v1development/profiles HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/x-protobuf\r\n\
             content-length: {content_length}\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(&vec![0u8; sent.min(content_length)]).await?;
        stream.flush().await?;
        Ok(StalledHttp { stream })
    }

    /// The status code and body of the server's answer, read until the
    /// server closes the connection; None if it closed without one.
    pub async fn answer(mut self) -> Option<(u16, String)> {
        use tokio::io::AsyncReadExt;
        let mut text = Vec::new();
        let _ = self.stream.read_to_end(&mut text).await;
        let text = String::from_utf8_lossy(&text).into_owned();
        let code = text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
        Some((code, body))
    }
}

/// A gRPC Export call (HTTP/2, prior knowledge) that sends its headers and
/// then `body` (None: no DATA frame at all) and never ends its stream.
pub struct StalledGrpc {
    response: h2::client::ResponseFuture,
    /// Kept so the stream stays open.
    _send: h2::SendStream<bytes::Bytes>,
    /// Drives the connection; it ends once the stream and the connection are dropped.
    _connection: tokio::task::JoinHandle<()>,
}

impl StalledGrpc {
    pub async fn open(addr: SocketAddr, body: Option<Vec<u8>>) -> Result<StalledGrpc, String> {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let (client, connection) = h2::client::handshake(tcp).await.map_err(|e| e.to_string())?;
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut client = client.ready().await.map_err(|e| e.to_string())?;
        let req = http::Request::post(format!("http://{addr}{}", crate::raw::PATH))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .expect("a valid request");
        let (response, mut send) = client.send_request(req, false).map_err(|e| e.to_string())?;
        if let Some(b) = body {
            send.send_data(bytes::Bytes::from(b), false).map_err(|e| e.to_string())?;
        }
        Ok(StalledGrpc { response, _send: send, _connection: connection })
    }

    /// The gRPC status the server answers with (from the headers of a
    /// trailers-only answer, or the trailers), or None if the stream broke.
    pub async fn status(self) -> Option<(i32, String)> {
        let resp = self.response.await.ok()?;
        let read = |h: &http::HeaderMap| {
            let code = h.get("grpc-status")?.to_str().ok()?.parse().ok()?;
            let msg = h.get("grpc-message").and_then(|m| m.to_str().ok()).unwrap_or("").to_owned();
            Some((code, msg))
        };
        if let Some(s) = read(resp.headers()) {
            return Some(s);
        }
        let mut body = resp.into_body();
        while let Some(chunk) = body.data().await {
            chunk.ok()?;
        }
        read(&body.trailers().await.ok()??)
    }
}

/// A gRPC message prefix announcing `len` bytes (uncompressed), then `sent` zero bytes of it.
pub fn grpc_message_start(len: u32, sent: usize) -> Vec<u8> {
    let mut v = vec![0u8];
    v.extend_from_slice(&len.to_be_bytes());
    v.extend(std::iter::repeat_n(0u8, sent.min(len as usize)));
    v
}

/// An HTTP/1.1 sender that announces a body of `content_length` bytes, sends
/// it one byte every `pace`, and opens a new connection as soon as the
/// server answers (or closes), for as long as the returned task runs (abort
/// it). Counts the answers it got in `answered`.
pub fn slow_http_sender(
    addr: SocketAddr,
    content_length: usize,
    pace: std::time::Duration,
    answered: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    use tokio::io::AsyncReadExt;
    tokio::spawn(async move {
        loop {
            let Ok(stream) = TcpStream::connect(addr).await else {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            let (mut rd, mut wr) = stream.into_split();
            let head = format!(
                "POST /v1development/profiles HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/x-protobuf\r\n\
                 content-length: {content_length}\r\n\r\n"
            );
            let write = async {
                if wr.write_all(head.as_bytes()).await.is_ok() {
                    for _ in 0..content_length {
                        if wr.write_all(&[0]).await.is_err() {
                            break;
                        }
                        tokio::time::sleep(pace).await;
                    }
                }
                std::future::pending::<()>().await
            };
            let mut buf = [0u8; 4096];
            tokio::select! {
                _ = write => {}
                _ = rd.read(&mut buf) => {}
            }
            answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    })
}

/// The same over gRPC (HTTP/2, prior knowledge): an Export call whose
/// message of `len` bytes is sent one byte every `pace`, a new connection
/// as soon as the server answers.
pub fn slow_grpc_sender(
    addr: SocketAddr,
    len: u32,
    pace: std::time::Duration,
    answered: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let call = async {
                let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
                let (client, connection) = h2::client::handshake(tcp).await.map_err(|e| e.to_string())?;
                let connection = tokio::spawn(async move {
                    let _ = connection.await;
                });
                let mut client = client.ready().await.map_err(|e| e.to_string())?;
                let req = http::Request::post(format!("http://{addr}{}", crate::raw::PATH))
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .body(())
                    .expect("a valid request");
                let (response, mut send) = client.send_request(req, false).map_err(|e| e.to_string())?;
                let prefix = grpc_message_start(len, 0);
                let write = async {
                    if send.send_data(bytes::Bytes::from(prefix), false).is_ok() {
                        for _ in 0..len {
                            tokio::time::sleep(pace).await;
                            if send.send_data(bytes::Bytes::from_static(&[0]), false).is_err() {
                                break;
                            }
                        }
                    }
                    std::future::pending::<()>().await
                };
                tokio::select! {
                    _ = write => {}
                    _ = response => {}
                }
                connection.abort();
                Ok::<(), String>(())
            };
            if call.await.is_err() {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
            answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    })
}
