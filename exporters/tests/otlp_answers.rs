//! A server's answer is read with a bound: a broken or hostile backend that
//! streams an endless body must not grow the exporter's memory (nor hold the
//! export until the host's timeout).

use profcol_api::component::Kind;
use profcol_api::{ExportError, Exporter};
use profcol_exporters::otlp::{OtlpHttpConfig, OtlpHttpExporter};
use profcol_exporters::pprof::{PprofConfig, PprofExporter};
use profcol_testkit::prelude::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Answers every request with `status` and an endless chunked body (64 KiB
/// every 2 ms, so a reader without a bound grows by ~32 MB/s).
async fn endless_server(status: &'static str) -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = l.accept().await else { return };
            tokio::spawn(async move {
                // Read the request head and whatever body arrives at once.
                let mut buf = vec![0u8; 1 << 20];
                let _ = tokio::time::timeout(Duration::from_millis(200), c.read(&mut buf)).await;
                let head = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ntransfer-encoding: chunked\r\n\r\n"
                );
                if c.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b'x'; 64 << 10];
                let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
                frame.extend_from_slice(&chunk);
                frame.extend_from_slice(b"\r\n");
                for _ in 0..100_000 {
                    if c.write_all(&frame).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            });
        }
    });
    addr
}

async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f).await.expect("the export read the endless answer for 10 s")
}

#[tokio::test]
async fn otlp_http_reads_an_endless_answer_only_up_to_a_bound() {
    let batch = cpu_batch(1, 1, 5);
    for (status, ok) in [("200 OK", true), ("400 Bad Request", false)] {
        let addr = endless_server(status).await;
        let cfg = OtlpHttpConfig { endpoint: Some(format!("http://{addr}").into()), ..Default::default() };
        let e = OtlpHttpExporter::new(settings(Kind::Exporter, "otlp_http"), cfg).unwrap();
        let r = bounded(e.export(&batch)).await;
        if ok {
            r.unwrap();
        } else {
            match r {
                Err(ExportError::Permanent { message }) => {
                    assert!(message.starts_with("HTTP 400") && message.len() < 2048, "{}", message.len())
                }
                r => panic!("{r:?}"),
            }
        }
    }
}

#[tokio::test]
async fn pprof_push_reads_an_endless_error_answer_only_up_to_a_bound() {
    let addr = endless_server("503 Service Unavailable").await;
    let cfg = PprofConfig { endpoint: Some(format!("http://{addr}").into()), ..Default::default() };
    let e = PprofExporter::new(settings(Kind::Exporter, "pprof"), cfg).unwrap();
    match bounded(e.export(&cpu_batch(1, 1, 5))).await {
        Err(ExportError::Retryable { message, .. }) => assert!(message.starts_with("HTTP 503"), "{message}"),
        r => panic!("{r:?}"),
    }
}
