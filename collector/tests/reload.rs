//! Reloads that fail leak nothing and never leave a receiver gone; batches
//! in flight across reloads arrive once. The service runs in this process,
//! fed by the real otlp exporter over loopback gRPC; receivers bind port 0
//! and the tests read the address they logged. The leak count is in
//! reload_leaks.rs, alone in its process so no other test's threads count;
//! the SIGHUP case runs the binary.

mod common;

use common::service::*;
use common::*;
use profcol_api::Exporter;
use profcol_testkit::batch::random_batch;
use profcol_testkit::net::listener;
use std::net::SocketAddr;
use std::time::Duration;

/// The otlp receiver moved to a port someone else holds: the reload fails,
/// the old listener keeps serving (a sender sends before, during and after
/// the failed reloads, and every batch arrives, once); a later good reload
/// moves it, make before break, without losing a batch either.
#[test]
fn a_receiver_that_cannot_start_keeps_the_old_one_serving() {
    runtime().block_on(async {
        log();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        let id = "otlp/keeps";
        let mut host = Host::start(&gateway(id, "127.0.0.1:0", "50ms", &out)).await;
        let addr = grpc_addr(id);
        let (_taken, busy) = listener();

        // Before, during and after the failed reloads, on the old listener.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let send_all = tokio::spawn({
            let stop = std::sync::Arc::clone(&stop);
            async move {
                let exp = sender(addr);
                let mut sent = Vec::new();
                for k in 0u64.. {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let b = random_batch(k + 1, 1, 20, 5, 4);
                    // No retry: every export must be answered OK the first time.
                    exp.export(&b).await.unwrap_or_else(|e| panic!("batch {k} to {addr}: {e}"));
                    sent.push(b);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                sent
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        for _ in 0..10 {
            let e = host.reload(&gateway(id, &busy.to_string(), "50ms", &out)).await.unwrap_err();
            assert!(e.contains("cannot listen") && e.contains(&busy.to_string()), "{e}");
            assert!(host.status.running());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut sent = send_all.await.unwrap();
        assert!(sent.len() > 20, "{} batches sent", sent.len());
        // A later good reload works: the receiver moves to a new port (a
        // changed endpoint: a new instance) and the old listener closes.
        host.reload(&gateway(id, "localhost:0", "50ms", &out)).await.unwrap();
        let moved = grpc_addr(id);
        assert_ne!(moved, addr);
        assert!(std::net::TcpStream::connect(addr).is_err(), "the old listener closed");
        let exp = sender(moved);
        for k in 0..20 {
            let b = random_batch(10_000 + k, 1, 20, 5, 4);
            exp.export(&b).await.unwrap();
            sent.push(b);
        }
        assert_all_arrive_once(&out, &sent).await;
        host.service.shutdown().await;
    });
}

/// The same receiver on the same gRPC port but with an HTTP side on a taken
/// port: the new instance takes over the gRPC socket the old one listens on,
/// fails on the HTTP port, and the old one serves on, on its port.
#[test]
fn a_receiver_stopped_for_its_successor_starts_again_when_the_successor_fails() {
    runtime().block_on(async {
        log();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        let id = "otlp/restarts";
        let mut host = Host::start(&gateway(id, "127.0.0.1:0", "50ms", &out)).await;
        let addr = grpc_addr(id);
        let (_taken, busy) = listener();
        let with_http = gateway(id, &addr.to_string(), "50ms", &out)
            .replace("processors:\n", &format!("      http:\n        endpoint: {busy}\nprocessors:\n"));
        let e = host.reload(&with_http).await.unwrap_err();
        assert!(e.contains("protocols.http") && e.contains(&busy.to_string()), "{e}");
        assert!(host.status.running());
        assert_eq!(grpc_addr(id), addr, "started again on its port");
        let b = random_batch(3, 2, 100, 10, 5);
        sender(addr).export(&b).await.unwrap();
        assert_all_arrive_once(&out, std::slice::from_ref(&b)).await;
        host.service.shutdown().await;
    });
}

/// Ten successful reloads under load, each rebuilding the pipeline and its
/// batch processor while the receiver is kept: every batch sent arrives,
/// none twice.
#[test]
fn batches_in_flight_across_successful_reloads_arrive_once() {
    runtime().block_on(async {
        log();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        let id = "otlp/inflight";
        let mut host = Host::start(&gateway(id, "127.0.0.1:0", "40ms", &out)).await;
        let addr = grpc_addr(id);
        let senders: Vec<_> = (0..3u64)
            .map(|s| {
                tokio::spawn(async move {
                    let exp = sender(addr);
                    let mut sent = Vec::new();
                    for k in 0..150u64 {
                        let b = random_batch(1000 * s + k + 1, 1, 15, 5, 4);
                        exp.export(&b).await.unwrap_or_else(|e| panic!("sender {s} batch {k}: {e}"));
                        sent.push(b);
                        tokio::time::sleep(Duration::from_millis(3)).await;
                    }
                    sent
                })
            })
            .collect();
        for i in 0..10 {
            tokio::time::sleep(Duration::from_millis(60)).await;
            // The receiver's config (port 0) is unchanged: the instance is kept.
            host.reload(&gateway(id, "127.0.0.1:0", &format!("{}ms", 41 + i), &out)).await.unwrap();
        }
        let mut sent = Vec::new();
        for s in senders {
            sent.extend(s.await.unwrap());
        }
        assert_eq!(grpc_addr(id), addr, "the receiver was kept");
        assert_all_arrive_once(&out, &sent).await;
        host.service.shutdown().await;
    });
}

fn http_status(addr: SocketAddr) -> u16 {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else { return 0 };
    let _ = write!(s, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// The case through the binary: SIGHUP moving the otlp receiver to a
/// port in use keeps the old listener, does not say "configuration
/// reloaded", keeps health at 200; a later good reload moves it.
#[test]
fn sighup_moving_the_otlp_receiver_to_a_taken_port_keeps_the_old_listener() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.jsonl");
    let (_taken, busy) = listener();
    let config = |endpoint: &str| {
        gateway("otlp", endpoint, "50ms", &out).replace(
            "service:\n",
            "extensions:\n  health_check:\n    endpoint: 127.0.0.1:0\nservice:\n  extensions: [health_check]\n",
        )
    };
    let cfgp = write(&dir.path().join("c.yaml"), &config("127.0.0.1:0"));
    let mut p = Profcol::start(&["--config", cfgp.to_str().unwrap()]);
    assert!(p.wait_log("profcol started", Duration::from_secs(20)));
    let health = p.wait_addr("health_check listening", "address", Duration::from_secs(5));
    let first = p.wait_addr("otlp receiver listening", "grpc", Duration::from_secs(5));
    assert_eq!(http_status(health), 200);
    let rt = runtime();
    let send = |addr: SocketAddr, seed: u64| {
        let b = random_batch(seed, 1, 30, 5, 4);
        rt.block_on(async { sender(addr).export(&b).await }).unwrap_or_else(|e| panic!("{addr}: {e}"));
        b
    };
    let mut sent = vec![send(first, 1)];
    write(&cfgp, &config(&busy.to_string()));
    p.signal(libc::SIGHUP);
    assert!(p.wait_log("reload failed; keeping the running configuration", Duration::from_secs(20)));
    assert!(p.log.lock().unwrap().iter().any(|l| l.contains("reload failed") && l.contains(&busy.to_string())));
    assert_eq!(p.log_count("configuration reloaded"), 0);
    assert_eq!(http_status(health), 200, "health stays OK");
    sent.push(send(first, 2));
    write(&cfgp, &config("localhost:0"));
    p.signal(libc::SIGHUP);
    assert!(p.wait_log("configuration reloaded", Duration::from_secs(20)));
    assert_eq!(http_status(health), 200);
    let lines: Vec<String> =
        p.log.lock().unwrap().iter().filter(|l| l.contains("otlp receiver listening")).cloned().collect();
    let moved = profcol_testkit::net::addr_in_log(lines.last().unwrap(), "grpc").unwrap();
    assert_ne!(moved, first);
    sent.push(send(moved, 3));
    rt.block_on(assert_all_arrive_once(&out, &sent));
    p.signal(libc::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
}

fn http_get(addr: SocketAddr, path: &str) -> u16 {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else { return 0 };
    let _ = write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// health_check keeps its port and changes its path: the new instance takes
/// the old one's socket, then the old one stops. When a later part of the
/// reload fails, the old instance is back on its port with its path.
#[test]
fn an_extension_changed_on_the_same_port_is_replaced_and_put_back_when_the_reload_fails() {
    runtime().block_on(async {
        log();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        let id = "otlp/ext";
        let with_health = |endpoint: &str, health: &str, path: &str| {
            gateway(id, endpoint, "50ms", &out).replace(
                "service:\n",
                &format!(
                    "extensions:\n  health_check/r:\n    endpoint: {health}\n    path: {path}\n\
                     service:\n  extensions: [health_check/r]\n"
                ),
            )
        };
        let mut host = Host::start(&with_health("127.0.0.1:0", "127.0.0.1:0", "/a")).await;
        let health =
            log().addr(&["health_check listening", "path=/a"], "address").expect("health_check logged its address");
        let addr = grpc_addr(id);
        assert_eq!(http_get(health, "/a"), 200);
        // Same port, another path: replaced in place.
        host.reload(&with_health(&addr.to_string(), &health.to_string(), "/b")).await.unwrap();
        assert_eq!((http_get(health, "/b"), http_get(health, "/a")), (200, 404));
        // The receiver's move fails after the extension was replaced: all back.
        let (_taken, busy) = listener();
        let e = host.reload(&with_health(&busy.to_string(), &health.to_string(), "/c")).await.unwrap_err();
        assert!(e.contains(&busy.to_string()), "{e}");
        assert_eq!((http_get(health, "/b"), http_get(health, "/c")), (200, 404), "the previous health_check is back");
        assert!(host.status.running());
        let b = random_batch(11, 1, 20, 5, 4);
        sender(addr).export(&b).await.unwrap();
        assert_all_arrive_once(&out, std::slice::from_ref(&b)).await;
        host.service.shutdown().await;
    });
}

/// GET on a new connection: Err if the connection was refused, else the
/// status (0: closed without an answer).
fn health_get(addr: SocketAddr, path: &str) -> std::io::Result<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    let _ = write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    Ok(text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0))
}

/// Twenty reloads that each change health_check's path on the same port and
/// then fail (the receiver moves to a port someone else holds), under four
/// pollers that open a new connection for every request: health_check's
/// port never closes, so no connection is refused.
#[test]
fn failed_reloads_never_close_the_health_check_port() {
    runtime().block_on(async {
        log();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        let id = "otlp/healthkept";
        let with_health = |endpoint: &str, health: &str, path: &str| {
            gateway(id, endpoint, "50ms", &out).replace(
                "service:\n",
                &format!(
                    "extensions:\n  health_check/k:\n    endpoint: {health}\n    path: {path}\n\
                     service:\n  extensions: [health_check/k]\n"
                ),
            )
        };
        let mut host = Host::start(&with_health("127.0.0.1:0", "127.0.0.1:0", "/ka")).await;
        let health =
            log().addr(&["health_check listening", "path=/ka"], "address").expect("health_check logged its address");
        let (_taken, busy) = listener();
        let failing = with_health(&busy.to_string(), &health.to_string(), "/kb");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pollers: Vec<_> = (0..4)
            .map(|_| {
                let stop = std::sync::Arc::clone(&stop);
                std::thread::spawn(move || {
                    let (mut answered, mut refused, mut unanswered) = (0u64, 0u64, 0u64);
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        match health_get(health, "/ka") {
                            Err(_) => refused += 1,
                            Ok(0) => unanswered += 1,
                            Ok(_) => answered += 1,
                        }
                    }
                    (answered, refused, unanswered)
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        for _ in 0..20 {
            let e = host.reload(&failing).await.unwrap_err();
            assert!(e.contains(&busy.to_string()), "{e}");
            assert!(host.status.running());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (mut answered, mut refused, mut unanswered) = (0, 0, 0);
        for p in pollers {
            let (a, r, u) = p.join().unwrap();
            answered += a;
            refused += r;
            unanswered += u;
        }
        eprintln!("{answered} health requests answered, {refused} refused, {unanswered} closed unanswered");
        assert!(answered > 100, "{answered} requests: not under load");
        assert_eq!(refused, 0, "health_check's port closed during a failed reload");
        assert_eq!(http_get(health, "/ka"), 200, "the old health_check still serves");
        host.service.shutdown().await;
    });
}

/// One Export on a new connection: Err("refused") if the connection was
/// not taken, Err(status) if the call failed.
async fn export_on_new_connection(addr: SocketAddr, body: bytes::Bytes) -> Result<(), String> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .map_err(|e| format!("refused: {e:?}"))?;
    let mut g = tonic::client::Grpc::new(ch);
    g.ready().await.map_err(|e| format!("not ready: {e}"))?;
    g.unary(
        tonic::Request::new(body),
        http::uri::PathAndQuery::from_static(profcol_testkit::raw::PATH),
        profcol_testkit::raw::Raw,
    )
    .await
    .map(|_| ())
    .map_err(|e| format!("{:?}: {}", e.code(), e.message()))
}

/// Twenty reloads that each fail (the receiver keeps its gRPC port and adds
/// an HTTP side on a port someone else holds) under ten senders that open
/// a new connection for every request: the gRPC port never closes, so no
/// connection is refused and no request fails.
#[test]
fn failed_reloads_never_close_a_port_under_load() {
    runtime().block_on(async {
        log();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        let id = "otlp/portkept";
        let mut host = Host::start(&gateway(id, "127.0.0.1:0", "50ms", &out)).await;
        let addr = grpc_addr(id);
        let (_taken, busy) = listener();
        let with_http = gateway(id, &addr.to_string(), "50ms", &out)
            .replace("processors:\n", &format!("      http:\n        endpoint: {busy}\nprocessors:\n"));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let senders: Vec<_> = (0..10u64)
            .map(|s| {
                let stop = std::sync::Arc::clone(&stop);
                tokio::spawn(async move {
                    let body = bytes::Bytes::from(prost::Message::encode_to_vec(&random_batch(s + 1, 1, 10, 5, 4).0));
                    let (mut sent, mut failed) = (0u64, Vec::new());
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        match export_on_new_connection(addr, body.clone()).await {
                            Ok(()) => sent += 1,
                            Err(e) => failed.push(e),
                        }
                    }
                    (sent, failed)
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        for _ in 0..20 {
            let e = host.reload(&with_http).await.unwrap_err();
            assert!(e.contains("protocols.http") && e.contains(&busy.to_string()), "{e}");
            assert!(host.status.running());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (mut sent, mut failed) = (0, Vec::new());
        for s in senders {
            let (n, f) = s.await.unwrap();
            sent += n;
            failed.extend(f);
        }
        let refused = failed.iter().filter(|e| e.starts_with("refused")).count();
        eprintln!("{sent} requests answered OK, {} failed ({refused} refused)", failed.len());
        assert!(sent > 100, "{sent} requests: not under load");
        assert!(
            failed.is_empty(),
            "{refused} refused, {} failed in all; the first: {:?}",
            failed.len(),
            failed.first()
        );
        assert_eq!(grpc_addr(id), addr);
        host.service.shutdown().await;
    });
}
