//! Files the exporters write, with the permissions the config asks for
//! (`file_mode`, `dir_mode`; default 0640 / 0750: profiles name hosts,
//! processes and functions, so others get nothing). The persistent sending
//! queue uses the same helpers with 0600 / 0700. Modes are set
//! explicitly after creation, so the process's umask cannot widen or narrow
//! them; files and directories that already exist keep theirs.

use profcol_api::config::Mode;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

pub const DEFAULT_FILE_MODE: Mode = Mode(0o640);
pub const DEFAULT_DIR_MODE: Mode = Mode(0o750);

pub use profcol_api::config::create_dirs;

/// Opens `path` for appending, creating it with `mode`.
pub fn open_append(path: &Path, mode: Mode) -> std::io::Result<File> {
    match OpenOptions::new().append(true).create_new(true).mode(mode.bits()).open(path) {
        Ok(f) => {
            f.set_permissions(std::fs::Permissions::from_mode(mode.bits()))?;
            Ok(f)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => OpenOptions::new().append(true).open(path),
        Err(e) => Err(e),
    }
}

/// Writes `data` to `path` atomically (temporary file, fsync, rename), the
/// file with `mode`.
pub fn write_atomic(path: &Path, data: &[u8], mode: Mode) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = OpenOptions::new().write(true).create(true).truncate(true).mode(mode.bits()).open(&tmp)?;
    f.set_permissions(std::fs::Permissions::from_mode(mode.bits()))?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode_of(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn modes_are_what_was_asked_whatever_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let before = mode_of(dir.path());
        // Group-writable modes: the usual umask (022) would take the w away.
        let nested = dir.path().join("a/b");
        create_dirs(&nested, Mode(0o770)).unwrap();
        let f = nested.join("out.jsonl");
        open_append(&f, Mode(0o660)).unwrap().write_all(b"x").unwrap();
        write_atomic(&nested.join("r.pb.gz"), b"y", Mode(0o620)).unwrap();
        assert_eq!(mode_of(&dir.path().join("a")), 0o770);
        assert_eq!(mode_of(&nested), 0o770);
        assert_eq!(mode_of(&f), 0o660);
        assert_eq!(mode_of(&nested.join("r.pb.gz")), 0o620);
        // The directory that already existed keeps its mode.
        assert_eq!(mode_of(dir.path()), before);
        // An existing file keeps its mode and is appended to.
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        open_append(&f, Mode(0o600)).unwrap().write_all(b"z").unwrap();
        assert_eq!(mode_of(&f), 0o644);
        assert_eq!(std::fs::read(&f).unwrap(), b"xz");
    }
}
