//! Loading the ebpf receiver's program must not have aya parse
//! /sys/kernel/btf/vmlinux (tens of ms and tens of MiB; our object has no
//! CO-RE relocations): with `unwind.mode: frame_pointers` the file is not
//! opened at all, and with the unwinder (`auto`) it is opened once, by
//! profcol_ebpf::btf, which reads the eight member offsets the unwinder
//! needs in a few ms.
//!
//! The check is an fanotify FAN_OPEN mark on the file, filtered to this
//! process's pid, with a positive control: the test first opens the file
//! itself and must see that event, so a watch that silently does not work
//! on sysfs cannot make the test pass. Needs root (fanotify needs
//! CAP_SYS_ADMIN, loading needs CAP_BPF + CAP_PERFMON).

mod ebpf_common;

use ebpf_common::*;
use profcol_receivers::ebpf::config::UnwindMode;
use profcol_receivers::ebpf::EbpfConfig;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

struct OpenWatch {
    fd: OwnedFd,
}

impl OpenWatch {
    fn new(path: &str) -> std::io::Result<Self> {
        // SAFETY: plain syscalls; the returned fd is owned below.
        let fd = unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK,
                (libc::O_RDONLY | libc::O_LARGEFILE) as u32,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is fresh and ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let c = CString::new(path).unwrap();
        // SAFETY: valid fd and NUL-terminated path.
        let r = unsafe {
            libc::fanotify_mark(fd.as_raw_fd(), libc::FAN_MARK_ADD, libc::FAN_OPEN, libc::AT_FDCWD, c.as_ptr())
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(OpenWatch { fd })
    }

    /// Pids of the processes that opened the file since the last call.
    fn openers(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: buf is valid for its length.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            let mut off = 0usize;
            let size = std::mem::size_of::<libc::fanotify_event_metadata>();
            while off + size <= n as usize {
                // SAFETY: the kernel wrote a full metadata record at off.
                let m: libc::fanotify_event_metadata = unsafe { std::ptr::read_unaligned(buf[off..].as_ptr().cast()) };
                if m.fd >= 0 {
                    // SAFETY: the event carries an fd we must close.
                    unsafe { libc::close(m.fd) };
                }
                pids.push(m.pid);
                if m.event_len == 0 {
                    break;
                }
                off += m.event_len as usize;
            }
        }
        pids
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_does_not_open_kernel_btf() {
    if !require_bpf("loading_does_not_open_kernel_btf") {
        return;
    }
    if !std::path::Path::new(VMLINUX).exists() {
        // Without kernel BTF there is nothing to open; the point is moot.
        eprintln!("{VMLINUX} does not exist on this kernel; nothing to check");
        return;
    }
    let me = std::process::id() as i32;
    let watch = OpenWatch::new(VMLINUX).expect("fanotify watch on vmlinux BTF (needs CAP_SYS_ADMIN)");

    // Positive control: our own open is reported.
    drop(std::fs::File::open(VMLINUX).unwrap());
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        watch.openers().contains(&me),
        "fanotify does not report opens of {VMLINUX}; the check below would be void"
    );

    // Load, attach on every CPU, sample a little, shut down: opens of the
    // file by this process, with frame pointers only and with the unwinder.
    let mut opens = Vec::new();
    for mode in [UnwindMode::FramePointers, UnwindMode::Auto] {
        let mut cfg = EbpfConfig { report_interval: Duration::from_millis(200), ..Default::default() };
        cfg.unwind.mode = mode;
        let running = start(cfg).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let _ = running.stop().await;
        std::thread::sleep(Duration::from_millis(50));
        opens.push(watch.openers().iter().filter(|&&p| p == me).count());
    }
    assert_eq!(opens, [0, 1], "opens of {VMLINUX} with frame_pointers, then auto (only profcol_ebpf::btf's)");
}
