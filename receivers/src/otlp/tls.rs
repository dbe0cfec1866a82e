//! Server-side TLS with rustls (ring provider, picked explicitly).

use super::TlsServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;

fn certs(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let v = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{} holds a malformed PEM certificate: {e}", path.display()))?;
    if v.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(v)
}

/// rustls server config of a `tls:` section (HTTP/1.1 and h2 offered by ALPN).
pub(crate) fn load_server_config(t: &TlsServerConfig) -> Result<Arc<rustls::ServerConfig>, String> {
    let chain = certs(&t.cert_file).map_err(|e| format!("cert_file: {e}"))?;
    let key = PrivateKeyDer::from_pem_file(&t.key_file)
        .map_err(|e| format!("key_file: cannot read a PEM private key from {}: {e}", t.key_file.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &t.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certs(ca).map_err(|e| format!("client_ca_file: {e}"))? {
                roots.add(c).map_err(|e| format!("client_ca_file: {e}"))?;
            }
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("client_ca_file: {e}"))?;
            builder.with_client_cert_verifier(v)
        }
    };
    let mut cfg = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("cert_file/key_file do not make a usable certificate: {e}"))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// PEM bytes of the files, for tonic's own TLS setup.
pub(crate) fn read(path: &std::path::Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{what}: cannot read {}: {e}", path.display()))
}
