//! The persistent sending queue (`sending_queue.storage: DIR`): a batch is
//! written and fsynced to disk before the pipeline acknowledges it upstream,
//! removed once it was exported (or dropped for good), and replayed after a
//! restart, so a crash (even SIGKILL) during an outage loses nothing the
//! collector had accepted.
//!
//! Layout: `DIR/<exporter id>/<seq>.batch`, one file per batch:
//! `b"PCQ2"`, CRC-32 (IEEE) of the payload (u32 LE), payload length (u64 LE),
//! samples in the batch (u64 LE, so the queue can say what it holds without
//! decoding), payload (`ProfilesData` protobuf); `PCQ1` files (no sample
//! count) from earlier versions still read. Files are written to `*.tmp`, fsynced,
//! renamed, and the directory fsynced. The queue holds at most
//! `max_storage_bytes` on disk; past that [`PersistentQueue::persist`] says
//! [`PersistError::Full`]. A file that does not read back (torn, truncated,
//! flipped bits, not protobuf) is renamed to `*.corrupt` with a warning and
//! skipped: it never blocks start-up.
//!
//! `ExporterHandle` opens the queue at start and queues what
//! [`PersistentQueue::open`] returns first; `enqueue` persists a batch before
//! it goes into the channel (so before the pipeline answers the receiver) and
//! carries its [`Ticket`]; after the export succeeded or failed for good the
//! ticket is removed. A batch still queued at shutdown keeps its file and is
//! replayed at the next start.

use profcol_api::Profiles;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Version 2 headers: magic, CRC32 of the payload, payload length, samples
/// (observations) in the batch, so a queue can say what it holds without
/// decoding it. Version 1 files (no sample count) are still read.
const MAGIC: &[u8; 4] = b"PCQ2";
const HEADER: usize = 4 + 4 + 8 + 8;
const MAGIC_V1: &[u8; 4] = b"PCQ1";
const HEADER_V1: usize = 4 + 4 + 8;

/// Identifies one batch on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Ticket {
    seq: u64,
    bytes: u64,
    /// Samples in the batch (0 when a version 1 file did not say).
    samples: u64,
}

#[derive(Debug, thiserror::Error)]
pub(super) enum PersistError {
    #[error(
        "the persistent queue in {dir} is full ({used} of max_storage_bytes {max} bytes used; this batch needs {need})"
    )]
    Full { dir: String, used: u64, max: u64, need: u64 },
    #[error("the persistent queue cannot write {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl PersistError {
    /// The same, without local paths or OS details: what a sender may be
    /// told (the log has the whole error).
    pub(super) fn for_sender(&self) -> String {
        match self {
            PersistError::Full { used, max, need, .. } => format!(
                "the persistent sending queue is full ({used} of max_storage_bytes {max} bytes used; this batch needs {need})"
            ),
            PersistError::Io { .. } => {
                "the persistent sending queue cannot store the batch (a disk error; the collector's log says which)".into()
            }
        }
    }
}

/// A directory of batches waiting to be exported.
///
/// One per directory in the process (a reload that replaces an exporter
/// shares it between the old and the new handle, so sequence numbers and the
/// byte bound stay whole), and one per directory on the host: an exclusive
/// `flock` on `DIR/<id>/.lock` keeps a second profcol off it.
pub(super) struct PersistentQueue {
    dir: PathBuf,
    max_bytes: AtomicU64,
    used: AtomicU64,
    /// Batch files on disk, and the samples they hold.
    batches: AtomicU64,
    samples: AtomicU64,
    next_seq: AtomicU64,
    /// Batches on disk that no exporter has in its channel: left from the
    /// last run, or handed back by a handle that stopped. Read with
    /// [`PersistentQueue::load`] one at a time, so a backlog is never all in memory.
    unclaimed: Mutex<Vec<Ticket>>,
    /// Signalled when batches are handed back.
    pub(super) handed_back: tokio::sync::Notify,
    /// Signalled when a batch left the disk, so a writer waiting for room retries.
    pub(super) room: tokio::sync::Notify,
    /// Holds the flock for as long as the queue is open.
    _lock: std::fs::File,
}

/// Permissions of the queue's directories and files.
const DIR_MODE: profcol_api::config::Mode = profcol_api::config::Mode(0o700);
const FILE_MODE: profcol_api::config::Mode = profcol_api::config::Mode(0o600);

/// The queues open in this process, by directory.
static OPEN: Mutex<Vec<(PathBuf, Weak<PersistentQueue>)>> = Mutex::new(Vec::new());

/// Takes the exclusive lock of a queue directory, or says who holds it.
fn lock(dir: &Path) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let path = dir.join(".lock");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(FILE_MODE.bits())
        .open(&path)?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut holder = String::new();
        let _ = f.read_to_string(&mut holder);
        return Err(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            format!(
                "another process (pid {}) uses this persistent queue; give each profcol its own sending_queue.storage",
                holder.trim()
            ),
        ));
    }
    f.set_len(0)?;
    write!(f, "{}", std::process::id())?;
    Ok(f)
}

fn crc32(data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let t = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
            }
            *e = c;
        }
        t
    });
    let mut c = !0u32;
    for &b in data {
        c = t[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

fn sanitize(id: &str) -> String {
    id.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') { c } else { '_' }).collect()
}

fn fsync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Renames a batch file that cannot be replayed to `*.corrupt`, with a warning.
fn set_aside(exporter_id: &str, p: &Path, why: &str) {
    let aside = p.with_extension("corrupt");
    let moved = std::fs::rename(p, &aside);
    tracing::warn!(
        exporter = exporter_id,
        file = %p.display(),
        moved_to = %aside.display(),
        moved = moved.is_ok(),
        "persistent queue: a batch file is set aside, not replayed, because {why}; inspect or delete it"
    );
}

/// A batch file's header: (CRC32, payload length, samples, header length).
fn read_header(f: &mut std::fs::File) -> Result<(u32, u64, u64, usize), String> {
    let mut header = [0u8; HEADER];
    f.read_exact(&mut header[..HEADER_V1]).map_err(|e| format!("short header: {e}"))?;
    let size = match &header[..4] {
        m if m == MAGIC => {
            f.read_exact(&mut header[HEADER_V1..]).map_err(|e| format!("short header: {e}"))?;
            HEADER
        }
        m if m == MAGIC_V1 => HEADER_V1,
        _ => return Err("bad magic".into()),
    };
    let crc = u32::from_le_bytes(header[4..8].try_into().unwrap_or_default());
    let len = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
    let samples = if size == HEADER { u64::from_le_bytes(header[16..24].try_into().unwrap_or_default()) } else { 0 };
    Ok((crc, len, samples, size))
}

/// Reads and checks one batch file; `packed`: its samples kept packed
/// (`Profiles::decode_packed`), for an exporter that reads packed batches.
fn read_batch(path: &Path, packed: bool) -> Result<Profiles, String> {
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let (crc, len, _, header) = read_header(&mut f)?;
    let meta_len = f.metadata().map_err(|e| e.to_string())?.len();
    if meta_len != header as u64 + len {
        return Err(format!("length {len} does not match the file size {meta_len}"));
    }
    let mut payload = Vec::with_capacity(len as usize);
    f.read_to_end(&mut payload).map_err(|e| e.to_string())?;
    if crc32(&payload) != crc {
        return Err("checksum mismatch".into());
    }
    let decoded = if packed { Profiles::decode_packed(&payload) } else { Profiles::decode(&payload) };
    decoded.map_err(|e| e.to_string())
}

impl PersistentQueue {
    /// Opens (creating) `root/<exporter id>`, or returns the queue this
    /// process already has open there. What a previous run left is
    /// unclaimed, oldest first. Nothing is decoded here, so start-up does not
    /// wait for a backlog to be read.
    pub(super) fn open(root: &Path, exporter_id: &str, max_bytes: u64) -> std::io::Result<Arc<Self>> {
        let dir = root.join(sanitize(exporter_id));
        // Batches name hosts, processes and functions: only profcol's user reads them.
        profcol_api::config::create_dirs(&dir, DIR_MODE)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(DIR_MODE.bits()))?;
        let dir = std::fs::canonicalize(&dir)?;
        let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|(_, q)| q.strong_count() > 0);
        if let Some(q) = open.iter().find(|(d, _)| *d == dir).and_then(|(_, q)| q.upgrade()) {
            q.max_bytes.store(max_bytes, Ordering::Relaxed);
            return Ok(q);
        }
        let q = Arc::new(Self::open_dir(dir.clone(), exporter_id, max_bytes)?);
        open.push((dir, Arc::downgrade(&q)));
        Ok(q)
    }

    fn open_dir(dir: PathBuf, exporter_id: &str, max_bytes: u64) -> std::io::Result<Self> {
        let lock = lock(&dir)?;
        let mut files: Vec<(u64, PathBuf)> = Vec::new();
        for e in std::fs::read_dir(&dir)? {
            let Ok(e) = e else { continue };
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                // A write that never finished: the batch was never acknowledged.
                let _ = std::fs::remove_file(&p);
                continue;
            }
            let Some(stem) = name.strip_suffix(".batch") else { continue };
            match stem.parse::<u64>() {
                Ok(seq) if seq < u64::MAX => {
                    // Left by a version that wrote them world-readable.
                    let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(FILE_MODE.bits()));
                    files.push((seq, p))
                }
                _ => set_aside(exporter_id, &p, "its name is not a queue sequence number"),
            }
        }
        files.sort();
        let mut replay = Vec::with_capacity(files.len());
        let mut used = 0u64;
        let mut max_seq = 0u64;
        let mut samples_on_disk = 0u64;
        for (seq, p) in files {
            max_seq = max_seq.max(seq);
            let bytes = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
            used += bytes;
            // The header only; a file that does not read is set aside when it is loaded.
            let samples = std::fs::File::open(&p).ok().and_then(|mut f| read_header(&mut f).ok()).map_or(0, |h| h.2);
            samples_on_disk += samples;
            replay.push(Ticket { seq, bytes, samples });
        }
        if !replay.is_empty() {
            tracing::info!(
                exporter = exporter_id,
                batches = replay.len(),
                bytes = used,
                "persistent queue: replaying batches from the last run"
            );
        }
        Ok(PersistentQueue {
            dir,
            max_bytes: AtomicU64::new(max_bytes),
            used: AtomicU64::new(used),
            batches: AtomicU64::new(replay.len() as u64),
            samples: AtomicU64::new(samples_on_disk),
            next_seq: AtomicU64::new(max_seq + 1),
            unclaimed: Mutex::new(replay),
            handed_back: tokio::sync::Notify::new(),
            room: tokio::sync::Notify::new(),
            _lock: lock,
        })
    }

    /// Takes every unclaimed batch, oldest first.
    pub(super) fn take_unclaimed(&self) -> Vec<Ticket> {
        let mut v = std::mem::take(&mut *self.unclaimed.lock().unwrap_or_else(|p| p.into_inner()));
        v.sort_by_key(|t| t.seq);
        v
    }

    /// Hands batches back (a stopping handle's queue), for whichever handle
    /// uses this queue next (a reload's new one) or the next start.
    pub(super) fn hand_back(&self, tickets: impl IntoIterator<Item = Ticket>) {
        let mut u = self.unclaimed.lock().unwrap_or_else(|p| p.into_inner());
        let before = u.len();
        u.extend(tickets);
        if u.len() > before {
            self.handed_back.notify_waiters();
        }
    }

    /// Bytes on disk now.
    pub(super) fn used_bytes(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Batches and samples on disk now (samples of version 1 files not counted).
    pub(super) fn on_disk(&self) -> (u64, u64) {
        (self.batches.load(Ordering::Relaxed), self.samples.load(Ordering::Relaxed))
    }

    /// A batch's file is gone (exported, or set aside).
    fn gone(&self, t: &Ticket) {
        let _ = self.batches.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |b| Some(b.saturating_sub(1)));
        let _ = self.samples.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |s| Some(s.saturating_sub(t.samples)));
    }

    fn path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq:020}.batch"))
    }

    /// Reads a batch left from a previous run (blocking I/O). A file that does
    /// not read back (torn, truncated, flipped bits, not protobuf) is set
    /// aside as `*.corrupt` with a warning and yields `None`. `packed`: as
    /// the exporter takes batches (`Exporter::reads_packed`).
    pub(super) fn load(&self, exporter_id: &str, t: &Ticket, packed: bool) -> Option<Profiles> {
        let p = self.path(t.seq);
        match read_batch(&p, packed) {
            Ok(batch) => Some(batch),
            Err(why) => {
                set_aside(exporter_id, &p, &format!("it does not read back: {why}"));
                self.used.fetch_sub(t.bytes.min(self.used.load(Ordering::Relaxed)), Ordering::AcqRel);
                self.gone(t);
                None
            }
        }
    }

    /// Writes the batch durably (blocking I/O: call from `spawn_blocking`,
    /// or use [`PersistentQueue::persist`]).
    pub(super) fn persist_blocking(&self, batch: &Profiles) -> Result<Ticket, PersistError> {
        let payload = batch.encode_to_vec();
        let samples = batch.sample_count() as u64;
        let need = (HEADER + payload.len()) as u64;
        // Reserve the space first so concurrent writers respect the bound.
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let max = self.max_bytes.load(Ordering::Relaxed);
            if cur + need > max {
                return Err(PersistError::Full { dir: self.dir.display().to_string(), used: cur, max, need });
            }
            match self.used.compare_exchange_weak(cur, cur + need, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(v) => cur = v,
            }
        }
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let path = self.path(seq);
        let tmp = path.with_extension("tmp");
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(FILE_MODE.bits())
                .open(&tmp)?;
            f.set_permissions(std::fs::Permissions::from_mode(FILE_MODE.bits()))?;
            let mut header = [0u8; HEADER];
            header[..4].copy_from_slice(MAGIC);
            header[4..8].copy_from_slice(&crc32(&payload).to_le_bytes());
            header[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
            header[16..24].copy_from_slice(&samples.to_le_bytes());
            f.write_all(&header)?;
            f.write_all(&payload)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            fsync_dir(&self.dir);
            Ok(())
        };
        if let Err(source) = write() {
            let _ = std::fs::remove_file(&tmp);
            self.used.fetch_sub(need, Ordering::AcqRel);
            return Err(PersistError::Io { path: path.display().to_string(), source });
        }
        self.batches.fetch_add(1, Ordering::AcqRel);
        self.samples.fetch_add(samples, Ordering::AcqRel);
        Ok(Ticket { seq, bytes: need, samples })
    }

    /// Writes the batch durably off the async threads.
    pub(super) async fn persist(self: &Arc<Self>, batch: Arc<Profiles>) -> Result<Ticket, PersistError> {
        let me = self.clone();
        match tokio::task::spawn_blocking(move || me.persist_blocking(&batch)).await {
            Ok(r) => r,
            Err(e) => Err(PersistError::Io { path: self.dir.display().to_string(), source: std::io::Error::other(e) }),
        }
    }

    /// Forgets a batch that was exported or dropped for good.
    pub(super) fn remove(&self, t: &Ticket) {
        match std::fs::remove_file(self.path(t.seq)) {
            Ok(()) => {
                self.used.fetch_sub(t.bytes.min(self.used.load(Ordering::Relaxed)), Ordering::AcqRel);
                self.gone(t);
                self.room.notify_waiters();
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(file = %self.path(t.seq).display(), "persistent queue: cannot remove an exported batch: {e}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(n: usize) -> Profiles {
        let mut b = profcol_api::ProfilesBuilder::new();
        let r = b.resource(Default::default());
        let p =
            b.profile(r, &profcol_api::model::ProfileMeta { sample_type: ("samples", "count"), ..Default::default() });
        for k in 0..n {
            let f = b.function(&format!("f{k}"), "", "", 0);
            let l = b.location(profcol_api::model::pb::Location {
                lines: vec![profcol_api::model::pb::Line { function_index: f, line: 1, column: 0 }],
                ..Default::default()
            });
            let st = b.stack(&[l]);
            b.sample(p, profcol_api::model::pb::Sample { stack_index: st, values: vec![1], ..Default::default() });
        }
        b.build()
    }

    #[test]
    fn version_1_files_still_replay_and_the_queue_counts_what_it_holds() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(sanitize("otlp"));
        std::fs::create_dir_all(&dir).unwrap();
        let old = batch(3);
        let payload = old.encode_to_vec();
        let mut v1 = MAGIC_V1.to_vec();
        v1.extend_from_slice(&crc32(&payload).to_le_bytes());
        v1.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        v1.extend_from_slice(&payload);
        std::fs::write(dir.join(format!("{:020}.batch", 7)), v1).unwrap();
        let q = PersistentQueue::open(tmp.path(), "otlp", 1 << 20).unwrap();
        // A version 1 file says nothing about its samples.
        assert_eq!(q.on_disk(), (1, 0));
        let t = q.persist_blocking(&batch(5)).unwrap();
        assert_eq!(q.on_disk(), (2, batch(5).sample_count() as u64));
        let replayed = q.take_unclaimed();
        assert_eq!(q.load("otlp", &replayed[0], false).unwrap(), old);
        let packed = q.load("otlp", &t, true).unwrap();
        assert!(packed.is_packed());
        assert_eq!(packed, batch(5));
        assert!(!q.load("otlp", &t, false).unwrap().is_packed());
        q.remove(&t);
        q.remove(&replayed[0]);
        assert_eq!(q.on_disk(), (0, 0));
    }

    #[test]
    fn only_profcols_user_can_read_the_queue() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("queue");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let q = PersistentQueue::open(&root, "otlp/backend", 1 << 20).unwrap();
        q.persist_blocking(&batch(5)).unwrap();
        let dir = root.join(sanitize("otlp/backend"));
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&dir), 0o700);
        let files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        assert!(files.iter().any(|p| p.extension().is_some_and(|e| e == "batch")), "{files:?}");
        for f in &files {
            assert_eq!(mode(f), 0o600, "{}", f.display());
        }
    }

    #[test]
    fn what_a_sender_is_told_names_no_path() {
        let full = PersistError::Full { dir: "/var/lib/profcol/queue".into(), used: 10, max: 20, need: 15 };
        let io = PersistError::Io {
            path: "/var/lib/profcol/queue/otlp/00000000000000000001.batch".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        };
        assert!(full.to_string().contains("/var/lib/profcol") && io.to_string().contains("/var/lib/profcol"));
        for e in [full, io] {
            let told = e.for_sender();
            assert!(!told.contains('/') && !told.contains("No space"), "{told}");
            assert!(told.contains("persistent sending queue"), "{told}");
        }
    }

    #[test]
    fn persists_replays_removes_and_bounds() {
        let d = tempfile::tempdir().unwrap();
        let q = PersistentQueue::open(d.path(), "otlp/backend", 1 << 20).unwrap();
        assert!(q.take_unclaimed().is_empty());
        let t1 = q.persist_blocking(&batch(3)).unwrap();
        let _t2 = q.persist_blocking(&batch(4)).unwrap();
        q.remove(&t1);
        drop(q);
        let q = PersistentQueue::open(d.path(), "otlp/backend", 1 << 20).unwrap();
        let replay = q.take_unclaimed();
        assert_eq!(replay.len(), 1);
        assert_eq!(q.load("otlp/backend", &replay[0], false), Some(batch(4)));
        assert_eq!(q.used_bytes(), replay[0].bytes);
        let small = PersistentQueue::open(d.path(), "other", 64).unwrap();
        assert!(matches!(small.persist_blocking(&batch(50)), Err(PersistError::Full { .. })));
        // New sequence numbers continue after the replayed ones.
        let t3 = q.persist_blocking(&batch(1)).unwrap();
        assert!(t3.seq > replay[0].seq);
    }

    #[test]
    fn corrupt_files_are_set_aside_and_do_not_block_startup() {
        let d = tempfile::tempdir().unwrap();
        let q = PersistentQueue::open(d.path(), "otlp", 1 << 20).unwrap();
        let good = q.persist_blocking(&batch(2)).unwrap();
        let bad = q.persist_blocking(&batch(5)).unwrap();
        let torn = q.persist_blocking(&batch(6)).unwrap();
        drop(q);
        let dir = d.path().join("otlp");
        // Flip a payload byte of one file, truncate another, add junk and a stale tmp.
        let p = dir.join(format!("{:020}.batch", bad.seq));
        let mut bytes = std::fs::read(&p).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&p, bytes).unwrap();
        let p = dir.join(format!("{:020}.batch", torn.seq));
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
        std::fs::write(dir.join("00000000000000000099.batch"), b"garbage").unwrap();
        std::fs::write(dir.join("99999999999999999999.batch"), b"name past u64").unwrap();
        std::fs::write(dir.join("00000000000000000100.tmp"), b"half").unwrap();
        let q = PersistentQueue::open(d.path(), "otlp", 1 << 20).unwrap();
        let replay = q.take_unclaimed();
        let loaded: Vec<_> = replay.iter().filter_map(|t| q.load("otlp", t, false).map(|b| (t.clone(), b))).collect();
        assert_eq!(loaded, vec![(good.clone(), batch(2))]);
        assert_eq!(q.used_bytes(), good.bytes);
        let corrupt = std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "corrupt"))
            .count();
        assert_eq!(corrupt, 4);
        assert!(!dir.join("00000000000000000100.tmp").exists());
    }

    #[test]
    fn one_queue_per_directory_in_the_process_and_handed_back_batches_come_back() {
        let d = tempfile::tempdir().unwrap();
        let a = PersistentQueue::open(d.path(), "otlp", 1 << 20).unwrap();
        // A reload's new handle gets the same queue: one sequence, one byte count.
        let b = PersistentQueue::open(d.path(), "otlp", 1 << 20).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let t1 = a.persist_blocking(&batch(1)).unwrap();
        let t2 = b.persist_blocking(&batch(2)).unwrap();
        assert_ne!(t1.seq, t2.seq);
        assert_eq!(a.used_bytes(), t1.bytes + t2.bytes);
        assert!(b.take_unclaimed().is_empty());
        a.hand_back([t2.clone(), t1.clone()]);
        assert_eq!(b.take_unclaimed(), vec![t1, t2]);
    }

    #[test]
    fn a_queue_locked_by_another_process_is_refused_with_its_pid() {
        use std::os::fd::AsRawFd;
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("otlp");
        std::fs::create_dir_all(&dir).unwrap();
        // Another open file description on the lock file stands in for another process.
        let other = std::fs::File::create(dir.join(".lock")).unwrap();
        // SAFETY: flock on a descriptor this test owns.
        assert_eq!(unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
        std::fs::write(dir.join(".lock"), "4242").unwrap();
        let err = PersistentQueue::open(d.path(), "otlp", 1 << 20).err().expect("opened a locked queue");
        assert!(err.to_string().contains("another process (pid 4242)"), "{err}");
        drop(other);
        assert!(PersistentQueue::open(d.path(), "otlp", 1 << 20).is_ok());
    }
}
