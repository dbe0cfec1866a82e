//! The `google.rpc` messages OTLP servers answer errors with: a status in
//! the `grpc-status-details-bin` trailer and in OTLP/HTTP error bodies, and
//! the RetryInfo detail that says when to retry. One definition for the otlp
//! receiver (which writes them) and the otlp exporters (which read them).

/// `google.rpc.Status` (the `grpc-status-details-bin` trailer and the body of
/// OTLP/HTTP error answers).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<Any>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Any {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `google.rpc.RetryInfo`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    pub retry_delay: Option<ProtoDuration>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProtoDuration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

pub const RETRY_INFO_TYPE: &str = "type.googleapis.com/google.rpc.RetryInfo";
