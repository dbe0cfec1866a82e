//! Module metadata from sysfs, read before (and much faster than) kallsyms,
//! so a frame in a freshly loaded module gets its mapping and build ID at once.
//!
//! Layout under the configured root (normally /sys):
//! `module/NAME/sections/.text` (hex start), `module/NAME/coresize`,
//! `module/NAME/notes/.note.gnu.build-id`, and `kernel/notes` for vmlinux.
//! Directories without `sections/.text` are built-in modules: ignored.

use std::io::ErrorKind;
use std::path::Path;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use super::error::{Error, Result};
use profcol_elf::notes;

/// A loaded module as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleMeta {
    pub name: Arc<str>,
    /// Start of `.text`.
    pub text: u64,
    /// `coresize`: the module owns `[text, text + size)`.
    pub size: u64,
    pub build_id: Option<Arc<[u8]>>,
    /// mtime of the module's sysfs directory; changes when the module is
    /// unloaded and loaded again, so its names must be read again.
    pub mtime_ns: i64,
}

impl ModuleMeta {
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.text && addr - self.text < self.size.max(1)
    }

    /// Same loaded instance: names read for one stay valid for the other.
    pub(crate) fn same_instance(&self, other: &ModuleMeta) -> bool {
        self.name == other.name && self.text == other.text && self.mtime_ns == other.mtime_ns
    }
}

/// Loaded modules sorted by `.text`, or `None` when `root/module` does not
/// exist (no sysfs: every kallsyms module is then taken as loaded).
pub fn read_modules(root: &Path) -> Result<Option<Vec<ModuleMeta>>> {
    let dir = root.join("module");
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(Error::Sysfs { path: dir, source }),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| Error::Sysfs { path: dir.clone(), source })?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        // A module can go away while we read it; skip it then, the uevent
        // for its removal triggers another refresh anyway.
        match read_module(&entry.path(), &name) {
            Ok(Some(m)) => out.push(m),
            Ok(None) => {}
            Err(e) => tracing::debug!(module = %name, error = %e, "skipping module"),
        }
    }
    out.sort_by_key(|m| m.text);
    Ok(Some(out))
}

fn read_module(path: &Path, name: &str) -> Result<Option<ModuleMeta>> {
    let text_path = path.join("sections/.text");
    let text = match std::fs::read_to_string(&text_path) {
        Ok(s) => s,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None), // built-in
        Err(source) => return Err(Error::Sysfs { path: text_path, source }),
    };
    let text = parse_hex(&text).ok_or_else(|| Error::SysfsFormat {
        path: text_path.clone(),
        what: format!("expected a hex address, found {:?}", text.trim()),
    })?;
    if text == 0 {
        // Unprivileged readers see 0: useless as a range.
        return Err(Error::SysfsFormat { path: text_path, what: "address reads as 0 (not root?)".into() });
    }
    let size_path = path.join("coresize");
    let size =
        std::fs::read_to_string(&size_path).map_err(|source| Error::Sysfs { path: size_path.clone(), source })?;
    let size = size.trim().parse::<u64>().map_err(|_| Error::SysfsFormat {
        path: size_path,
        what: format!("expected a decimal size, found {:?}", size.trim()),
    })?;
    let build_id = std::fs::read(path.join("notes/.note.gnu.build-id"))
        .ok()
        .and_then(|b| notes::gnu_build_id_in_blob(&b).map(Arc::from));
    let mtime_ns = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i64);
    Ok(Some(ModuleMeta { name: name.into(), text, size, build_id, mtime_ns }))
}

/// Build ID of the running kernel from `kernel/notes`.
pub fn vmlinux_build_id(root: &Path) -> Option<Arc<[u8]>> {
    let blob = std::fs::read(root.join("kernel/notes")).ok()?;
    notes::gnu_build_id_in_blob(&blob).map(Arc::from)
}

fn parse_hex(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s.strip_prefix("0x").unwrap_or(s);
    u64::from_str_radix(s, 16).ok()
}

/// Lower-case hex of a build ID.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_is_two_lowercase_digits_per_byte() {
        assert_eq!(super::hex(&[]), "");
        assert_eq!(super::hex(&[0x00, 0x0f, 0xa0, 0xff, 0x42]), "000fa0ff42");
    }
}
