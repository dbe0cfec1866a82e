//! STUB for compiling the integration before the real module lands.
#![allow(dead_code)]
use std::path::PathBuf;
use std::sync::Arc;

pub(crate) const NONE: u16 = 0xffff;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct PyOffsets {
    pub runtime_interpreters_head: u16,
    pub interp_next: u16,
    pub interp_threads_head: u16,
    pub tstate_next: u16,
    pub tstate_thread_id: u16,
    pub tstate_native_thread_id: u16,
    pub tstate_frame: u16,
    pub cframe_current_frame: u16,
    pub frame_previous: u16,
    pub frame_code: u16,
    pub frame_instr: u16,
    pub frame_owner: u16,
    pub frame_is_entry: u16,
}

pub(crate) struct PythonProcess {
    pub version: (u8, u8),
    pub runtime_addr: u64,
    pub eval_ranges: Vec<(u64, u64)>,
    pub offsets: PyOffsets,
    pub binary: PathBuf,
}

#[derive(Debug)]
pub(crate) struct DetectError(pub String);

pub(crate) fn detect(_pid: u32) -> Result<Option<PythonProcess>, DetectError> {
    Ok(None)
}

pub(crate) struct PyFrame {
    pub name: Arc<str>,
    pub file: Arc<str>,
    pub line: u32,
}

#[derive(Debug)]
pub(crate) struct NameError;

pub(crate) struct CodeNamer;

impl CodeNamer {
    pub(crate) fn new(_pid: u32, _p: &PythonProcess) -> Self {
        CodeNamer
    }
    pub(crate) fn frame(&mut self, _code: u64, _instr: u64) -> Result<PyFrame, NameError> {
        Err(NameError)
    }
}
