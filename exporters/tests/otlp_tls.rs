//! TLS end to end: the otlp / otlp_http exporters against a second collector's
//! otlp receiver over rustls, with a CA and certificates made by rcgen at test
//! time. Trusted server → batches arrive intact; mTLS is enforced; a wrong CA
//! or server name fails with an error about the certificate; bad TLS settings
//! are refused at construction, naming the setting and the file.

use profcol_api::component::Kind;
use profcol_api::model::canonical;
use profcol_api::{Exporter, Receiver};
use profcol_exporters::otlp::{
    ClientTlsConfig, Compression, OtlpGrpcConfig, OtlpGrpcExporter, OtlpHttpConfig, OtlpHttpExporter,
};
use profcol_receivers::otlp::testing::{collecting_receiver, receiver_config, LOOPBACK};
use profcol_receivers::otlp::{OtlpReceiver, TlsServerConfig};
use profcol_testkit::prelude::*;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose as Eku, IsCa, KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A CA and what it signed, as PEM files in a tempdir.
struct Pki {
    dir: tempfile::TempDir,
    ca: PathBuf,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
}

type Ca = (rcgen::Certificate, KeyPair);

fn ca(cn: &str) -> Ca {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().unwrap();
    (p.self_signed(&key).unwrap(), key)
}

/// A leaf certificate for `names` signed by `issuer`, written as `{stem}.pem` / `{stem}-key.pem`.
fn leaf(dir: &Path, stem: &str, names: &[&str], eku: Eku, issuer: &Ca) -> (PathBuf, PathBuf) {
    let mut p = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    p.distinguished_name.push(DnType::CommonName, stem);
    p.extended_key_usages = vec![eku];
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, &issuer.0, &issuer.1).unwrap();
    (write(dir, &format!("{stem}.pem"), &cert.pem()), write(dir, &format!("{stem}-key.pem"), &key.serialize_pem()))
}

fn write(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, pem).unwrap();
    p
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let root = ca("profcol test CA");
    let ca = write(dir.path(), "ca.pem", &root.0.pem());
    let server = leaf(dir.path(), "server", &["localhost", "127.0.0.1"], Eku::ServerAuth, &root);
    let client = leaf(dir.path(), "client", &["exporter"], Eku::ClientAuth, &root);
    Pki { dir, ca, server, client }
}

/// A receiver with TLS on both protocols (client certificates required with `client_ca`).
async fn start_receiver(pki: &Pki, client_ca: Option<&Path>) -> (Arc<OtlpReceiver>, Arc<Collector>) {
    let tls = Some(TlsServerConfig {
        cert_file: pki.server.0.clone(),
        key_file: pki.server.1.clone(),
        client_ca_file: client_ca.map(Path::to_path_buf),
    });
    let mut cfg = receiver_config(Some(LOOPBACK), Some(LOOPBACK));
    cfg.protocols.grpc.as_mut().unwrap().tls = tls.clone();
    cfg.protocols.http.as_mut().unwrap().tls = tls;
    collecting_receiver("otlp/in", cfg).await
}

fn trust(ca: &Path) -> ClientTlsConfig {
    ClientTlsConfig { ca_file: Some(ca.to_path_buf()), ..Default::default() }
}

fn with_client_cert(ca: &Path, (cert, key): &(PathBuf, PathBuf)) -> ClientTlsConfig {
    ClientTlsConfig { cert_file: Some(cert.clone()), key_file: Some(key.clone()), ..trust(ca) }
}

fn grpc(endpoint: String, tls: ClientTlsConfig, compression: Compression) -> OtlpGrpcExporter {
    let cfg = OtlpGrpcConfig { endpoint: Some(endpoint), tls, compression, ..Default::default() };
    OtlpGrpcExporter::new(settings(Kind::Exporter, "otlp/out"), cfg).unwrap()
}

fn http(endpoint: String, tls: ClientTlsConfig, compression: Compression) -> OtlpHttpExporter {
    let cfg = OtlpHttpConfig { endpoint: Some(endpoint.into()), tls, compression, ..Default::default() };
    OtlpHttpExporter::new(settings(Kind::Exporter, "otlp_http/out"), cfg).unwrap()
}

/// Both exporters of one TLS setting against a started receiver.
fn both(r: &OtlpReceiver, host: &str, tls: ClientTlsConfig) -> [Box<dyn Exporter>; 2] {
    let (g, h) = (r.grpc_addr().unwrap().port(), r.http_addr().unwrap().port());
    [
        Box::new(grpc(format!("https://{host}:{g}"), tls.clone(), Compression::Gzip)),
        Box::new(http(format!("https://{host}:{h}"), tls, Compression::None)),
    ]
}

/// Exports a few batches and checks they all arrived as sent.
async fn roundtrip(exporter: &dyn Exporter, collector: &Collector) {
    collector.batches.lock().unwrap().clear();
    let batches: Vec<_> = (0..3).map(|k| cpu_batch(k, 2, 30)).collect();
    let total: usize = batches.iter().map(|b| b.sample_count()).sum();
    for b in &batches {
        exporter.export(b).await.unwrap();
    }
    collector.wait_for(total, Duration::from_secs(10)).await;
    let (got, want) = (canonical::samples(&collector.merged()), canonical::samples(&merge(&batches)));
    assert_eq!(got.len(), want.len());
    assert!(got == want, "sample multisets differ");
}

/// One export that must fail, with nothing reaching the receiver; returns the message.
async fn refused(exporter: &dyn Exporter, collector: &Collector) -> String {
    let e = exporter.export(&cpu_batch(9, 1, 5)).await.unwrap_err();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(collector.sample_count(), 0, "data arrived despite the failed export: {e}");
    e.to_string()
}

#[tokio::test]
async fn grpc_over_tls() {
    let pki = pki();
    let (r, c) = start_receiver(&pki, None).await;
    let port = r.grpc_addr().unwrap().port();
    // By name; and by address (no scheme: TLS is the default) with the name from server_name_override.
    roundtrip(&grpc(format!("https://localhost:{port}"), trust(&pki.ca), Compression::Gzip), &c).await;
    let tls = ClientTlsConfig { server_name_override: Some("localhost".into()), ..trust(&pki.ca) };
    roundtrip(&grpc(format!("127.0.0.1:{port}"), tls, Compression::None), &c).await;
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn http_over_tls() {
    let pki = pki();
    let (r, c) = start_receiver(&pki, None).await;
    let port = r.http_addr().unwrap().port();
    for compression in [Compression::Gzip, Compression::None] {
        roundtrip(&http(format!("https://localhost:{port}"), trust(&pki.ca), compression), &c).await;
    }
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn mtls_requires_a_client_certificate_from_the_ca() {
    let pki = pki();
    let (r, c) = start_receiver(&pki, Some(&pki.ca)).await;
    for e in both(&r, "localhost", with_client_cert(&pki.ca, &pki.client)) {
        roundtrip(e.as_ref(), &c).await;
    }
    c.batches.lock().unwrap().clear();
    // No client certificate, or one from another CA: refused.
    let stranger = leaf(pki.dir.path(), "stranger", &["exporter"], Eku::ClientAuth, &ca("other CA"));
    for (tls, alert) in [(trust(&pki.ca), "CertificateRequired"), (with_client_cert(&pki.ca, &stranger), "UnknownCA")] {
        for e in both(&r, "localhost", tls) {
            let m = refused(e.as_ref(), &c).await;
            assert!(m.contains(&format!("received fatal alert: {alert}")), "{m}");
        }
    }
    r.shutdown().await.unwrap();
}

#[tokio::test]
async fn wrong_ca_or_server_name_fails_with_a_certificate_error() {
    let pki = pki();
    let (r, c) = start_receiver(&pki, None).await;
    let other_ca = write(pki.dir.path(), "other-ca.pem", &ca("other CA").0.pem());
    for e in both(&r, "localhost", trust(&other_ca)) {
        let m = refused(e.as_ref(), &c).await;
        assert!(m.contains("invalid peer certificate: UnknownIssuer"), "{m}");
    }
    // gRPC checks the certificate against server_name_override, not the endpoint's host.
    let tls = ClientTlsConfig { server_name_override: Some("not-localhost.example".into()), ..trust(&pki.ca) };
    let m = refused(&grpc(format!("https://localhost:{}", r.grpc_addr().unwrap().port()), tls, Compression::Gzip), &c)
        .await;
    assert!(m.contains(r#"invalid peer certificate: certificate not valid for name "not-localhost.example""#), "{m}");
    r.shutdown().await.unwrap();
}

#[test]
fn bad_tls_settings_are_refused_at_construction() {
    let pki = pki();
    let g = |tls| {
        let cfg = OtlpGrpcConfig { endpoint: Some("https://localhost:4317".into()), tls, ..Default::default() };
        OtlpGrpcExporter::new(settings(Kind::Exporter, "otlp/out"), cfg).err().expect("accepted").to_string()
    };
    let h = |tls| {
        let cfg = OtlpHttpConfig { endpoint: Some("https://localhost:4318".into()), tls, ..Default::default() };
        OtlpHttpExporter::new(settings(Kind::Exporter, "otlp_http/out"), cfg).err().expect("accepted").to_string()
    };
    let missing = pki.dir.path().join("no-such-ca.pem");
    let no_key = ClientTlsConfig { cert_file: Some(pki.client.0.clone()), ..trust(&pki.ca) };
    for m in [g(trust(&missing)), h(trust(&missing))] {
        assert!(m.contains(&format!("tls.ca_file: cannot read {}", missing.display())), "{m}");
    }
    for m in [g(no_key.clone()), h(no_key)] {
        assert!(m.contains("tls.cert_file and tls.key_file must be given together"), "{m}");
    }
    // otlp_http cannot honour server_name_override, so it says so instead of ignoring it.
    let m = h(ClientTlsConfig { server_name_override: Some("localhost".into()), ..trust(&pki.ca) });
    assert!(m.contains("tls.server_name_override is not supported by otlp_http"), "{m}");
    // TLS settings on a plain-text endpoint would be ignored: refused instead.
    let cfg =
        OtlpGrpcConfig { endpoint: Some("http://localhost:4317".into()), tls: trust(&pki.ca), ..Default::default() };
    let m = OtlpGrpcExporter::new(settings(Kind::Exporter, "otlp/out"), cfg).err().expect("accepted").to_string();
    assert!(m.contains("tls.ca_file is set but endpoint \"http://localhost:4317\" is plain text"), "{m}");
    let cfg =
        OtlpHttpConfig { endpoint: Some("http://localhost:4318".into()), tls: trust(&pki.ca), ..Default::default() };
    let m = OtlpHttpExporter::new(settings(Kind::Exporter, "otlp_http/out"), cfg).err().expect("accepted").to_string();
    assert!(m.contains("is plain text"), "{m}");
}
