//! The listening sockets of this process's servers (the otlp receiver,
//! health_check), shared by owner and address. An instance that starts where
//! a running one of the same owner listens (a reload that changes the
//! component but keeps an endpoint) takes the same socket instead of binding
//! again, so nothing stops first: the port never closes, whether the reload
//! goes through or fails. Envoy and nginx hand listening sockets over across
//! a reload the same way. Another owner on that address finds nothing and
//! fails to bind, as before.

use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use tokio::net::{TcpListener, TcpStream};

/// Every live shared listener, with its owner (a component type); a socket
/// closes when the last instance serving it is gone.
static LISTENERS: Mutex<Vec<(&'static str, Weak<TcpListener>)>> = Mutex::new(Vec::new());

/// The live listener of `owner` on `addr`, if an instance serves one.
pub fn find(owner: &str, addr: SocketAddr) -> Option<Arc<TcpListener>> {
    let mut all = LISTENERS.lock().unwrap_or_else(|p| p.into_inner());
    all.retain(|(_, w)| w.strong_count() > 0);
    all.iter()
        .filter(|(o, _)| *o == owner)
        .filter_map(|(_, w)| w.upgrade())
        .find(|l| l.local_addr().is_ok_and(|a| a == addr))
}

/// Makes `l` findable by the instances of `owner` that start after.
pub fn register(owner: &'static str, l: &Arc<TcpListener>) {
    let mut all = LISTENERS.lock().unwrap_or_else(|p| p.into_inner());
    all.retain(|(_, w)| w.strong_count() > 0);
    all.push((owner, Arc::downgrade(l)));
}

/// Whether `endpoint` (host:port, not port 0) names the address of a live
/// listener of `owner` (any address it resolves to), without waiting on
/// DNS for an IP literal.
pub fn shared(owner: &str, endpoint: &str) -> bool {
    if endpoint.ends_with(":0") {
        return false;
    }
    let Ok(addrs) = endpoint.to_socket_addrs() else { return false };
    addrs.into_iter().any(|a| find(owner, a).is_some())
}

type Accepting = Pin<Box<dyn Future<Output = std::io::Result<(TcpStream, SocketAddr)>> + Send>>;

/// One server's accept loop on a shared listener. `accept` (unlike
/// `poll_accept`) lets several servers wait on the socket at once.
pub struct Incoming {
    l: Arc<TcpListener>,
    next: Accepting,
}

impl Incoming {
    pub fn new(l: Arc<TcpListener>) -> Self {
        let next = Self::accept(&l);
        Incoming { l, next }
    }

    fn accept(l: &Arc<TcpListener>) -> Accepting {
        let l = Arc::clone(l);
        Box::pin(async move { l.accept().await })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.l.local_addr()
    }

    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<(TcpStream, SocketAddr)>> {
        let r = std::task::ready!(self.next.as_mut().poll(cx));
        self.next = Self::accept(&self.l);
        Poll::Ready(r)
    }
}

impl tokio_stream::Stream for Incoming {
    type Item = std::io::Result<TcpStream>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_accept(cx).map(|r| Some(r.map(|(s, _)| s)))
    }
}

impl axum::serve::Listener for Incoming {
    type Io = TcpStream;
    type Addr = SocketAddr;
    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            match std::future::poll_fn(|cx| self.poll_accept(cx)).await {
                Ok(x) => return x,
                // Out of file descriptors and the like: wait rather than spin.
                Err(e) => {
                    tracing::debug!("accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }
    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Incoming::local_addr(self)
    }
}
