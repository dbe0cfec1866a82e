//! Sorting export failures into retryable and permanent.

use profcol_api::ExportError;
use prost::Message;
use std::time::Duration;

use profcol_api::model::rpc::{RetryInfo, RpcStatus};

/// The longest delay a server's RetryInfo / Retry-After is honoured with:
/// a larger one (up to `u64::MAX` seconds on the wire) would overflow the
/// host's deadline arithmetic or park the exporter for ever.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// Longest server-supplied error detail kept in a message.
const MAX_DETAIL_CHARS: usize = 512;

/// The retry delay a `google.rpc.Status` carries in a RetryInfo detail.
pub(crate) fn retry_delay(details: &[u8]) -> Option<Duration> {
    let st = RpcStatus::decode(details).ok()?;
    st.details.iter().filter(|a| a.type_url.ends_with("google.rpc.RetryInfo")).find_map(|a| {
        let d = RetryInfo::decode(a.value.as_slice()).ok()?.retry_delay?;
        if d.seconds < 0 || d.nanos < 0 {
            return None;
        }
        Some(Duration::new(d.seconds as u64, d.nanos.min(999_999_999) as u32).min(MAX_RETRY_AFTER))
    })
}

/// gRPC status → export error, by the OTLP specification's table
/// (otlp.md, "Failures"): CANCELLED, DEADLINE_EXCEEDED, ABORTED,
/// OUT_OF_RANGE, UNAVAILABLE and DATA_LOSS are retryable, after the
/// RetryInfo delay when the server gave one; RESOURCE_EXHAUSTED is retryable
/// only when the server sent a RetryInfo (it signals throttling; without one
/// it means the request can never fit); everything else is permanent.
/// An UNKNOWN or INTERNAL status that carries a source error was made by the
/// client's own transport (a reset connection, a failed handshake, an HTTP/2
/// GOAWAY from a server going away: tonic maps h2's NO_ERROR to INTERNAL),
/// not answered by the server: like a refused connection, it is retried. So
/// is a RESOURCE_EXHAUSTED with a source: h2's ENHANCE_YOUR_CALM, a server
/// closing the whole connection (say, after too many stream resets), which
/// fails every request on it, not this one for what it holds. A
/// status the server sent (trailers) never has a source.
pub(crate) fn from_grpc(s: &tonic::Status) -> ExportError {
    use tonic::Code;
    let mut message = format!("gRPC {:?}: {}", s.code(), s.message());
    // A transport failure says what happened (a TLS alert, a reset) only in
    // its sources; the message itself is "transport error".
    let source = std::error::Error::source(s);
    super::push_causes(&mut message, source);
    let retry_after = retry_delay(s.details());
    match s.code() {
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unavailable
        | Code::DataLoss => ExportError::Retryable { message, retry_after },
        Code::ResourceExhausted if retry_after.is_some() => ExportError::Retryable { message, retry_after },
        Code::Unknown | Code::Internal | Code::ResourceExhausted if source.is_some() => {
            ExportError::Retryable { message, retry_after: None }
        }
        _ => ExportError::Permanent { message },
    }
}

/// `Retry-After`: delay-seconds or an HTTP-date (at most [`MAX_RETRY_AFTER`]).
pub(crate) fn parse_retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER));
    }
    let t = parse_http_date(v)?;
    Some(t.duration_since(std::time::SystemTime::now()).unwrap_or(Duration::ZERO).min(MAX_RETRY_AFTER))
}

/// IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the form servers send.
fn parse_http_date(v: &str) -> Option<std::time::SystemTime> {
    let p: Vec<&str> = v.split_whitespace().collect();
    if p.len() != 6 || p[5] != "GMT" {
        return None;
    }
    let day: u64 = p[1].parse().ok()?;
    let month = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        .iter()
        .position(|m| *m == p[2])? as u64
        + 1;
    let year: i64 = p[3].parse().ok()?;
    let hms: Vec<u64> = p[4].split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    // In range, the arithmetic below cannot overflow.
    if hms.len() != 3 || !(1..=31).contains(&day) || !(1..=9999).contains(&year) {
        return None;
    }
    if hms[0] > 23 || hms[1] > 59 || hms[2] > 60 {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let (y, m) = if month <= 2 { (year - 1, month + 9) } else { (year, month - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m as i64 + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    let secs = days * 86400 + (hms[0] * 3600 + hms[1] * 60 + hms[2]) as i64;
    Some(std::time::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

/// HTTP status → export error: 429/502/503/504 retryable (after
/// `Retry-After`, or the RetryInfo of a protobuf `google.rpc.Status` body),
/// the rest permanent. `body` is the server's
/// `google.rpc.Status` (or text) for the message.
pub(crate) fn from_http(status: u16, retry_after: Option<&str>, body: &[u8], json: bool) -> ExportError {
    let detail = if json {
        serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
    } else {
        RpcStatus::decode(body).ok().map(|s| s.message).filter(|m| !m.is_empty())
    }
    .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(MAX_DETAIL_CHARS)]).into_owned());
    let detail = match detail.char_indices().nth(MAX_DETAIL_CHARS) {
        Some((cut, _)) => format!("{}…", &detail[..cut]),
        None => detail,
    };
    let message = format!("HTTP {status}: {detail}");
    match status {
        429 | 502 | 503 | 504 => {
            // `Retry-After` first; else a RetryInfo in the google.rpc.Status body.
            let delay = retry_after.and_then(parse_retry_after).or_else(|| if json { None } else { retry_delay(body) });
            ExportError::Retryable { message, retry_after: delay }
        }
        _ => ExportError::Permanent { message },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profcol_api::model::rpc::{Any, ProtoDuration, RETRY_INFO_TYPE};

    #[test]
    fn retry_info_is_read_from_status_details() {
        let ri = RetryInfo { retry_delay: Some(ProtoDuration { seconds: 3, nanos: 500_000_000 }) };
        let st = RpcStatus {
            code: 14,
            message: "busy".into(),
            details: vec![Any { type_url: RETRY_INFO_TYPE.into(), value: ri.encode_to_vec() }],
        };
        let s = tonic::Status::with_details(tonic::Code::Unavailable, "busy", st.encode_to_vec().into());
        match from_grpc(&s) {
            ExportError::Retryable { retry_after, .. } => assert_eq!(retry_after, Some(Duration::from_millis(3500))),
            e => panic!("{e:?}"),
        }
        // RESOURCE_EXHAUSTED: retried only with a RetryInfo.
        assert!(matches!(from_grpc(&tonic::Status::resource_exhausted("x")), ExportError::Permanent { .. }));
        let throttled =
            tonic::Status::with_details(tonic::Code::ResourceExhausted, "slow down", st.encode_to_vec().into());
        assert!(matches!(
            from_grpc(&throttled),
            ExportError::Retryable { retry_after: Some(d), .. } if d == Duration::from_millis(3500)
        ));
        assert!(matches!(from_grpc(&tonic::Status::invalid_argument("x")), ExportError::Permanent { .. }));
        assert!(matches!(from_grpc(&tonic::Status::unauthenticated("x")), ExportError::Permanent { .. }));
        // The server said UNKNOWN: permanent. The client's transport failed: retried, with the cause in the message.
        assert!(matches!(from_grpc(&tonic::Status::unknown("x")), ExportError::Permanent { .. }));
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset by peer");
        match from_grpc(&tonic::Status::from_error(Box::new(reset))) {
            ExportError::Retryable { message, .. } => {
                assert!(message.contains("connection reset by peer"), "{message}")
            }
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn a_server_going_away_mid_request_is_retried() {
        // What tonic's client reports when the backend shuts down (GOAWAY,
        // NO_ERROR) under a request: INTERNAL, from h2, never from the server.
        let s = tonic::Status::from_error(Box::new(h2::Error::from(h2::Reason::NO_ERROR)));
        assert_eq!(s.code(), tonic::Code::Internal);
        assert!(matches!(from_grpc(&s), ExportError::Retryable { .. }), "{s:?}");
        // The same code answered by a server stays permanent.
        assert!(matches!(from_grpc(&tonic::Status::internal("bug")), ExportError::Permanent { .. }));
    }

    #[test]
    fn a_connection_closed_for_too_many_resets_is_retried() {
        // GOAWAY ENHANCE_YOUR_CALM (h2's "too_many_resets" guard) fails every
        // request on the connection with RESOURCE_EXHAUSTED from h2.
        let s = tonic::Status::from_error(Box::new(h2::Error::from(h2::Reason::ENHANCE_YOUR_CALM)));
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        assert!(matches!(from_grpc(&s), ExportError::Retryable { retry_after: None, .. }), "{s:?}");
        // Answered by a server without RetryInfo: the request can never fit.
        assert!(matches!(from_grpc(&tonic::Status::resource_exhausted("too big")), ExportError::Permanent { .. }));
    }

    #[test]
    fn every_grpc_code_is_sorted_as_the_otlp_spec_says() {
        use tonic::Code::*;
        let retryable = [Cancelled, DeadlineExceeded, Aborted, OutOfRange, Unavailable, DataLoss];
        let all = [
            Ok,
            Cancelled,
            Unknown,
            InvalidArgument,
            DeadlineExceeded,
            NotFound,
            AlreadyExists,
            PermissionDenied,
            ResourceExhausted,
            FailedPrecondition,
            Aborted,
            OutOfRange,
            Unimplemented,
            Internal,
            Unavailable,
            DataLoss,
            Unauthenticated,
        ];
        for code in all {
            let e = from_grpc(&tonic::Status::new(code, "x"));
            assert_eq!(matches!(e, ExportError::Retryable { .. }), retryable.contains(&code), "{code:?}: {e:?}");
        }
    }

    #[test]
    fn http_statuses_and_retry_after() {
        for s in [429, 502, 503, 504] {
            assert!(matches!(from_http(s, None, b"", false), ExportError::Retryable { .. }), "{s}");
        }
        for s in [400, 401, 403, 404, 413, 500] {
            assert!(matches!(from_http(s, None, b"", false), ExportError::Permanent { .. }), "{s}");
        }
        match from_http(503, Some("7"), b"", false) {
            ExportError::Retryable { retry_after, .. } => assert_eq!(retry_after, Some(Duration::from_secs(7))),
            e => panic!("{e:?}"),
        }
        // No Retry-After: the RetryInfo of the google.rpc.Status body.
        let ri = RetryInfo { retry_delay: Some(ProtoDuration { seconds: 2, nanos: 0 }) };
        let st = RpcStatus {
            code: 8,
            message: "throttled".into(),
            details: vec![Any { type_url: RETRY_INFO_TYPE.into(), value: ri.encode_to_vec() }],
        };
        match from_http(429, None, &st.encode_to_vec(), false) {
            ExportError::Retryable { retry_after, .. } => assert_eq!(retry_after, Some(Duration::from_secs(2))),
            e => panic!("{e:?}"),
        }
        let body = RpcStatus { code: 3, message: "bad stack index".into(), details: vec![] }.encode_to_vec();
        assert!(from_http(400, None, &body, false).to_string().contains("bad stack index"));
        assert!(from_http(400, None, br#"{"code":3,"message":"bad json"}"#, true).to_string().contains("bad json"));
        let t = parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs(), 784111777);
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT"), Some(Duration::ZERO));
    }

    #[test]
    fn absurd_retry_after_values_neither_panic_nor_stall_the_exporter() {
        // Fields that overflow the date arithmetic are not a date.
        for v in [
            "Sun, 06 Nov 1994 18446744073709551615:00:00 GMT",
            "Sun, 06 Nov 1994 08:18446744073709551615:00 GMT",
            "Sun, 06 Nov 9223372036854775807 08:49:37 GMT",
            "Sun, 06 Nov -9223372036854775808 08:49:37 GMT",
            "Sun, 06 Nov 1994 25:61:99 GMT",
        ] {
            assert_eq!(parse_http_date(v), None, "{v}");
        }
        // A delay the host could not add to an Instant (or would wait on for
        // ever) is capped.
        for ra in ["18446744073709551615", "Fri, 31 Dec 9999 23:59:59 GMT"] {
            match from_http(503, Some(ra), b"", false) {
                ExportError::Retryable { retry_after: Some(d), .. } => assert!(d <= MAX_RETRY_AFTER, "{ra}: {d:?}"),
                e => panic!("{ra}: {e:?}"),
            }
        }
        let ri = RetryInfo { retry_delay: Some(ProtoDuration { seconds: i64::MAX, nanos: 999_999_999 }) };
        let st = RpcStatus {
            code: 14,
            message: "busy".into(),
            details: vec![Any { type_url: RETRY_INFO_TYPE.into(), value: ri.encode_to_vec() }],
        };
        assert_eq!(retry_delay(&st.encode_to_vec()), Some(MAX_RETRY_AFTER));
    }

    #[test]
    fn long_error_bodies_make_bounded_messages() {
        let long = "x".repeat(100_000);
        let body = RpcStatus { code: 3, message: long.clone(), details: vec![] }.encode_to_vec();
        assert!(from_http(400, None, &body, false).to_string().len() < 2048);
        let json = serde_json::json!({ "message": long }).to_string();
        assert!(from_http(400, None, json.as_bytes(), true).to_string().len() < 2048);
    }
}
