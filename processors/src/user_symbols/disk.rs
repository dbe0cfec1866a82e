//! The on-disk table cache (`cache.dir`): one file per build id (or file
//! id) holding what names a frame without the binary, so a restart does not
//! re-parse the ELF: the `PT_LOAD` segments (file offset → address) and the
//! function-symbol table, front-coded as it is held in memory. DWARF lines
//! and inlined frames are not stored: after a restart a table from disk
//! names functions at once, and the loader re-opens the DWARF in the
//! background (read in place from the mapping, no parse up front) when the
//! binary had it and is still reachable.
//!
//! A file is `KEY.syms`: a header (magic, format version, flags, payload
//! length, CRC-32 of every other byte of the file, the key again) and the
//! payload. A file
//! that is truncated, corrupt, of another version or for another key is
//! ignored with a warning, removed and rebuilt from the binary; it is
//! never trusted. Files are written to a temporary name and renamed (a
//! reader never sees half a file), mode 0600 in a 0700 directory. The
//! directory's files stay within `cache.dir_max_bytes`: after each write
//! the least recently used (oldest modification time; a hit touches its
//! file) are removed.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime};

use profcol_elf::{MappedFile, SymbolTable};
use std::ops::Range;

/// First bytes of every file.
const MAGIC: &[u8; 8] = b"PCSYMTAB";
/// Bumped whenever the payload's layout changes; other versions are rebuilt.
pub const VERSION: u32 = 1;
/// Flag: the binary (or its debug file) had DWARF when the table was made.
const FLAG_DWARF: u32 = 1;
/// Header bytes before the key: magic, version, flags, payload length,
/// CRC-32, key length.
const HEADER: usize = 8 + 4 + 4 + 8 + 4 + 4;
/// Largest file read back (a table of a huge binary is a few MiB).
const MAX_FILE: u64 = 512 << 20;
/// Temporary files older than this are left over from a crash: removed.
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// What a table needs from disk to name frames.
pub struct DiskTable {
    /// `PT_LOAD` segments as (vaddr, filesz, offset).
    pub segments: Vec<(u64, u64, u64)>,
    pub symbols: SymbolTable,
    /// The binary had DWARF: worth re-opening for lines.
    pub had_dwarf: bool,
}

/// Counters read into /metrics.
#[derive(Default)]
pub struct DiskCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// Files found but refused (truncated, corrupt, other version).
    pub invalid: AtomicU64,
    pub writes: AtomicU64,
    pub(crate) write_errors: AtomicU64,
    /// Files removed to stay within the byte bound.
    pub evictions: AtomicU64,
}

pub struct DiskCache {
    dir: PathBuf,
    max_bytes: u64,
    pub counters: DiskCounters,
}

impl DiskCache {
    /// Creates `dir` (mode 0700) if needed. `None`, with a warning, when it
    /// cannot be used: tables are then loaded from binaries only.
    pub fn open(dir: &Path, max_bytes: u64) -> Option<Self> {
        if let Err(e) = fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "user_symbols: cannot create cache.dir; tables are loaded from binaries on every start");
            return None;
        }
        let meta = match fs::metadata(dir) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "user_symbols: cannot read cache.dir; not used");
                return None;
            }
        };
        // A table names frames; one planted by another user would mislabel
        // them. Refuse a directory others may write or that is not ours.
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        if meta.mode() & 0o022 != 0 || meta.uid() != euid {
            tracing::warn!(
                dir = %dir.display(),
                mode = format!("{:o}", meta.mode() & 0o777),
                owner = meta.uid(),
                "user_symbols: cache.dir is writable by others or not owned by this user; not used (chmod 700 it, or pick another)"
            );
            return None;
        }
        let cache = DiskCache { dir: dir.to_owned(), max_bytes, counters: DiskCounters::default() };
        cache.remove_stale_temps();
        Some(cache)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `KEY.syms`; `None` for a key that is not plain hex (never a path).
    pub fn path_of(&self, key: &str) -> Option<PathBuf> {
        let ok = !key.is_empty() && key.len() <= 128 && key.bytes().all(|b| b.is_ascii_hexdigit());
        ok.then(|| self.dir.join(format!("{key}.syms")))
    }

    /// The table of `key`, when its file is there and sound. A bad file is
    /// removed (with a warning) so the next load rewrites it.
    pub fn read(&self, key: &str) -> Option<DiskTable> {
        let path = self.path_of(key)?;
        let file = match map_bounded(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.counters.misses.fetch_add(1, Relaxed);
                return None;
            }
            Err(e) => {
                self.counters.misses.fetch_add(1, Relaxed);
                tracing::warn!(file = %path.display(), error = %e, "user_symbols: cannot read a cached table; loading from the binary");
                return None;
            }
        };
        match decode_mapped(&file, key) {
            Ok(t) => {
                self.counters.hits.fetch_add(1, Relaxed);
                // Least recently used goes first: a hit is a use.
                if let Ok(f) = File::open(&path) {
                    let _ = f.set_modified(SystemTime::now());
                }
                Some(t)
            }
            Err(why) => {
                self.counters.invalid.fetch_add(1, Relaxed);
                tracing::warn!(file = %path.display(), why, "user_symbols: cached table ignored and rebuilt from the binary");
                let _ = fs::remove_file(&path);
                None
            }
        }
    }

    /// Writes `key`'s table (temporary file, then rename), then removes
    /// the least recently used files beyond the byte bound. Returns the
    /// symbols read back in place from the written file, to use instead
    /// of the heap copy (`None` when not written or not readable).
    pub fn write(
        &self,
        key: &str,
        segments: &[(u64, u64, u64)],
        symbols: &SymbolTable,
        had_dwarf: bool,
    ) -> Option<SymbolTable> {
        let path = self.path_of(key)?;
        if file_len(key, segments, symbols) as u64 > self.max_bytes {
            return None; // would evict everything else and itself
        }
        match self.write_atomic(&path, |f| write_table(f, key, segments, symbols, had_dwarf)) {
            Ok(()) => {
                self.counters.writes.fetch_add(1, Relaxed);
                self.bound(&path);
            }
            Err(e) => {
                self.counters.write_errors.fetch_add(1, Relaxed);
                tracing::warn!(file = %path.display(), error = %e, "user_symbols: cannot write a table to cache.dir");
                return None;
            }
        }
        let file = map_bounded(&path).ok()?;
        decode_mapped(&file, key).ok().map(|t| t.symbols)
    }

    fn write_atomic(&self, path: &Path, write: impl FnOnce(&File) -> std::io::Result<()>) -> std::io::Result<()> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let tmp = self.dir.join(format!(".tmp-{}-{}", std::process::id(), SEQ.fetch_add(1, Relaxed)));
        let written = (|| {
            let f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            write(&f)?;
            fs::rename(&tmp, path)
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written
    }

    /// Removes least recently used `.syms` files until the directory's
    /// total is within `max_bytes`; `keep` (just written) goes last.
    fn bound(&self, keep: &Path) {
        let Ok(dir) = fs::read_dir(&self.dir) else { return };
        let mut files: Vec<(SystemTime, u64, PathBuf)> = dir
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(".syms")))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        if total <= self.max_bytes {
            return;
        }
        files.sort_by_key(|f| (f.2 == keep, f.0));
        for (_, len, path) in files {
            if total <= self.max_bytes {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total -= len;
                self.counters.evictions.fetch_add(1, Relaxed);
            }
        }
    }

    fn remove_stale_temps(&self) {
        let Ok(dir) = fs::read_dir(&self.dir) else { return };
        for e in dir.filter_map(Result::ok) {
            let stale = e.file_name().to_str().is_some_and(|n| n.starts_with(".tmp-"))
                && e.metadata()
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > STALE_TEMP);
            if stale {
                let _ = fs::remove_file(e.path());
            }
        }
    }

    /// Bytes of `.syms` files in the directory.
    pub fn bytes(&self) -> u64 {
        let Ok(dir) = fs::read_dir(&self.dir) else { return 0 };
        dir.filter_map(Result::ok)
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(".syms")))
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    }
}

/// The whole file mapped, refused beyond [`MAX_FILE`]. Mapped, not read:
/// a table's names are then read in place, page cache rather than the
/// agent's heap. Safe to map: files here are only ever replaced by
/// rename or removed, never changed in place (and `open` refuses a
/// directory others can write).
fn map_bounded(path: &Path) -> std::io::Result<MappedFile> {
    let f = File::open(path)?;
    let len = f.metadata()?.len();
    if len > MAX_FILE {
        return Err(std::io::Error::other(format!("{len} bytes is larger than any table ({MAX_FILE})")));
    }
    MappedFile::open(&f)
}

/// The file's bytes for `key`'s table.
pub fn encode(key: &str, segments: &[(u64, u64, u64)], symbols: &SymbolTable, had_dwarf: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(file_len(key, segments, symbols));
    let crc = write_parts(&mut out, key, segments, symbols, had_dwarf).expect("writing to a Vec cannot fail");
    out[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Length of [`encode`]'s bytes.
fn file_len(key: &str, segments: &[(u64, u64, u64)], symbols: &SymbolTable) -> usize {
    HEADER + key.len() + payload_len(segments, symbols)
}

fn payload_len(segments: &[(u64, u64, u64)], symbols: &SymbolTable) -> usize {
    4 + segments.len() * 24 + symbols.encoded_len()
}

/// [`encode`] straight into `file` (no copy of the table in memory): the
/// CRC is written last, at its place in the header.
fn write_table(
    file: &File,
    key: &str,
    segments: &[(u64, u64, u64)],
    symbols: &SymbolTable,
    had_dwarf: bool,
) -> std::io::Result<()> {
    let mut w = std::io::BufWriter::with_capacity(64 << 10, file);
    let crc = write_parts(&mut w, key, segments, symbols, had_dwarf)?;
    w.flush()?;
    std::os::unix::fs::FileExt::write_all_at(file, &crc.to_le_bytes(), CRC_AT as u64)
}

/// Writes the file with a zero CRC; returns the CRC it should hold:
/// CRC-32 of every byte but the CRC's own four.
fn write_parts(
    w: &mut impl Write,
    key: &str,
    segments: &[(u64, u64, u64)],
    symbols: &SymbolTable,
    had_dwarf: bool,
) -> std::io::Result<u32> {
    let mut w = Crc32Writer { inner: w, crc: flate2::Crc::new() };
    w.write_all(MAGIC)?;
    w.write_all(&VERSION.to_le_bytes())?;
    w.write_all(&(if had_dwarf { FLAG_DWARF } else { 0 }).to_le_bytes())?;
    w.write_all(&(payload_len(segments, symbols) as u64).to_le_bytes())?;
    w.inner.write_all(&[0; 4])?; // the CRC: not part of itself
    w.write_all(&(key.len() as u32).to_le_bytes())?;
    w.write_all(key.as_bytes())?;
    w.write_all(&(segments.len() as u32).to_le_bytes())?;
    for &(vaddr, filesz, offset) in segments {
        for v in [vaddr, filesz, offset] {
            w.write_all(&v.to_le_bytes())?;
        }
    }
    symbols.encode_to(&mut w)?;
    Ok(w.crc.sum())
}

/// Passes bytes on, adding them to a CRC-32.
struct Crc32Writer<W> {
    inner: W,
    crc: flate2::Crc,
}

impl<W: Write> Write for Crc32Writer<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Where the CRC is in the header.
const CRC_AT: usize = 24;

/// CRC-32 of every byte of a file but the CRC's own four.
fn checksum(file: &[u8]) -> u32 {
    let mut crc = flate2::Crc::new();
    crc.update(&file[..CRC_AT]);
    crc.update(&file[CRC_AT + 4..]);
    crc.sum()
}

/// Reads a file's bytes; the reason when they are not a sound table for `key`.
pub fn decode(bytes: &[u8], key: &str) -> Result<DiskTable, &'static str> {
    let (segments, had_dwarf, symbols) = decode_parts(bytes, key)?;
    let symbols = SymbolTable::decode(&bytes[symbols]).map_err(|_| "symbol table malformed")?;
    Ok(DiskTable { segments, symbols, had_dwarf })
}

/// [`decode`] of a mapped file, the symbols' names read in place.
fn decode_mapped(file: &MappedFile, key: &str) -> Result<DiskTable, &'static str> {
    let (segments, had_dwarf, symbols) = decode_parts(file.bytes(), key)?;
    let symbols = SymbolTable::decode_mapped(file, symbols).map_err(|_| "symbol table malformed")?;
    Ok(DiskTable { segments, symbols, had_dwarf })
}

/// A file's parts once its header is checked: the segments, the DWARF
/// flag, and where the symbol table's bytes are.
type Parts = (Vec<(u64, u64, u64)>, bool, Range<usize>);

fn decode_parts(bytes: &[u8], key: &str) -> Result<Parts, &'static str> {
    let field = |at: usize, n: usize| bytes.get(at..at + n).ok_or("truncated header");
    if field(0, 8)? != MAGIC {
        return Err("not a profcol symbol table (bad magic)");
    }
    let u32_at = |at: usize| -> Result<u32, &'static str> {
        Ok(u32::from_le_bytes(field(at, 4)?.try_into().unwrap_or_default()))
    };
    if u32_at(8)? != VERSION {
        return Err("written by another format version");
    }
    let flags = u32_at(12)?;
    let payload_len = u64::from_le_bytes(field(16, 8)?.try_into().unwrap_or_default());
    let crc = u32_at(CRC_AT)?;
    let key_len = u32_at(28)? as usize;
    let payload = bytes.get(HEADER.saturating_add(key_len)..).ok_or("truncated key")?;
    if payload.len() as u64 != payload_len {
        return Err("truncated (payload shorter or longer than its header says)");
    }
    if checksum(bytes) != crc {
        return Err("checksum mismatch (corrupt)");
    }
    if &bytes[HEADER..HEADER + key_len] != key.as_bytes() {
        return Err("written for another build id");
    }
    if flags & !FLAG_DWARF != 0 {
        return Err("unknown flags");
    }
    let n = u32::from_le_bytes(payload.get(..4).ok_or("truncated segments")?.try_into().unwrap_or_default()) as usize;
    let seg_bytes = n.checked_mul(24).filter(|&b| b + 4 <= payload.len()).ok_or("truncated segments")?;
    let segments = payload[4..4 + seg_bytes]
        .chunks_exact(24)
        .map(|c| {
            let v = |i: usize| u64::from_le_bytes(c[i * 8..i * 8 + 8].try_into().unwrap_or_default());
            (v(0), v(1), v(2))
        })
        .collect();
    let symbols_at = bytes.len() - payload.len() + 4 + seg_bytes;
    Ok((segments, flags & FLAG_DWARF != 0, symbols_at..bytes.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table of a few symbols, as `function_symbols` would give.
    fn sample() -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("t.c");
        std::fs::write(&src, "int f(void){return 1;} int g(void){return 2;} int main(void){return f()+g();}").unwrap();
        let bin = dir.path().join("t");
        let ok = std::process::Command::new("gcc").arg("-o").arg(&bin).arg(&src).status().is_ok_and(|s| s.success());
        let symbols = if ok {
            profcol_elf::ElfFile::open(&File::open(&bin).unwrap()).unwrap().function_symbols()
        } else {
            assert!(!profcol_testkit::tools::in_ci(), "gcc is needed (CI=true)");
            SymbolTable::default()
        };
        encode("abcdef01", &[(0x1000, 0x200, 0x1000)], &symbols, true)
    }

    #[test]
    fn every_truncation_and_every_changed_byte_is_refused() {
        let good = sample();
        let t = decode(&good, "abcdef01").expect("sound");
        assert_eq!(t.segments, vec![(0x1000, 0x200, 0x1000)]);
        assert!(t.had_dwarf);
        assert_eq!(decode(&good, "abcdef02").err(), Some("written for another build id"));
        for cut in 0..good.len() {
            assert!(decode(&good[..cut], "abcdef01").is_err(), "cut at {cut}");
        }
        for at in 0..good.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut bad = good.clone();
                bad[at] ^= flip;
                assert!(decode(&bad, "abcdef01").is_err(), "byte {at} ^ {flip:#x} accepted");
            }
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(decode(&longer, "abcdef01").is_err(), "a byte too many");
    }
}
