//! Capture this process's log, for in-process hosts whose components were
//! configured with port 0 and log the address they bound.

use std::sync::{Arc, Mutex};

/// What the process logged since [`capture`].
#[derive(Clone)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }

    /// `key=ADDR` in the first line that contains every one of `needles`.
    pub fn addr(&self, needles: &[&str], key: &str) -> Option<std::net::SocketAddr> {
        let text = self.text();
        let line = text.lines().find(|l| needles.iter().all(|n| l.contains(n)))?;
        crate::net::addr_in_log(line, key)
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs a global subscriber (info and up) that keeps every line. Call
/// once per process: a test binary with one test, or a bench's main.
pub fn capture() -> Captured {
    let c = Captured(Arc::default());
    let w = c.clone();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || w.clone())
        .init();
    c
}
