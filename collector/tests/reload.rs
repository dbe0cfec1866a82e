//! Reloads that fail leak nothing and never leave a receiver gone; batches
//! in flight across reloads arrive once. The service runs in this process
//! (so its threads, tokio tasks, fds and BPF links can be counted), fed by
//! the real otlp exporter over loopback gRPC. The leak count is in
//! reload_leaks.rs, alone in its process so no other test's threads count.

mod common;

use common::service::*;
use common::*;
use profcol_api::Exporter;
use std::time::Duration;

/// The otlp receiver moved to a port someone else holds: the reload fails,
/// the old listener keeps serving (a sender sends before, during and after
/// the failed reloads, and every batch arrives, once); a later good reload
/// moves it, make before break, without losing a batch either.
#[test]
fn a_receiver_that_cannot_start_keeps_the_old_one_serving() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        let port = free_port();
        let mut host = Host::start(&gateway(port, "50ms", &out)).await;
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let busy = taken.local_addr().unwrap().port();

        let (tx, mut rx) = tokio::sync::mpsc::channel::<u16>(1);
        let send_all = tokio::spawn(async move {
            let mut port = port;
            let mut exp = sender(port);
            let mut sent = Vec::new();
            for k in 0..300u64 {
                if let Ok(p) = rx.try_recv() {
                    port = p;
                    exp = sender(port);
                }
                let b = batch(k + 1, 1, 20, 5, 4);
                // No retry: every export must be answered OK the first time.
                exp.export(&b).await.unwrap_or_else(|e| panic!("batch {k} to port {port}: {e}"));
                sent.push(b);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            sent
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        for _ in 0..10 {
            let e = host.reload(&gateway(busy, "50ms", &out)).await.unwrap_err();
            assert!(e.contains("cannot listen") && e.contains(&busy.to_string()), "{e}");
            assert!(host.status.running());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A later good reload works: the receiver moves to a free port.
        let port2 = free_port();
        host.reload(&gateway(port2, "50ms", &out)).await.unwrap();
        tx.send(port2).await.unwrap();
        let sent = send_all.await.unwrap();
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "the old listener closed");
        assert_all_arrive_once(&out, &sent).await;
        host.service.shutdown().await;
    });
}

/// The same receiver on the same gRPC port but with its HTTP side moved to a
/// taken port: the old instance must stop first (it holds the gRPC port),
/// the new one fails, and the old one serves again.
#[test]
fn a_receiver_stopped_for_its_successor_starts_again_when_the_successor_fails() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        let port = free_port();
        let mut host = Host::start(&gateway(port, "50ms", &out)).await;
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let busy = taken.local_addr().unwrap().port();
        let with_http = gateway(port, "50ms", &out).replace(
            "        endpoint: 127.0.0.1:",
            &format!("        endpoint: 127.0.0.1:{port}\n      http:\n        endpoint: 127.0.0.1:{busy}\n#"),
        );
        let e = host.reload(&with_http).await.unwrap_err();
        assert!(e.contains("protocols.http") && e.contains(&busy.to_string()), "{e}");
        assert!(host.status.running());
        let b = batch(3, 2, 100, 10, 5);
        sender(port).export(&b).await.unwrap();
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
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        let port = free_port();
        let mut host = Host::start(&gateway(port, "40ms", &out)).await;
        let senders: Vec<_> = (0..3u64)
            .map(|s| {
                tokio::spawn(async move {
                    let exp = sender(port);
                    let mut sent = Vec::new();
                    for k in 0..150u64 {
                        let b = batch(1000 * s + k + 1, 1, 15, 5, 4);
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
            host.reload(&gateway(port, &format!("{}ms", 41 + i), &out)).await.unwrap();
        }
        let mut sent = Vec::new();
        for s in senders {
            sent.extend(s.await.unwrap());
        }
        assert_all_arrive_once(&out, &sent).await;
        host.service.shutdown().await;
    });
}

fn http_status(addr: &str) -> u16 {
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
    let (port, hport) = (free_port(), free_port());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().port();
    let with_health = |p: u16| {
        gateway(p, "50ms", &out)
            .replace("service:\n", &format!("extensions:\n  health_check:\n    endpoint: 127.0.0.1:{hport}\nservice:\n  extensions: [health_check]\n"))
    };
    let cfgp = write(&dir.path().join("c.yaml"), &with_health(port));
    let mut p = Profcol::start(&["--config", cfgp.to_str().unwrap()]);
    assert!(p.wait_log("profcol started", Duration::from_secs(20)));
    let haddr = format!("127.0.0.1:{hport}");
    assert_eq!(http_status(&haddr), 200);
    let rt = runtime();
    let send = |port: u16, seed: u64| {
        let b = batch(seed, 1, 30, 5, 4);
        rt.block_on(async { sender(port).export(&b).await }).unwrap_or_else(|e| panic!("port {port}: {e}"));
        b
    };
    let mut sent = vec![send(port, 1)];
    write(&cfgp, &with_health(busy));
    p.signal(libc::SIGHUP);
    assert!(p.wait_log("reload failed; keeping the running configuration", Duration::from_secs(20)));
    assert!(p.log.lock().unwrap().iter().any(|l| l.contains("reload failed") && l.contains(&busy.to_string())));
    assert_eq!(p.log_count("configuration reloaded"), 0);
    assert_eq!(http_status(&haddr), 200, "health stays OK");
    sent.push(send(port, 2));
    let port2 = free_port();
    write(&cfgp, &with_health(port2));
    p.signal(libc::SIGHUP);
    assert!(p.wait_log("configuration reloaded", Duration::from_secs(20)));
    assert_eq!(http_status(&haddr), 200);
    sent.push(send(port2, 3));
    rt.block_on(assert_all_arrive_once(&out, &sent));
    p.signal(libc::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
    drop(taken);
}
