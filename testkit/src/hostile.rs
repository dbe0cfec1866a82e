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
/// empty `Sample`s (2 bytes each on the wire, ~100 bytes decoded in a
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

/// An HTTP/1.1 request to the profiles route that announces `content_length`
/// bytes, sends `sent` of them (zeros) and then nothing. Keep the stream to
/// keep the connection open.
pub async fn stalled_http(addr: SocketAddr, content_length: usize, sent: usize) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(addr).await?;
    let head = format!(
        "POST /v1development/profiles HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/x-protobuf\r\n\
         content-length: {content_length}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(&vec![0u8; sent.min(content_length)]).await?;
    s.flush().await?;
    Ok(s)
}

/// A gRPC Export call over HTTP/2 (prior knowledge) whose message header
/// announces `message_len` bytes, of which `sent` follow, and then nothing
/// (no END_STREAM). Keep the stream to keep the connection open.
pub async fn stalled_grpc(addr: SocketAddr, message_len: u32, sent: usize) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(addr).await?;
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    // SETTINGS (empty), then HEADERS on stream 1 with END_HEADERS.
    out.extend_from_slice(&h2_frame(0x4, 0, 0, &[]));
    let mut hpack = vec![0x83, 0x86]; // :method POST, :scheme http (static table)
    let literal = |h: &mut Vec<u8>, name_index: u8, value: &str| {
        // Literal without indexing, indexed name (4-bit prefix), plain value.
        if name_index < 15 {
            h.push(name_index);
        } else {
            h.push(0x0f);
            h.push(name_index - 15);
        }
        h.push(value.len() as u8);
        h.extend_from_slice(value.as_bytes());
    };
    literal(&mut hpack, 4, crate::raw::PATH);
    literal(&mut hpack, 1, &addr.to_string());
    literal(&mut hpack, 31, "application/grpc");
    // te: trailers (a new name).
    hpack.extend_from_slice(&[0x00, 2, b't', b'e', 8]);
    hpack.extend_from_slice(b"trailers");
    out.extend_from_slice(&h2_frame(0x1, 0x4, 1, &hpack));
    let mut data = vec![0u8];
    data.extend_from_slice(&message_len.to_be_bytes());
    data.extend(std::iter::repeat_n(0u8, sent.min(message_len as usize)));
    out.extend_from_slice(&h2_frame(0x0, 0, 1, &data));
    s.write_all(&out).await?;
    s.flush().await?;
    Ok(s)
}

fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}
