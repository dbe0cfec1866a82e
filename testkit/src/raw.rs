//! Raw OTLP requests for the receiver tests: bytes sent as they are over
//! gRPC and HTTP, so garbage, oversized and hand-gzipped bodies can be sent.

use bytes::{BufMut, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

pub const PATH: &str = "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

/// Sends pre-encoded bytes as the request.
#[derive(Clone, Copy)]
pub struct Raw;
pub struct RawEnc;
pub struct RawDec;
impl Encoder for RawEnc {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put(item);
        Ok(())
    }
}
impl Decoder for RawDec {
    type Item = ();
    type Error = tonic::Status;
    fn decode(&mut self, _src: &mut DecodeBuf<'_>) -> Result<Option<()>, tonic::Status> {
        Ok(Some(()))
    }
}
impl Codec for Raw {
    type Encode = Bytes;
    type Decode = ();
    type Encoder = RawEnc;
    type Decoder = RawDec;
    fn encoder(&mut self) -> RawEnc {
        RawEnc
    }
    fn decoder(&mut self) -> RawDec {
        RawDec
    }
}

pub async fn grpc_send(addr: std::net::SocketAddr, body: Vec<u8>, gzip: bool) -> Result<(), tonic::Status> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let mut g = tonic::client::Grpc::new(ch);
    if gzip {
        g = g.send_compressed(tonic::codec::CompressionEncoding::Gzip);
    }
    g.ready().await.unwrap();
    g.unary(tonic::Request::new(Bytes::from(body)), http::uri::PathAndQuery::from_static(PATH), Raw).await.map(|_| ())
}

pub async fn http_send(
    addr: std::net::SocketAddr,
    body: Vec<u8>,
    ct: &str,
    gzip: bool,
) -> (u16, Option<String>, String) {
    let mut req =
        reqwest::Client::new().post(format!("http://{addr}/v1development/profiles")).header("content-type", ct);
    if gzip {
        req = req.header("content-encoding", "gzip");
    }
    let r = req.body(body).send().await.unwrap();
    let ra = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    let code = r.status().as_u16();
    let text = String::from_utf8_lossy(&r.bytes().await.unwrap()).into_owned();
    (code, ra, text)
}
