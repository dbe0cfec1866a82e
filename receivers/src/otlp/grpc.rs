//! The gRPC server: `opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export`.
//!
//! The service is written by hand over a raw-bytes codec (instead of the
//! generated server) so the request's protobuf is decoded here, where a bad
//! message becomes `INVALID_ARGUMENT` with the decoder's reason. tonic caps
//! the message size before and after gzip decompression
//! (`OUT_OF_RANGE` / `RESOURCE_EXHAUSTED`).
//!
//! [`ProfilesService::call`], the outermost point of a request, reads the
//! body itself against the deadlines (`read_timeout`, `min_read_rate_kib`:
//! DEADLINE_EXCEEDED), the size cap (RESOURCE_EXHAUSTED) and the read
//! budget, takes the `max_concurrent_requests` slot once the whole body
//! arrived, and then hands it to `Grpc::unary` (decompression, the cap after
//! it, decoding). Beyond its bytes in the read budget, a body being read has
//! no more in memory than what the HTTP/2 flow-control windows let the
//! connection buffer.

use super::{tls, GrpcConfig, Ingest, IngestError};
use bytes::{Buf, Bytes};
use profcol_api::component::ComponentError;
use profcol_api::model::ExportProfilesServiceResponse;
use std::sync::Arc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EnabledCompressionEncodings, EncodeBuf, Encoder};
use tonic::codegen::{http, Body, BoxFuture, Context, Poll, Service, StdError};
use tonic::Status;

pub(crate) const SERVICE_NAME: &str = "opentelemetry.proto.collector.profiles.v1development.ProfilesService";
const EXPORT_PATH: &str = "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

/// Hands the request message over as bytes; encodes the response with prost.
#[derive(Default, Clone, Copy)]
struct RawCodec;
#[derive(Default)]
struct RawDecoder;
#[derive(Default)]
struct ResponseEncoder;

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n)))
    }
}

impl Encoder for ResponseEncoder {
    type Item = ExportProfilesServiceResponse;
    type Error = Status;
    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        prost::Message::encode(&item, dst).map_err(|e| Status::internal(format!("encoding the response: {e}")))
    }
}

impl Codec for RawCodec {
    type Encode = ExportProfilesServiceResponse;
    type Decode = Bytes;
    type Encoder = ResponseEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> Self::Encoder {
        ResponseEncoder
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawDecoder
    }
}

fn to_status(e: IngestError) -> Status {
    match e {
        IngestError::Invalid(m) => Status::invalid_argument(m),
        IngestError::TooLarge(m) => Status::resource_exhausted(m),
        IngestError::Unavailable(m) => Status::unavailable(m),
        IngestError::Rejected(m) => Status::invalid_argument(m),
        IngestError::TimedOut(m) => Status::deadline_exceeded(m),
    }
}

struct ExportCall(Arc<Ingest>);

impl tonic::server::UnaryService<Bytes> for ExportCall {
    type Response = ExportProfilesServiceResponse;
    type Future = BoxFuture<tonic::Response<Self::Response>, Status>;
    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let ingest = self.0.clone();
        Box::pin(async move {
            let bytes = request.into_inner();
            let batch = ingest.decode_proto(&bytes).inspect_err(|e| ingest.count(e)).map_err(to_status)?;
            drop(bytes);
            let partial_success = ingest.accept(batch).await.map_err(to_status)?;
            Ok(tonic::Response::new(ExportProfilesServiceResponse { partial_success }))
        })
    }
}

/// The ProfilesService as a tower service.
#[derive(Clone)]
pub(crate) struct ProfilesService {
    ingest: Arc<Ingest>,
    max_size: usize,
}

impl tonic::server::NamedService for ProfilesService {
    const NAME: &'static str = SERVICE_NAME;
}

impl<B> Service<http::Request<B>> for ProfilesService
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<StdError> + std::fmt::Display + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != EXPORT_PATH {
            return Box::pin(async move {
                Ok(Status::unimplemented(format!("no such method; this server serves {EXPORT_PATH}")).into_http())
            });
        }
        let ingest = self.ingest.clone();
        let max = self.max_size;
        Box::pin(async move {
            let refuse = |e: IngestError| {
                ingest.count(&e);
                Ok(to_status(e).into_http())
            };
            let (parts, body) = req.into_parts();
            // One message of at most `max` bytes behind its 5-byte prefix.
            let cap = max.saturating_add(5);
            let mut reader = ingest.reader(body, cap);
            // No slot while the body arrives: a slow sender holds only its bytes.
            let bytes = match reader.rest().await {
                Ok(b) => b,
                Err(e) => match ingest.read_error(e, max, "protocols.grpc.max_recv_msg_size_mib") {
                    // A refusal for want of room was counted by `read_error`, as `admit` counts its own.
                    e @ IngestError::Unavailable(_) => return Ok(to_status(e).into_http()),
                    e => return refuse(e),
                },
            };
            // Held until the pipeline took or refused the batch (unary returns after ExportCall).
            let _slot = match ingest.admit().await {
                Ok(slot) => slot,
                Err(e) => return Ok(to_status(e).into_http()),
            };
            let mut enc = EnabledCompressionEncodings::default();
            enc.enable(CompressionEncoding::Gzip);
            let mut grpc = tonic::server::Grpc::new(RawCodec)
                .apply_compression_config(enc, enc)
                .apply_max_message_size_config(Some(max), None);
            let req = http::Request::from_parts(parts, http_body_util::Full::new(bytes));
            let answer = grpc.unary(ExportCall(ingest), req).await;
            // The body's bytes count against the read budget until it is decoded.
            drop(reader);
            Ok(answer)
        })
    }
}

/// Spawns the gRPC server on `listener`; it stops accepting when `cancel`
/// fires and finishes once in-flight requests are answered.
pub(crate) fn serve(
    id: &str,
    listener: Arc<tokio::net::TcpListener>,
    cfg: &GrpcConfig,
    ingest: Arc<Ingest>,
    cancel: CancellationToken,
) -> Result<JoinHandle<()>, ComponentError> {
    let mut builder = tonic::transport::Server::builder();
    if let Some(t) = &cfg.tls {
        let err = |e: String| ComponentError::msg(format!("receiver {id}: protocols.grpc.tls: {e}"));
        let cert = tls::read(&t.cert_file, "cert_file").map_err(err)?;
        let key = tls::read(&t.key_file, "key_file").map_err(err)?;
        let mut tc = tonic::transport::ServerTlsConfig::new().identity(tonic::transport::Identity::from_pem(cert, key));
        if let Some(ca) = &t.client_ca_file {
            tc = tc
                .client_ca_root(tonic::transport::Certificate::from_pem(tls::read(ca, "client_ca_file").map_err(err)?));
        }
        builder = builder.tls_config(tc).map_err(|e| err(e.to_string()))?;
    }
    let svc = ProfilesService { ingest, max_size: super::config::mib(cfg.max_recv_msg_size_mib) };
    // Small answers must not wait for delayed ACKs, and a 1 MiB window lets
    // a typical batch through without flow-control round trips.
    let incoming = tokio_stream::StreamExt::map(profcol_api::listeners::Incoming::new(listener), |s| {
        s.inspect(|s| {
            let _ = s.set_nodelay(true);
        })
    });
    let router = builder
        .initial_stream_window_size(Some(1 << 20))
        .initial_connection_window_size(Some(4 << 20))
        .add_service(svc);
    let id = id.to_owned();
    Ok(tokio::spawn(async move {
        if let Err(e) = router.serve_with_incoming_shutdown(incoming, cancel.cancelled_owned()).await {
            tracing::error!(receiver = %id, "gRPC server stopped: {e}");
        }
    }))
}
