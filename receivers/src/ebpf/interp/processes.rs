//! Which sampled processes run an interpreter profcol walks, their entries
//! in the BPF walker's map, and the naming of their records' frames.
//!
//! A process is looked at once per mapping generation (its executable
//! mappings as the process table read them), and only when one of them is
//! an interpreter's file (each file's symbols read once: [`Detector`]);
//! an interpreter found gets a `py_procs` entry,
//! which the BPF program deletes at exec and exit and the receiver with it.
//! Its file goes into `py_files`: a later process mapping it wakes the
//! reader with its first sample, and a young process's records wake it
//! too, so a process living 100 ms is found and named before it exits.

use super::functions::{self, Function, FunctionTable};
use super::merge::{self, Named};
use super::python::detect::{Detection, Detector, PythonProcess, Unsupported};
use super::python::namer::{self, PyNamer};
use super::python::offsets::{self, NONE};
use super::InterpCounters;
use crate::ebpf::process::MappingSet;
use aya::maps::{HashMap as BpfHashMap, MapData};
use profcol_ebpf::python::{
    born_now, FrameWord, ProcEntry, WalkEnd, FILES_CAPACITY, KIND_CPYTHON, NO_OFFSET, PROCS_CAPACITY, PROC_ENTRY_BYTES,
};
use profcol_ebpf::unwind::{file_key, KernelFile, FILE_KEY_BYTES};
use rustc_hash::FxHashMap;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

/// The walker's maps the receiver writes.
pub(crate) struct WalkerMaps {
    /// pid → [`ProcEntry`].
    pub procs: BpfHashMap<MapData, u32, [u8; PROC_ENTRY_BYTES]>,
    /// Interpreter files ([`profcol_ebpf::unwind::file_key`] → 1).
    pub files: BpfHashMap<MapData, [u8; FILE_KEY_BYTES], u8>,
}

/// Named frames cached per process, (code, instruction word) → stack
/// word, before the cache is cleared (~32 bytes each).
const MAX_NAMED_PER_PROCESS: usize = 8192;
/// What one of them costs (key, value, the table's own bytes).
const NAMED_ENTRY_BYTES: usize = 32;
/// Bytes all processes' code object caches hold at most: each process's
/// namer gets its share, between [`MIN_NAMER_BUDGET`] and the default.
const NAMERS_BUDGET: usize = 64 << 20;
const MIN_NAMER_BUDGET: usize = 128 << 10;

/// A Python process being walked.
struct PyProc {
    eval_ranges: Vec<(u64, u64)>,
    namer: PyNamer,
    /// (code object, instruction word) → its stack word.
    named: FxHashMap<(u64, u64), u64>,
}

/// The interpreter side of the receiver.
pub(crate) struct Interpreters {
    map: WalkerMaps,
    detector: Detector,
    /// Interpreter files in `map.files`.
    files: usize,
    procs: FxHashMap<u32, PyProc>,
    /// pid → the mapping generation looked at and found without a walkable
    /// interpreter.
    not_walked: FxHashMap<u32, u32>,
    pub functions: FunctionTable,
    counters: InterpCounters,
    /// Reused per record.
    frames: Vec<Named>,
    merged: Vec<u64>,
}

/// Whether an executable mapping's file is a CPython interpreter's
/// (`python3.X`, `libpython3.X.so.1.0`), by its name: the detector reads
/// the file only then.
fn maps_python(maps: &MappingSet) -> bool {
    maps.mappings.iter().any(|m| {
        let name = m.path.rsplit('/').next().unwrap_or("");
        name.starts_with("python") || name.starts_with("libpython")
    })
}

impl Interpreters {
    pub(crate) fn new(map: WalkerMaps, counters: InterpCounters) -> Self {
        Interpreters {
            map,
            detector: Detector::default(),
            files: 0,
            procs: FxHashMap::default(),
            not_walked: FxHashMap::default(),
            functions: FunctionTable::new(),
            counters,
            frames: Vec::new(),
            merged: Vec::new(),
        }
    }

    /// Looks at process `pid` with mappings `maps` unless it is walked
    /// already (until it execs or exits: new mappings, a C extension
    /// loaded, change nothing) or was looked at with them: a Python process
    /// gets its walker entry. `walker_ready` says whether the walker program
    /// runs (loading it, for the first Python process).
    pub(crate) fn observe(&mut self, pid: u32, maps: &MappingSet, walker_ready: impl FnOnce() -> bool) {
        let generation = maps.generation;
        if self.procs.contains_key(&pid) || self.not_walked.get(&pid) == Some(&generation) {
            return;
        }
        if !maps_python(maps) {
            self.not_walked.insert(pid, generation);
            return;
        }
        match self.detector.detect(pid) {
            Ok(Detection::Python(_)) if !walker_ready() => self.refuse("unsupported"),
            Ok(Detection::Python(p)) => match self.walk(pid, p) {
                Ok(()) => return,
                Err(reason) => self.refuse(reason),
            },
            Ok(Detection::NotPython) => {}
            Ok(Detection::Unsupported { binary, reason }) => {
                tracing::info!(pid, binary = %binary.display(), "ebpf receiver: Python frames not walked: {reason}");
                self.refuse(match reason {
                    Unsupported::Layout(_) | Unsupported::RuntimeSize(..) | Unsupported::VersionMismatch(..) => {
                        "layout"
                    }
                    _ => "unsupported",
                });
            }
            Err(e) => {
                tracing::debug!(pid, "ebpf receiver: Python process not walked: {e}");
                self.refuse("unreadable");
            }
        }
        self.procs.remove(&pid);
        self.not_walked.insert(pid, generation);
    }

    fn refuse(&self, reason: &str) {
        if let Some(i) = super::REFUSED_REASONS.iter().position(|r| *r == reason) {
            self.counters.refused[i].inc();
        }
    }

    /// Writes `p`'s walker entry; the reason when it cannot be walked.
    fn walk(&mut self, pid: u32, p: PythonProcess) -> Result<(), &'static str> {
        let o = p.offsets;
        let entry = ProcEntry {
            runtime: p.runtime_addr,
            version: u16::from(p.version.0) << 8 | u16::from(p.version.1),
            runtime_interpreters_head: o.runtime_interpreters_head,
            interp_next: o.interp_next,
            interp_threads_head: o.interp_threads_head,
            tstate_next: o.tstate_next,
            tstate_thread_id: o.tstate_thread_id,
            tstate_frame: o.tstate_frame,
            cframe_current_frame: if o.cframe_current_frame == NONE { NO_OFFSET } else { o.cframe_current_frame },
            frame_previous: o.frame_previous,
            frame_code: o.frame_code,
            frame_instr: o.frame_instr,
            frame_owner: if o.frame_owner == NONE { NO_OFFSET } else { o.frame_owner },
            frame_is_entry: if o.frame_is_entry == NONE { NO_OFFSET } else { o.frame_is_entry },
            cstack_owner: offsets::cstack_owner(p.version).map_or(NO_OFFSET, u16::from),
            born: born_now(),
        };
        if !entry.frame_members_fit() {
            return Err("layout");
        }
        if !self.procs.contains_key(&pid) && self.procs.len() >= PROCS_CAPACITY {
            return Err("map_full");
        }
        self.map.procs.insert(&pid, &entry.to_bytes(), 0).map_err(|e| {
            tracing::debug!(pid, "ebpf receiver: py_procs: {e}");
            "map_full"
        })?;
        tracing::debug!(
            pid,
            version = ?p.version,
            binary = %p.binary.display(),
            "ebpf receiver: walking python frames"
        );
        self.note_file(pid, &p.binary);
        let namer = PyNamer::new(pid, &p);
        self.procs.insert(pid, PyProc { eval_ranges: p.eval_ranges, namer, named: FxHashMap::default() });
        self.counters.processes.set(self.procs.len() as i64);
        Ok(())
    }

    /// Puts interpreter file `binary` (as process `pid` sees it) into
    /// `py_files`, once.
    fn note_file(&mut self, pid: u32, binary: &std::path::Path) {
        if self.files >= FILES_CAPACITY {
            return;
        }
        let mut at = std::path::PathBuf::from(format!("/proc/{pid}/root"));
        at.push(binary.strip_prefix("/").unwrap_or(binary));
        let Ok(md) = std::fs::metadata(&at) else { return };
        let key = file_key(KernelFile::new(libc::major(md.dev()), libc::minor(md.dev()), md.ino()));
        if self.map.files.get(&key, 0).is_err() && self.map.files.insert(&key, &1, 0).is_ok() {
            self.files += 1;
        }
    }

    /// Process `pid` exec'd or exited: what was found of it goes (the BPF
    /// program deleted its entry already; deleting again is harmless).
    pub(crate) fn forget(&mut self, pid: u32) {
        self.not_walked.remove(&pid);
        if self.procs.remove(&pid).is_some() {
            let _ = self.map.procs.remove(&pid);
            self.counters.processes.set(self.procs.len() as i64);
        }
    }

    /// At a report: keeps only the processes `known` says are still
    /// there, and sets the cache gauge.
    pub(crate) fn retain(&mut self, known: impl Fn(u32) -> bool) {
        self.not_walked.retain(|&pid, _| known(pid));
        let gone: Vec<u32> = self.procs.keys().copied().filter(|&pid| !known(pid)).collect();
        for pid in gone {
            self.forget(pid);
        }
        let bytes: usize = self.procs.values().map(|p| p.namer.bytes() + p.named.len() * NAMED_ENTRY_BYTES).sum();
        self.counters.cache_bytes.set(bytes as i64);
    }

    /// Names the interpreter frames of a record of `pid` (`interp`, leaf
    /// first, as the walker wrote them, ended by `end`) and puts them into
    /// the native stack `ustack` in place.
    pub(crate) fn name_into(
        &mut self,
        pid: u32,
        interp: impl ExactSizeIterator<Item = (u64, u64)>,
        end: WalkEnd,
        ustack: &mut Vec<u64>,
    ) {
        self.counters.count_end(end);
        if interp.len() == 0 {
            return;
        }
        let share = (NAMERS_BUDGET / self.procs.len().max(1)).clamp(MIN_NAMER_BUDGET, namer::DEFAULT_BUDGET);
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        p.namer.budget = share;
        self.counters.frames.add(interp.len() as u64);
        self.frames.clear();
        // hit, read, error: added to the counters once per record.
        let mut outcomes = [0u64; 3];
        for (w, instr) in interp {
            let f = FrameWord::decode(w);
            if f.kind != KIND_CPYTHON {
                continue;
            }
            let word = match p.named.get(&(f.code, instr)) {
                Some(&w) => {
                    outcomes[0] += 1;
                    w
                }
                None => match p.namer.frame(f.code, instr) {
                    Ok(fr) => {
                        outcomes[1] += 1;
                        let func = Function { name: fr.name, file: fr.file, frame_type: "cpython" };
                        let w = functions::word(self.functions.id(func), fr.line);
                        if p.named.len() >= MAX_NAMED_PER_PROCESS {
                            p.named.clear();
                        }
                        p.named.insert((f.code, instr), w);
                        w
                    }
                    // Not cached: the next record may find it readable.
                    Err(_) => {
                        outcomes[2] += 1;
                        functions::word(self.functions.id(unknown()), 0)
                    }
                },
            };
            self.frames.push(Named { word, entry: f.entry });
        }
        for (c, n) in self.counters.lookups.iter().zip(outcomes) {
            if n > 0 {
                c.add(n);
            }
        }
        let ranges = &p.eval_ranges;
        merge::merge(ustack, &self.frames, |pc| ranges.iter().any(|&(s, e)| s <= pc && pc < e), &mut self.merged);
        std::mem::swap(ustack, &mut self.merged);
    }
}

/// The function of a frame whose code object could not be read.
fn unknown() -> Function {
    Function { name: Arc::from("[unknown]"), file: Arc::from(""), frame_type: "cpython" }
}
