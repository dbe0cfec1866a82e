//! kobject uevent listener: the kernel multicasts `add@/module/NAME` and
//! `remove@/module/NAME` (SUBSYSTEM=module) on NETLINK_KOBJECT_UEVENT when
//! modules come and go. Each one becomes a [`Trigger::ModuleUevent`]
//! stamped when it arrived; the reload task debounces them.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use super::error::{Error, Result};
use super::generations::now_ns;
use super::reload::Trigger;

/// Kernel uevents go to multicast group 1 (udev re-broadcasts on group 2).
const KERNEL_GROUP: u32 = 1;

/// Whether a uevent message is about a kernel module.
pub(crate) fn is_module_event(msg: &[u8]) -> bool {
    let mut fields = msg.split(|&b| b == 0);
    // The kernel's header is "ACTION@DEVPATH"; udev's starts "libudev".
    match fields.next() {
        Some(h) if h.contains(&b'@') => {}
        _ => return false,
    }
    fields.any(|f| f == b"SUBSYSTEM=module")
}

fn open_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::NETLINK_KOBJECT_UEVENT,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: zeroed sockaddr_nl is valid; we fill family and groups.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    addr.nl_groups = KERNEL_GROUP;
    // SAFETY: addr is a valid sockaddr_nl of the given size.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // A bigger buffer rides out bursts; failure only means more ENOBUFS.
    let size: libc::c_int = 1 << 20;
    // SAFETY: setsockopt with a valid int.
    unsafe {
        libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, (&size as *const libc::c_int).cast(), 4)
    };
    Ok(fd)
}

/// Starts listening; module uevents are sent to `tx` until it closes.
pub fn spawn(tx: UnboundedSender<Trigger>) -> Result<JoinHandle<()>> {
    let fd = open_socket().map_err(|source| Error::Netlink { source })?;
    // SAFETY: the OwnedFd is moved in and stays open as long as the AsyncFd.
    let afd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
        .map_err(|e| Error::Netlink { source: io::Error::other(e.to_string()) })?;
    Ok(tokio::spawn(run(afd, tx)))
}

async fn run(afd: AsyncFd<OwnedFd>, tx: UnboundedSender<Trigger>) {
    let mut buf = vec![0u8; 8192];
    loop {
        let Ok(mut guard) = afd.readable().await else {
            return;
        };
        loop {
            // SAFETY: zeroed sockaddr_nl is a valid out-parameter.
            let mut from: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
            let mut from_len = std::mem::size_of::<libc::sockaddr_nl>() as u32;
            // SAFETY: buf and from are valid for the lengths given.
            let n = unsafe {
                libc::recvfrom(
                    afd.get_ref().as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    (&mut from as *mut libc::sockaddr_nl).cast(),
                    &mut from_len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => {
                        guard.clear_ready();
                        break;
                    }
                    // Overflow: events were dropped, so assume one was ours.
                    Some(libc::ENOBUFS) => {
                        if tx.send(Trigger::ModuleUevent { at_ns: now_ns() }).is_err() {
                            return;
                        }
                        continue;
                    }
                    Some(libc::EINTR) => continue,
                    _ => {
                        tracing::warn!(error = %e, "uevent socket failed; module changes now only seen by periodic reloads");
                        return;
                    }
                }
            }
            // Only the kernel (port id 0) speaks for modules.
            if from.nl_pid != 0 || !is_module_event(&buf[..n as usize]) {
                continue;
            }
            if tx.send(Trigger::ModuleUevent { at_ns: now_ns() }).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_module_events() {
        assert!(is_module_event(
            b"add@/module/xxhash\0ACTION=add\0DEVPATH=/module/xxhash\0SUBSYSTEM=module\0SEQNUM=1\0"
        ));
        assert!(!is_module_event(b"add@/devices/x\0ACTION=add\0SUBSYSTEM=block\0"));
        assert!(!is_module_event(b"libudev\0\xfe\xed\xca\xfeSUBSYSTEM=module\0"));
        assert!(!is_module_event(b""));
    }
}
