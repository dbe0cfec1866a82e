//! Loopback addresses for tests, without the bind-then-release race.
//!
//! A test that runs a server hands the server a listener it already bound
//! ([`listener`]), or configures the component with port 0 and asks it (or
//! its log) for the address it bound. Only a port that must stay *closed*
//! (an unreachable backend) is chosen and released: [`closed_port`].

use std::net::{SocketAddr, TcpListener};

/// A listener bound to a fresh loopback port, to hand to the server under test.
pub fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let a = l.local_addr().expect("a bound listener has an address");
    (l, a)
}

/// The same as a tokio listener (call inside a runtime).
pub fn tokio_listener() -> (tokio::net::TcpListener, SocketAddr) {
    let (l, a) = listener();
    l.set_nonblocking(true).expect("nonblocking listener");
    (tokio::net::TcpListener::from_std(l).expect("inside a tokio runtime"), a)
}

/// A loopback port nothing listens on: for "the backend is down" cases.
/// Another process could take it in the meantime; a test using it must not
/// depend on it staying closed beyond the first connection attempts.
pub fn closed_port() -> u16 {
    listener().1.port()
}

/// The address after `key=` in a log line such as
/// `otlp receiver listening receiver=otlp grpc=Some(127.0.0.1:4317)`.
pub fn addr_in_log(line: &str, key: &str) -> Option<SocketAddr> {
    let at = line.find(&format!("{key}="))? + key.len() + 1;
    let rest = line[at..].trim_start_matches("Some(");
    let end =
        rest.find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '[' | ']'))).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_addresses_out_of_log_lines() {
        let l = "INFO otlp receiver listening receiver=otlp grpc=Some(127.0.0.1:4317) http=None";
        assert_eq!(addr_in_log(l, "grpc"), Some("127.0.0.1:4317".parse().unwrap()));
        assert_eq!(addr_in_log(l, "http"), None);
        assert_eq!(
            addr_in_log("metrics address=127.0.0.1:8888 ok", "address"),
            Some("127.0.0.1:8888".parse().unwrap())
        );
    }
}
