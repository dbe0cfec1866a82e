//! Checks shared by components' [`super::Validate`] impls. Each is free of
//! side effects (it creates, binds and writes nothing) and returns a message
//! that says what is wrong and what to do.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

/// `d` must be above zero.
pub fn positive(d: Duration, why: &str) -> Result<(), String> {
    if d.is_zero() {
        return Err(format!("must be greater than 0 ({why})"));
    }
    Ok(())
}

/// A `host:port` listen or dial address: a host (name, IPv4, or `[IPv6]`)
/// and a port within 1-65535 (0 is allowed only when `allow_zero`, for
/// listeners that take any free port).
pub fn host_port(endpoint: &str, allow_zero: bool) -> Result<(), String> {
    let hint = "write host:port, e.g. localhost:4317, 0.0.0.0:4317 or [::1]:4317";
    let Some((host, port)) = endpoint.rsplit_once(':') else {
        return Err(format!("{endpoint:?} has no port; {hint}"));
    };
    if endpoint.contains("://") {
        return Err(format!("{endpoint:?} is a URL; {hint}"));
    }
    let host_ok = if let Some(inner) = host.strip_prefix('[') {
        inner.strip_suffix(']').is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
    } else {
        host.is_empty() || !host.contains(':') && host.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
    };
    if !host_ok {
        return Err(format!("{endpoint:?}: invalid host {host:?}; {hint}"));
    }
    match port.parse::<u32>() {
        Ok(0) if allow_zero => Ok(()),
        Ok(1..=65535) => Ok(()),
        _ => Err(format!("{endpoint:?}: port {port:?} is not within 1-65535; {hint}")),
    }
}

/// An absolute `http://` or `https://` URL with a host and, if given, a
/// port within 1-65535. Credentials in it are never echoed back.
pub fn http_url(url: &str) -> Result<(), String> {
    let shown = super::secret::redact_url(url);
    let hint = "write e.g. https://host:4318 or http://localhost:4040";
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!("{shown:?} is not a URL (no scheme); {hint}"));
    };
    if scheme != "http" && scheme != "https" {
        return Err(format!("{shown:?}: scheme {scheme:?} is not http or https; {hint}"));
    }
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if hostport.is_empty() {
        return Err(format!("{shown:?} has no host; {hint}"));
    }
    let port = match hostport.strip_prefix('[') {
        Some(v6) => {
            let Some((ip, tail)) = v6.split_once(']') else {
                return Err(format!("{shown:?}: unclosed '[' in the host; {hint}"));
            };
            if ip.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(format!("{shown:?}: {ip:?} is not an IPv6 address; {hint}"));
            }
            tail.strip_prefix(':')
        }
        None => hostport.split_once(':').map(|(_, p)| p),
    };
    if let Some(p) = port {
        if !matches!(p.parse::<u32>(), Ok(1..=65535)) {
            return Err(format!("{shown:?}: port {p:?} is not within 1-65535; {hint}"));
        }
    }
    Ok(())
}

fn access(path: &Path, mode: libc::c_int) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: c is a valid NUL-terminated string for the duration of the call.
    unsafe { libc::access(c.as_ptr(), mode) == 0 }
}

/// The kernel's own filesystems, which hold no directories or files a
/// process can create there: root passes access(2) on them, yet mkdir and
/// open(O_CREAT) fail (or make something that is not a directory of files).
fn pseudo_fs(dir: &Path) -> Option<&'static str> {
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statfs is plain data; zero is a valid value of it.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated and s is a valid statfs to fill.
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 {
        return None;
    }
    // f_type's width and sign differ by platform; the magics are 32-bit.
    Some(match (s.f_type as u64) & 0xffff_ffff {
        0x9fa0 => "procfs",
        0x6265_6572 => "sysfs",
        0x6462_6720 => "debugfs",
        0x7472_6163 => "tracefs",
        0x7363_6673 => "securityfs",
        0x0027_e0eb => "cgroup",
        0x6367_7270 => "cgroup2",
        0xcafe_4a11 => "bpf",
        0x6265_6570 => "configfs",
        0x6165_676c => "pstore",
        0xde5e_81e4 => "efivarfs",
        0x1cd1 => "devpts",
        0x4249_4e4d => "binfmt_misc",
        0xf97c_ff8c => "selinuxfs",
        0x1980_0202 => "mqueue",
        _ => return None,
    })
}

fn on_pseudo_fs(what: &str, path: &Path, dir: &Path) -> Result<(), String> {
    match pseudo_fs(dir) {
        Some(fs) => Err(format!(
            "cannot create {what} {}: {} is on {fs}, a kernel filesystem where no {what} can be created; \
             choose a path on a disk or tmpfs",
            path.display(),
            dir.display()
        )),
        None => Ok(()),
    }
}

/// A file that must exist and be readable.
pub fn readable_file(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Err(e) => Err(format!("cannot read {}: {e}; give the path of an existing file", path.display())),
        Ok(m) if m.is_dir() => Err(format!("{} is a directory; give the path of a file", path.display())),
        Ok(_) if !access(path, libc::R_OK) => {
            Err(format!("{} is not readable by this process; fix its permissions", path.display()))
        }
        Ok(_) => Ok(()),
    }
}

/// The nearest existing ancestor of a path that does not exist yet.
fn existing_ancestor(path: &Path) -> Option<&Path> {
    let mut p = path.parent();
    while let Some(a) = p {
        let a = if a.as_os_str().is_empty() { Path::new(".") } else { a };
        if a.exists() {
            return Some(a);
        }
        p = a.parent();
    }
    None
}

/// A directory this process can write to, or can create (its nearest
/// existing ancestor is a writable directory). Nothing is created: the
/// check walks up to the nearest existing ancestor, which must be a
/// writable directory on a filesystem that holds files.
pub fn writable_dir(path: &Path) -> Result<(), String> {
    if path.as_os_str().is_empty() {
        return Err("is empty; give a directory path".into());
    }
    match std::fs::metadata(path) {
        Ok(m) if !m.is_dir() => Err(format!("{} exists and is not a directory; give a directory path", path.display())),
        Ok(_) if !access(path, libc::W_OK | libc::X_OK) => Err(format!(
            "directory {} is not writable by this process; fix its permissions or choose another directory",
            path.display()
        )),
        Ok(_) => on_pseudo_fs("files", path, path),
        Err(_) => creatable(path, "directory"),
    }
}

/// A file this process can write (existing and writable, or creatable in a
/// writable directory).
pub fn writable_file(path: &Path) -> Result<(), String> {
    if path.as_os_str().is_empty() {
        return Err("is empty; give a file path".into());
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(format!("{} is a directory; give a file path", path.display())),
        Ok(_) if !access(path, libc::W_OK) => Err(format!(
            "{} is not writable by this process; fix its permissions or choose another path",
            path.display()
        )),
        Ok(_) => Ok(()),
        Err(_) => creatable(path, "file"),
    }
}

fn creatable(path: &Path, what: &str) -> Result<(), String> {
    match existing_ancestor(path) {
        Some(a) if !a.is_dir() => {
            Err(format!("cannot create {what} {}: {} is not a directory", path.display(), a.display()))
        }
        Some(a) if !access(a, libc::W_OK | libc::X_OK) => Err(format!(
            "cannot create {what} {}: directory {} is not writable by this process; fix its permissions or choose another path",
            path.display(),
            a.display()
        )),
        Some(a) => on_pseudo_fs(what, path, a),
        None => Err(format!("cannot create {what} {}: no parent directory exists", path.display())),
    }
}

/// A PEM file with at least one certificate.
pub fn pem_certificates(path: &Path) -> Result<(), String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    readable_file(path)?;
    let mut n = 0;
    for c in CertificateDer::pem_file_iter(path).map_err(|e| format!("cannot read {}: {e}", path.display()))? {
        c.map_err(|e| format!("{} is not a valid PEM certificate file: {e}", path.display()))?;
        n += 1;
    }
    if n == 0 {
        return Err(format!("{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)", path.display()));
    }
    Ok(())
}

/// A PEM file with a private key (PKCS#8, PKCS#1 or SEC1).
pub fn pem_private_key(path: &Path) -> Result<(), String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::PrivateKeyDer;
    readable_file(path)?;
    PrivateKeyDer::from_pem_file(path)
        .map(|_| ())
        .map_err(|e| format!("{} holds no usable PEM private key: {e}", path.display()))
}

/// A value within `lo..=hi` (inclusive), in `unit`.
pub fn within<T: PartialOrd + std::fmt::Display>(v: T, lo: T, hi: T, unit: &str) -> Result<(), String> {
    if v < lo || v > hi {
        return Err(format!("{v} {unit} is out of range; use {lo} to {hi} {unit}").replace("  ", " "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_urls() {
        assert!(host_port("localhost:4317", false).is_ok());
        assert!(host_port("[::1]:4317", false).is_ok());
        assert!(host_port(":4317", false).is_ok());
        assert!(host_port("127.0.0.1:0", true).is_ok());
        assert!(host_port("127.0.0.1:0", false).is_err());
        assert!(host_port("localhost:70000", false).unwrap_err().contains("1-65535"));
        assert!(host_port("localhost", false).unwrap_err().contains("no port"));
        assert!(host_port("http://x:1", false).is_err());
        assert!(http_url("https://u:p@h:443/x").is_ok());
        assert!(http_url("http://[::1]:8080").is_ok());
        let e = http_url("https://u:hunter2@h:99999/x").unwrap_err();
        assert!(e.contains("1-65535") && !e.contains("hunter2"), "{e}");
        assert!(http_url("ftp://h").is_err());
        assert!(http_url("h:1").is_err());
    }

    #[test]
    fn files_and_directories() {
        let d = tempfile::tempdir().unwrap();
        assert!(writable_dir(d.path()).is_ok());
        assert!(writable_dir(&d.path().join("a/b")).is_ok());
        assert!(writable_file(&d.path().join("f")).is_ok());
        std::fs::write(d.path().join("f"), "x").unwrap();
        assert!(writable_dir(&d.path().join("f")).is_err());
        assert!(writable_dir(&d.path().join("f/sub")).unwrap_err().contains("not a directory"));
        assert!(readable_file(&d.path().join("nope")).is_err());
        assert!(pem_certificates(&d.path().join("f")).unwrap_err().contains("no PEM"));
        assert!(pem_private_key(&d.path().join("f")).is_err());
        assert!(within(5, 1, 4, "MiB").unwrap_err().contains("use 1 to 4 MiB"));
    }

    #[test]
    fn kernel_filesystems_hold_no_new_files_even_for_root() {
        for (dir, fs) in [("/proc/x/pprof", "procfs"), ("/sys/kernel/x", "sysfs")] {
            let e = writable_dir(Path::new(dir)).unwrap_err();
            assert!(e.contains(fs) && e.contains(dir), "{e}");
        }
        let e = writable_file(Path::new("/proc/x/out.jsonl")).unwrap_err();
        assert!(e.contains("procfs"), "{e}");
        assert!(writable_dir(Path::new("/proc")).unwrap_err().contains("procfs"));
        assert!(writable_dir(&std::env::temp_dir().join("profcol-check/a")).is_ok());
    }
}
