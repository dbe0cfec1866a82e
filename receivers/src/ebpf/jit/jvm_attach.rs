//! Asking a running HotSpot JVM to write its perf map (`/tmp/perf-<pid>.map`
//! in its own mount namespace), as `jcmd <pid> Compiler.perfmap` does, over
//! HotSpot's dynamic attach protocol (Linux, JDK 9+), without running jcmd.
//!
//! The protocol: the JVM listens on the Unix socket `/tmp/.java_pid<pid>`
//! (its namespace's pid and /tmp). When the socket is missing, the attacher
//! creates the trigger file `.attach_pid<pid>` in the JVM's cwd (or /tmp)
//! and sends SIGQUIT; the JVM's handler sees the file, owned by the JVM's
//! user or root, and starts its attach listener. A request is NUL-terminated
//! strings (protocol version "1", the command, three arguments); the answer
//! is a decimal result code line, then the command's output. The JVM accepts
//! a peer only when the peer's effective uid and gid are its own (JDK 17
//! also accepts root, but only root of the JVM's user namespace).
//!
//! SIGQUIT terminates a process that does not handle it, so it is sent only
//! to a process that maps libjvm.so, handles SIGQUIT (SigCgt) and was not
//! started with signal handling or attach disabled. (With -Xrs HotSpot
//! starts its listener at startup instead, so while its socket exists such
//! a JVM is asked all the same, without a signal.)

use std::ffi::CString;
use std::fmt;
use std::io::{self, BufRead, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `jcmd <pid> Compiler.perfmap`: version, command, three arguments.
const REQUEST: &[u8] = b"1\0jcmd\0Compiler.perfmap\0\0\0";
/// The answer is a result code and a short text; the rest is not read.
const ANSWER_MAX: usize = 64 * 1024;
/// The JVM's text as kept in [`Refused::Rejected`].
const REJECTED_TEXT_MAX: usize = 1024;
const STATUS_MAX: u64 = 64 * 1024;
const CMDLINE_MAX: u64 = 1 << 20;
const MAPS_LINE_MAX: u64 = 8192;
const SIGQUIT_BIT: u64 = 1 << (libc::SIGQUIT - 1);
/// Options that make SIGQUIT fatal (-Xrs and its long form) or leave the
/// JVM without an attach listener (SIGQUIT would only print a thread dump).
const REFUSING_OPTIONS: &[&[u8]] = &[b"-Xrs", b"-XX:+ReduceSignalUsage", b"-XX:+DisableAttachMechanism"];
/// Variables the JVM (or the java launcher) reads options from.
const OPTION_VARIABLES: &[&[u8]] = &[b"JAVA_TOOL_OPTIONS=", b"JDK_JAVA_OPTIONS=", b"_JAVA_OPTIONS="];
/// The longest wait between looks for the socket after SIGQUIT.
const POLL_MAX: Duration = Duration::from_millis(200);

/// Why a JVM was not asked, or did not do it.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The process does not map HotSpot's libjvm.so (or is OpenJ9).
    NotHotspot,
    /// Started with -Xrs, -XX:+ReduceSignalUsage or -XX:+DisableAttachMechanism.
    AttachDisabled,
    /// The process does not catch SIGQUIT, so SIGQUIT could kill it.
    SignalNotHandled,
    /// No socket, or no complete answer, before the deadline.
    Timeout,
    /// Reading /proc, the trigger file, the socket.
    Io(io::Error),
    /// The JVM answered a non-zero result code, with its text.
    Rejected(String),
}

impl Refused {
    /// The metric label value.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Refused::NotHotspot => "not_hotspot",
            Refused::AttachDisabled => "attach_disabled",
            Refused::SignalNotHandled => "signal_not_handled",
            Refused::Timeout => "timeout",
            Refused::Io(_) => "io",
            Refused::Rejected(_) => "rejected",
        }
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::NotHotspot => f.write_str("not a HotSpot JVM (no libjvm.so mapped, or OpenJ9)"),
            Refused::AttachDisabled => f.write_str(
                "JVM started with -Xrs, -XX:+ReduceSignalUsage or -XX:+DisableAttachMechanism; not signalled",
            ),
            Refused::SignalNotHandled => f.write_str("the process does not catch SIGQUIT; not signalled"),
            Refused::Timeout => f.write_str("the JVM did not answer in time"),
            Refused::Io(e) => write!(f, "{e}"),
            Refused::Rejected(text) => write!(f, "the JVM refused Compiler.perfmap: {text}"),
        }
    }
}

impl std::error::Error for Refused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Refused::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Refused {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Refused::Timeout,
            _ => Refused::Io(e),
        }
    }
}

/// Asks the JVM `pid` (as this process sees it) to write its perf map,
/// `/tmp/perf-<nspid>.map` in its mount namespace (seen from here through
/// `/proc/<pid>/root`), waiting at most `timeout` in all.
pub(crate) fn request_perf_map(pid: u32, timeout: Duration) -> Result<(), Refused> {
    let deadline = Instant::now() + timeout;
    // kill(0) and kill(-n) signal process groups: only a real pid goes on.
    if pid == 0 || pid > i32::MAX as u32 {
        return Err(Refused::Io(io::Error::new(io::ErrorKind::InvalidInput, format!("not a pid: {pid}"))));
    }
    // Opened before /proc is read: if the process is gone by the time it is
    // signalled, the pidfd says so instead of signalling a reused pid.
    let pidfd = pidfd_open(pid).map_err(|e| context(e, &format!("process {pid}")))?;
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let target = Target::read(&proc, pid)?;
    if !maps_hotspot(&proc)? {
        return Err(Refused::NotHotspot);
    }
    let socket_path = proc.join(format!("root/tmp/.java_pid{}", target.nspid));
    let start = |stale| start_listener(pid, pidfd.as_ref(), &proc, &target, &socket_path, stale, deadline);
    let (socket, started) = match open_socket(&socket_path, &target)? {
        Some(socket) => (socket, false),
        None => (start(None)?, true),
    };
    let answer = match exchange_as(&socket.fd, &target, deadline) {
        // A socket left by a JVM that died with this pid (a container's
        // pid 1 restarted over a kept /tmp): a starting listener replaces it.
        Err(Refused::Io(e)) if !started && e.kind() == io::ErrorKind::ConnectionRefused => {
            let fresh = start(Some(socket.ino))?;
            exchange_as(&fresh.fd, &target, deadline)?
        }
        answer => answer?,
    };
    parse_answer(&answer)
}

/// What /proc/<pid>/status says of the target.
#[derive(Debug, PartialEq)]
struct Target {
    /// Its pid in its own pid namespace (names the socket and trigger file).
    nspid: u32,
    euid: u32,
    egid: u32,
    /// SigCgt: the signals it catches.
    caught: u64,
}

impl Target {
    fn read(proc: &Path, pid: u32) -> Result<Target, Refused> {
        let path = proc.join("status");
        let text = read_bounded(&path, STATUS_MAX).map_err(|e| context(e, &path.display().to_string()))?;
        Target::parse(&String::from_utf8_lossy(&text), pid).map_err(|what| {
            Refused::Io(io::Error::new(io::ErrorKind::InvalidData, format!("{}: {what}", path.display())))
        })
    }

    /// `pid` stands for NSpid on kernels without it (before 4.1).
    fn parse(status: &str, pid: u32) -> Result<Target, &'static str> {
        let (mut nspid, mut euid, mut egid, mut caught) = (None, None, None, None);
        for line in status.lines() {
            let Some((key, value)) = line.split_once(':') else { continue };
            let mut fields = value.split_ascii_whitespace();
            match key {
                "NSpid" => nspid = fields.next_back().and_then(|v| v.parse::<u32>().ok()),
                "Uid" => euid = fields.nth(1).and_then(|v| v.parse::<u32>().ok()),
                "Gid" => egid = fields.nth(1).and_then(|v| v.parse::<u32>().ok()),
                "SigCgt" => caught = fields.next().and_then(|v| u64::from_str_radix(v, 16).ok()),
                _ => {}
            }
        }
        Ok(Target {
            nspid: nspid.filter(|&p| p != 0).unwrap_or(pid),
            euid: euid.ok_or("no effective uid in Uid:")?,
            egid: egid.ok_or("no effective gid in Gid:")?,
            caught: caught.ok_or("no SigCgt:")?,
        })
    }
}

/// Whether the process maps HotSpot's libjvm.so. OpenJ9 maps a libjvm.so
/// too, but answers SIGQUIT with dump files and has another attach API.
fn maps_hotspot(proc: &Path) -> Result<bool, Refused> {
    let path = proc.join("maps");
    let file = std::fs::File::open(&path).map_err(|e| context(e, &path.display().to_string()))?;
    let mut reader = io::BufReader::new(file);
    let mut line = Vec::with_capacity(256);
    let (mut jvm, mut j9) = (false, false);
    loop {
        line.clear();
        let n = (&mut reader)
            .take(MAPS_LINE_MAX)
            .read_until(b'\n', &mut line)
            .map_err(|e| context(e, &path.display().to_string()))?;
        if n == 0 {
            break;
        }
        let Some(file) = line.split(|&b| b == b'/').next_back() else { continue };
        let file = file.trim_ascii_end();
        let file = file.strip_suffix(b" (deleted)").unwrap_or(file);
        jvm |= file == b"libjvm.so";
        j9 |= file.starts_with(b"libj9vm");
    }
    Ok(jvm && !j9)
}

/// Whether the command line or the option variables hold an option that
/// makes SIGQUIT unsafe or useless.
fn options_refuse(cmdline: &[u8], environ: &[u8]) -> bool {
    let args = cmdline.split(|&b| b == 0);
    let from_variables = environ
        .split(|&b| b == 0)
        .filter_map(|var| OPTION_VARIABLES.iter().find_map(|name| var.strip_prefix(*name)))
        .flat_map(|value| value.split(|b| b.is_ascii_whitespace()));
    args.chain(from_variables).any(|opt| REFUSING_OPTIONS.contains(&opt))
}

/// Opens the JVM's socket (O_PATH: connected through /proc/self/fd later,
/// by a thread that may have no access to /proc/<pid>/root). `None` when
/// it does not exist. A socket not owned by the JVM's user is an error:
/// the JVM chowns its socket, another owner is someone else's.
fn open_socket(path: &Path, target: &Target) -> Result<Option<Socket>, Refused> {
    let fd = match open_at(None, path.as_os_str().as_bytes(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(context(e, &path.display().to_string())),
    };
    // SAFETY: an all-zero stat is valid; fstat fills it from an open fd.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open; st is a valid stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(context(io::Error::last_os_error(), &path.display().to_string()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        let e = io::Error::new(io::ErrorKind::InvalidData, "not a socket");
        return Err(context(e, &path.display().to_string()));
    }
    if st.st_uid != target.euid {
        let e = io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("owned by uid {}, the JVM runs as uid {}", st.st_uid, target.euid),
        );
        return Err(context(e, &path.display().to_string()));
    }
    Ok(Some(Socket { fd, ino: st.st_ino }))
}

/// The JVM's socket file, opened O_PATH.
struct Socket {
    fd: OwnedFd,
    /// Tells a new socket from a stale one of the same name.
    ino: u64,
}

/// The safety checks, the trigger file, SIGQUIT, then waiting for the socket.
fn start_listener(
    pid: u32,
    pidfd: Option<&OwnedFd>,
    proc: &Path,
    target: &Target,
    socket_path: &Path,
    stale: Option<u64>,
    deadline: Instant,
) -> Result<Socket, Refused> {
    let cmdline_path = proc.join("cmdline");
    let cmdline =
        read_bounded(&cmdline_path, CMDLINE_MAX).map_err(|e| context(e, &cmdline_path.display().to_string()))?;
    let environ_path = proc.join("environ");
    let environ =
        read_bounded(&environ_path, CMDLINE_MAX).map_err(|e| context(e, &environ_path.display().to_string()))?;
    if options_refuse(&cmdline, &environ) {
        return Err(Refused::AttachDisabled);
    }
    if target.caught & SIGQUIT_BIT == 0 {
        return Err(Refused::SignalNotHandled);
    }
    let _trigger = TriggerFile::create(proc, target)?;
    send_sigquit(pid, pidfd)?;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(socket) = open_socket(socket_path, target)? {
            if Some(socket.ino) != stale {
                return Ok(socket);
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Refused::Timeout);
        }
        if !alive(pid, pidfd) {
            return Err(Refused::Io(io::Error::new(io::ErrorKind::NotFound, format!("process {pid} exited"))));
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(POLL_MAX);
    }
}

/// `.attach_pid<nspid>`, created by this call (never someone else's file)
/// and removed when dropped, through its directory's fd so that it goes
/// even when the process is gone.
struct TriggerFile {
    dir: OwnedFd,
    name: CString,
}

impl TriggerFile {
    /// In the JVM's cwd, else its /tmp (the two places HotSpot looks).
    /// `None`: a trigger file exists in both places already, not ours.
    fn create(proc: &Path, target: &Target) -> Result<Option<TriggerFile>, Refused> {
        let name = CString::new(format!(".attach_pid{}", target.nspid)).expect("no NUL in a formatted number");
        let mut last = None;
        for dir in ["cwd", "root/tmp"] {
            let dir_path = proc.join(dir);
            match TriggerFile::create_in(&dir_path, &name, target) {
                Ok(trigger) => return Ok(Some(trigger)),
                Err(e) => {
                    last = Some(context(e, &dir_path.join(name.to_string_lossy().as_ref()).display().to_string()))
                }
            }
        }
        match last {
            Some(Refused::Io(e)) if e.kind() == io::ErrorKind::AlreadyExists => Ok(None),
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    fn create_in(dir_path: &Path, name: &CString, target: &Target) -> io::Result<TriggerFile> {
        let dir =
            open_at(None, dir_path.as_os_str().as_bytes(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC, 0)?;
        // O_EXCL|O_NOFOLLOW: never through a link planted in the target's
        // directory, never a file this call did not create.
        let file = open_at(
            Some(&dir),
            name.as_bytes(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600,
        )?;
        let trigger = TriggerFile { dir, name: name.clone() };
        // The JVM ignores a trigger file owned by neither its user nor
        // root, and in a user namespace this process's root is neither.
        // SAFETY: file is an open fd.
        if unsafe { libc::fchown(file.as_raw_fd(), target.euid, target.egid) } != 0 {
            return Err(io::Error::last_os_error()); // trigger's drop removes it
        }
        Ok(trigger)
    }
}

impl Drop for TriggerFile {
    fn drop(&mut self) {
        // SAFETY: dir is an open directory fd, name a NUL-terminated name.
        unsafe { libc::unlinkat(self.dir.as_raw_fd(), self.name.as_ptr(), 0) };
    }
}

/// A pidfd for `pid`; `None` on kernels without pidfd_open (before 5.3).
fn pidfd_open(pid: u32) -> io::Result<Option<OwnedFd>> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0 as libc::c_uint) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOSYS) => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: the syscall returned a new fd that nothing else owns.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) }))
}

fn send_sigquit(pid: u32, pidfd: Option<&OwnedFd>) -> Result<(), Refused> {
    let rc = match pidfd {
        // SAFETY: pidfd is open; a null info means "as kill(2)".
        Some(fd) => unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                libc::SIGQUIT,
                std::ptr::null::<libc::siginfo_t>(),
                0 as libc::c_uint,
            )
        },
        // SAFETY: pid is positive (checked by the caller): one process.
        None => libc::c_long::from(unsafe { libc::kill(pid as libc::pid_t, libc::SIGQUIT) }),
    };
    if rc != 0 {
        return Err(context(io::Error::last_os_error(), &format!("SIGQUIT to process {pid}")));
    }
    Ok(())
}

fn alive(pid: u32, pidfd: Option<&OwnedFd>) -> bool {
    match pidfd {
        Some(fd) => {
            // A pidfd is readable once its process has exited.
            let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd, no wait.
            unsafe { libc::poll(&mut pfd, 1, 0) == 0 }
        }
        None => Path::new(&format!("/proc/{pid}")).exists(),
    }
}

/// Sends the request and reads the answer, as the JVM's effective user and
/// group when this process is someone else: on a thread of its own that
/// switches only its own credentials (raw syscalls; glibc's setresuid
/// would switch every thread of the process) and then ends.
fn exchange_as(socket: &OwnedFd, target: &Target, deadline: Instant) -> Result<Vec<u8>, Refused> {
    let path = format!("/proc/self/fd/{}", socket.as_raw_fd());
    // SAFETY: geteuid and getegid cannot fail.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if (euid, egid) == (target.euid, target.egid) {
        return exchange(&path, deadline);
    }
    let (uid, gid) = (target.euid, target.egid);
    let thread = std::thread::Builder::new()
        .name("jvm-attach".into())
        .spawn(move || {
            become_user(uid, gid).map_err(|e| context(e, &format!("switching this thread to uid {uid} gid {gid}")))?;
            exchange(&path, deadline)
        })
        .map_err(|e| context(e, "starting the attach thread"))?;
    thread.join().unwrap_or_else(|_| Err(Refused::Io(io::Error::other("the attach thread panicked"))))
}

/// This thread's groups, gid and uid (real, effective, saved) become the
/// target's, for good: the thread ends after the exchange.
fn become_user(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: raw syscalls taking plain integers (and no group list); they
    // change only the calling thread's credentials.
    unsafe {
        if libc::syscall(libc::SYS_setgroups, 0 as libc::size_t, std::ptr::null::<libc::gid_t>()) != 0
            || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
            || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Connects to `path`, writes the request, reads the answer (at most
/// [`ANSWER_MAX`] bytes), all before `deadline`.
fn exchange(path: &str, deadline: Instant) -> Result<Vec<u8>, Refused> {
    let remaining = || deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or(Refused::Timeout);
    // SAFETY: socket(2) with constant arguments returns a new fd or -1.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(context(io::Error::last_os_error(), "socket"));
    }
    // SAFETY: a new fd that nothing else owns.
    let mut stream = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
    // A Unix-socket connect waits (for a full backlog) up to the send timeout.
    stream.set_write_timeout(Some(remaining()?))?;
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if path.len() >= addr.sun_path.len() {
        return Err(Refused::Io(io::Error::new(io::ErrorKind::InvalidInput, format!("socket path too long: {path}"))));
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(path.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: addr is a filled sockaddr_un of the given size; fd is open.
    let rc = unsafe {
        libc::connect(
            stream.as_raw_fd(),
            std::ptr::addr_of!(addr).cast::<libc::sockaddr>(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINPROGRESS) => Err(Refused::Timeout),
            _ => Err(context(e, "connecting to the JVM's attach socket")),
        };
    }
    stream.set_write_timeout(Some(remaining()?))?;
    stream.write_all(REQUEST).map_err(|e| map_io(e, "sending the request"))?;
    let mut answer = vec![0u8; ANSWER_MAX];
    let mut len = 0;
    while len < answer.len() {
        stream.set_read_timeout(Some(remaining()?))?;
        match stream.read(&mut answer[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(map_io(e, "reading the answer")),
        }
    }
    answer.truncate(len);
    Ok(answer)
}

/// The answer: a result code line ("0" is success), then the command's text.
fn parse_answer(answer: &[u8]) -> Result<(), Refused> {
    if answer.is_empty() {
        // What HotSpot does to a peer whose uid/gid it does not accept.
        return Err(Refused::Io(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the JVM closed the connection without an answer (credentials not accepted?)",
        )));
    }
    let (code, text) = match answer.iter().position(|&b| b == b'\n') {
        Some(i) => (&answer[..i], &answer[i + 1..]),
        None => (answer, &[][..]),
    };
    let code = std::str::from_utf8(code).ok().and_then(|c| c.trim().parse::<i64>().ok());
    match code {
        Some(0) => Ok(()),
        Some(code) => {
            let text = String::from_utf8_lossy(text);
            let text = text.trim();
            let mut end = text.len().min(REJECTED_TEXT_MAX);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            Err(Refused::Rejected(if text.is_empty() {
                format!("result code {code}")
            } else {
                text[..end].to_string()
            }))
        }
        None => {
            let start = String::from_utf8_lossy(&answer[..answer.len().min(64)]).into_owned();
            Err(Refused::Io(io::Error::new(io::ErrorKind::InvalidData, format!("not an attach answer: {start:?}"))))
        }
    }
}

/// open(2)/openat(2) of a byte path.
fn open_at(dir: Option<&OwnedFd>, path: &[u8], flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    let path = CString::new(path).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a path"))?;
    let dirfd = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: path is NUL-terminated; dirfd is open or AT_FDCWD.
    let fd = unsafe { libc::openat(dirfd, path.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// At most `max` bytes of a file (/proc files report size 0).
fn read_bounded(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    std::fs::File::open(path)?.take(max).read_to_end(&mut out)?;
    Ok(out)
}

fn context(e: io::Error, what: &str) -> Refused {
    Refused::Io(io::Error::new(e.kind(), format!("{what}: {e}")))
}

fn map_io(e: io::Error, what: &str) -> Refused {
    match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Refused::Timeout,
        _ => context(e, what),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command, Stdio};

    const HOT: &str = r#"package com.example;
public class Hot {
    static long work(long x) {
        long s = 0;
        for (int i = 0; i < 1000; i++) { s += (x ^ i) * 31 + (s >>> 3); }
        return s;
    }
    public static void main(String[] args) {
        long end = System.nanoTime() + Long.parseLong(args[0]) * 1_000_000_000L;
        long s = 0;
        while (System.nanoTime() < end) { s += work(s); }
        System.out.println(s);
    }
}
"#;

    fn jdk() -> bool {
        profcol_testkit::tools::tool_available("javac", &["-version"])
            && profcol_testkit::tools::tool_available("java", &["-version"])
    }

    /// `com.example.Hot` compiled into a fresh directory (readable by all:
    /// one test runs the JVM as another user).
    fn compile() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let src = dir.path().join("Hot.java");
        std::fs::write(&src, HOT).unwrap();
        let out = Command::new("javac").arg("-d").arg(dir.path()).arg(&src).output().unwrap();
        assert!(out.status.success(), "javac: {}", String::from_utf8_lossy(&out.stderr));
        dir
    }

    /// A child killed (and its perf map removed) when the test ends, however it ends.
    struct Guard(Child);

    impl Guard {
        fn start(cmd: &mut Command) -> Guard {
            Guard(cmd.stdin(Stdio::null()).stdout(Stdio::null()).spawn().unwrap())
        }
        fn pid(&self) -> u32 {
            self.0.id()
        }
        fn alive(&mut self) -> bool {
            self.0.try_wait().unwrap().is_none()
        }
        fn perf_map(&self) -> PathBuf {
            PathBuf::from(format!("/tmp/perf-{}.map", self.pid()))
        }
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
            let _ = std::fs::remove_file(self.perf_map());
            // Left behind by a JVM killed with SIGKILL.
            let _ = std::fs::remove_file(format!("/tmp/.java_pid{}", self.pid()));
        }
    }

    fn hot_jvm(dir: &Path, options: &[&str]) -> Guard {
        Guard::start(
            Command::new("java").args(options).arg("-cp").arg(dir).arg("com.example.Hot").arg("60").current_dir(dir),
        )
    }

    /// Asks until the map holds the hot method (compiled within a second
    /// or two, later on a loaded machine): the first call starts the
    /// listener, the others find its socket.
    fn ask_until_hot(jvm: &mut Guard) -> String {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            request_perf_map(jvm.pid(), Duration::from_secs(10)).unwrap();
            let map = std::fs::read_to_string(jvm.perf_map()).unwrap();
            if map.contains("com.example.Hot.work") || Instant::now() > until {
                return map;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    #[test]
    fn perf_map_written_and_jvm_alive() {
        if !jdk() {
            return;
        }
        let dir = compile();
        let mut jvm = hot_jvm(dir.path(), &[]);
        std::thread::sleep(Duration::from_millis(1500));
        let socket = PathBuf::from(format!("/tmp/.java_pid{}", jvm.pid()));
        assert!(!socket.exists(), "the listener must not be running before it is asked");
        let map = ask_until_hot(&mut jvm);
        assert!(map.contains("com.example.Hot.work"), "no hot method in the perf map:\n{map}");
        assert!(socket.exists(), "the JVM's attach listener started");
        assert!(!dir.path().join(format!(".attach_pid{}", jvm.pid())).exists(), "trigger file left behind");
        assert!(!Path::new(&format!("/tmp/.attach_pid{}", jvm.pid())).exists(), "trigger file left behind");
        std::thread::sleep(Duration::from_millis(300));
        assert!(jvm.alive(), "the JVM died");
    }

    #[test]
    fn jvm_of_another_user() {
        if !jdk()
            || !profcol_testkit::tools::require_root("jvm_of_another_user", "to run a JVM as another user")
            || !profcol_testkit::tools::tool_available("setpriv", &["--version"])
        {
            return;
        }
        let dir = compile();
        let mut jvm = Guard::start(
            Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups", "java", "-cp"])
                .arg(dir.path())
                .args(["com.example.Hot", "60"])
                .current_dir(dir.path()),
        );
        std::thread::sleep(Duration::from_millis(1500));
        let map = ask_until_hot(&mut jvm);
        assert!(map.contains("com.example.Hot.work"), "no hot method in the perf map:\n{map}");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(jvm.perf_map()).unwrap().uid(), 65534, "written by the JVM itself");
        assert!(!dir.path().join(format!(".attach_pid{}", jvm.pid())).exists(), "trigger file left behind");
        assert!(jvm.alive(), "the JVM died");
        // This thread's credentials are still root's: only the attach thread switched.
        // SAFETY: geteuid and getegid cannot fail.
        assert_eq!(unsafe { (libc::geteuid(), libc::getegid()) }, (0, 0));
    }

    /// With -Xrs HotSpot cannot be triggered by SIGQUIT, so it starts its
    /// listener at startup: asked without a signal. Without the socket
    /// (removed by a /tmp cleaner, say) it is refused, not signalled.
    #[test]
    fn reduced_signals_not_signalled_and_jvm_alive() {
        if !jdk() {
            return;
        }
        let dir = compile();
        let mut jvm = hot_jvm(dir.path(), &["-Xrs"]);
        std::thread::sleep(Duration::from_millis(1500));
        let map = ask_until_hot(&mut jvm);
        assert!(map.contains("com.example.Hot.work"), "no hot method in the perf map:\n{map}");
        std::fs::remove_file(format!("/tmp/.java_pid{}", jvm.pid())).unwrap();
        std::fs::remove_file(jvm.perf_map()).unwrap();
        match request_perf_map(jvm.pid(), Duration::from_secs(5)) {
            Err(Refused::AttachDisabled) => {}
            other => panic!("expected AttachDisabled, got {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(300));
        assert!(jvm.alive(), "the -Xrs JVM died");
        assert!(!jvm.perf_map().exists());
        assert!(!dir.path().join(format!(".attach_pid{}", jvm.pid())).exists(), "trigger file created");
    }

    #[test]
    fn attach_disabled_refused_and_jvm_alive() {
        if !jdk() {
            return;
        }
        let dir = compile();
        let mut jvm = hot_jvm(dir.path(), &["-XX:+DisableAttachMechanism"]);
        std::thread::sleep(Duration::from_millis(1500));
        let e = request_perf_map(jvm.pid(), Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, Refused::AttachDisabled), "{e:?}");
        assert_eq!(e.reason(), "attach_disabled");
        std::thread::sleep(Duration::from_millis(300));
        assert!(jvm.alive(), "the JVM died");
    }

    /// -Xrs from an options file: not on the command line, but SigCgt
    /// shows SIGQUIT is not caught.
    #[test]
    fn uncaught_sigquit_not_signalled() {
        if !jdk() {
            return;
        }
        let dir = compile();
        let options = dir.path().join("options");
        std::fs::write(&options, "-Xrs\n").unwrap();
        let mut jvm = hot_jvm(dir.path(), &[&format!("-XX:VMOptionsFile={}", options.display())]);
        std::thread::sleep(Duration::from_millis(1500));
        // Its listener started at startup (as with -Xrs); without it the
        // only way in would be SIGQUIT, which would kill it.
        std::fs::remove_file(format!("/tmp/.java_pid{}", jvm.pid())).unwrap();
        let e = request_perf_map(jvm.pid(), Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, Refused::SignalNotHandled), "{e:?}");
        std::thread::sleep(Duration::from_millis(300));
        assert!(jvm.alive(), "the JVM died");
    }

    /// A socket file nobody listens on (a dead JVM's, same pid): the JVM
    /// is triggered and its listener replaces it.
    #[test]
    fn stale_socket_replaced() {
        if !jdk() {
            return;
        }
        let dir = compile();
        let mut jvm = hot_jvm(dir.path(), &[]);
        std::thread::sleep(Duration::from_millis(1500));
        drop(std::os::unix::net::UnixListener::bind(format!("/tmp/.java_pid{}", jvm.pid())).unwrap());
        let map = ask_until_hot(&mut jvm);
        assert!(map.contains("com.example.Hot.work"), "no hot method in the perf map:\n{map}");
        assert!(jvm.alive(), "the JVM died");
    }

    #[test]
    fn not_java_refused_and_not_signalled() {
        let mut sleep = Guard::start(Command::new("sleep").arg("30"));
        std::thread::sleep(Duration::from_millis(100));
        let e = request_perf_map(sleep.pid(), Duration::from_secs(2)).unwrap_err();
        assert!(matches!(e, Refused::NotHotspot), "{e:?}");
        assert_eq!(e.reason(), "not_hotspot");
        std::thread::sleep(Duration::from_millis(200));
        assert!(sleep.alive(), "sleep was signalled");
    }

    #[test]
    fn no_such_process() {
        let e = request_perf_map(0, Duration::from_secs(1)).unwrap_err();
        assert_eq!(e.reason(), "io", "{e}");
        let e = request_perf_map(u32::MAX, Duration::from_secs(1)).unwrap_err();
        assert_eq!(e.reason(), "io", "{e}");
        // A pid that no process has (pid_max is at most 2^22).
        let e = request_perf_map(1 << 23, Duration::from_secs(1)).unwrap_err();
        assert_eq!(e.reason(), "io", "{e}");
    }

    #[test]
    fn status_fields() {
        let status = "Name:\tjava\nUid:\t0\t1000\t1000\t1000\nGid:\t5\t2000\t2000\t2000\n\
                      NSpid:\t4242\t7\nSigCgt:\t0000000101005ccd\n";
        let t = Target::parse(status, 4242).unwrap();
        assert_eq!(t, Target { nspid: 7, euid: 1000, egid: 2000, caught: 0x101005ccd });
        assert_ne!(t.caught & SIGQUIT_BIT, 0);
        // No NSpid (old kernels): the pid itself.
        let t = Target::parse("Uid:\t1 2 3 4\nGid:\t1 2 3 4\nSigCgt:\t0\n", 99).unwrap();
        assert_eq!((t.nspid, t.euid, t.egid, t.caught & SIGQUIT_BIT), (99, 2, 2, 0));
        assert!(Target::parse("Uid:\t1\nGid:\t1 2\nSigCgt:\t0\n", 1).is_err());
        assert!(Target::parse("Uid:\t1 2\nGid:\t1 2\nSigCgt:\tzz\n", 1).is_err());
        assert!(Target::parse("", 1).is_err());
    }

    #[test]
    fn refusing_options() {
        assert!(!options_refuse(b"java\0-cp\0x\0Main\0", b"PATH=/bin\0"));
        assert!(options_refuse(b"java\0-Xrs\0Main\0", b""));
        assert!(options_refuse(b"java\0-XX:+DisableAttachMechanism\0Main\0", b""));
        assert!(options_refuse(b"java\0Main\0", b"A=1\0JAVA_TOOL_OPTIONS=-Xmx1g  -XX:+ReduceSignalUsage\0"));
        assert!(!options_refuse(b"java\0-XX:-DisableAttachMechanism\0-Xrsx\0", b"OTHER_OPTIONS=-Xrs\0"));
    }

    #[test]
    fn answers() {
        assert!(parse_answer(b"0\n").is_ok());
        assert!(parse_answer(b"0\nsome text\n").is_ok());
        match parse_answer(b"-1\njava.lang.IllegalArgumentException: Unknown diagnostic command\n") {
            Err(Refused::Rejected(text)) => {
                assert_eq!(text, "java.lang.IllegalArgumentException: Unknown diagnostic command")
            }
            other => panic!("{other:?}"),
        }
        match parse_answer(b"101") {
            Err(Refused::Rejected(text)) => assert_eq!(text, "result code 101"),
            other => panic!("{other:?}"),
        }
        assert_eq!(parse_answer(b"").unwrap_err().reason(), "io");
        assert_eq!(parse_answer(b"HTTP/1.1 200 OK\r\n").unwrap_err().reason(), "io");
        let long = [b"1\n".as_slice(), "é".repeat(2000).as_bytes()].concat();
        match parse_answer(&long) {
            Err(Refused::Rejected(text)) => assert!(text.len() <= REJECTED_TEXT_MAX && !text.is_empty()),
            other => panic!("{other:?}"),
        }
    }
}
