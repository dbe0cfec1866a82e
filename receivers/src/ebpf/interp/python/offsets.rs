//! Byte offsets of the CPython structs the BPF walker and the namer read.
//!
//! 3.9 to 3.12 (x86_64, release builds with the GIL): constant tables,
//! checked against each version's headers by the `offsets_match_headers`
//! test. 3.13 and later: read from the `_Py_DebugOffsets` table CPython
//! keeps at the start of `_PyRuntime` ([`from_debug_offsets`]), whose
//! layout itself changes between minor versions (3.13 and 3.14 are known).

/// Byte offsets of the CPython structs the BPF walker and the namer read.
/// [`NONE`] = absent in this version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PyOffsets {
    // Walk (BPF).
    /// `_PyRuntimeState.interpreters.head`.
    pub runtime_interpreters_head: u16,
    /// `PyInterpreterState.next`.
    pub interp_next: u16,
    /// 3.9/3.10 `tstate_head`; 3.11+ `threads.head`.
    pub interp_threads_head: u16,
    pub tstate_next: u16,
    /// `unsigned long thread_id` (`pthread_self()`).
    pub tstate_thread_id: u16,
    /// 3.11+; [`NONE`] before.
    pub tstate_native_thread_id: u16,
    /// 3.9/3.10 `frame` (`PyFrameObject*`); 3.11/3.12 `cframe`
    /// (`_PyCFrame*`); 3.13+ `current_frame` (`_PyInterpreterFrame*`).
    pub tstate_frame: u16,
    /// 3.11/3.12 `_PyCFrame.current_frame`; [`NONE`] otherwise.
    pub cframe_current_frame: u16,
    /// `f_back` (3.9/3.10) / `previous`.
    pub frame_previous: u16,
    /// `f_code` / `f_executable` (3.13+; a tagged `_PyStackRef` in 3.14+,
    /// low bit set for a deferred reference).
    pub frame_code: u16,
    /// 3.9/3.10 `f_lasti` (int); 3.11/3.12 `prev_instr`; 3.13+ `instr_ptr`.
    pub frame_instr: u16,
    /// 3.11+ `char owner`; [`NONE`] before.
    pub frame_owner: u16,
    /// 3.11 only (`bool is_entry`); [`NONE`] otherwise.
    pub frame_is_entry: u16,
    // Names (user space).
    pub code_filename: u16,
    pub code_name: u16,
    /// 3.11+; [`NONE`] before.
    pub code_qualname: u16,
    pub code_firstlineno: u16,
    /// `co_linetable`; 3.9: `co_lnotab`.
    pub code_linetable: u16,
    /// `offsetof(PyCodeObject, co_code_adaptive)`, 3.11+; [`NONE`] before.
    pub code_adaptive: u16,
    /// `PyASCIIObject.state` (bit field word: kind, compact, ascii).
    pub unicode_state: u16,
    /// `PyASCIIObject.length` (code points).
    pub unicode_length: u16,
    /// `sizeof(PyASCIIObject)`: where a compact ASCII string's data starts.
    pub ascii_data: u16,
    /// `sizeof(PyCompactUnicodeObject)`: where other compact strings' data starts.
    pub compact_data: u16,
    /// `PyBytesObject.ob_base.ob_size`.
    pub bytes_size: u16,
    /// `PyBytesObject.ob_sval`.
    pub bytes_data: u16,
}

/// An offset absent in a version.
pub(crate) const NONE: u16 = 0xffff;

/// The constant table of a version before 3.13 (those have no
/// `_Py_DebugOffsets`); `None` for versions it does not cover.
pub(crate) fn for_version(version: (u8, u8)) -> Option<PyOffsets> {
    match version {
        (3, 9) => Some(PY_3_9),
        (3, 10) => Some(PY_3_10),
        (3, 11) => Some(PY_3_11),
        (3, 12) => Some(PY_3_12),
        _ => None,
    }
}

const PY_3_9: PyOffsets = PyOffsets {
    runtime_interpreters_head: 32,
    interp_next: 0,
    interp_threads_head: 8,
    tstate_next: 8,
    tstate_thread_id: 176,
    tstate_native_thread_id: NONE,
    tstate_frame: 24,
    cframe_current_frame: NONE,
    frame_previous: 24,
    frame_code: 32,
    frame_instr: 104,
    frame_owner: NONE,
    frame_is_entry: NONE,
    code_filename: 104,
    code_name: 112,
    code_qualname: NONE,
    code_firstlineno: 40,
    code_linetable: 120,
    code_adaptive: NONE,
    unicode_state: 32,
    unicode_length: 16,
    ascii_data: 48,
    compact_data: 72,
    bytes_size: 16,
    bytes_data: 32,
};

/// 3.10 moved `f_lasti` (now after `f_stackdepth`).
const PY_3_10: PyOffsets = PyOffsets { frame_instr: 96, ..PY_3_9 };

const PY_3_11: PyOffsets = PyOffsets {
    runtime_interpreters_head: 40,
    interp_next: 0,
    interp_threads_head: 16,
    tstate_next: 8,
    tstate_thread_id: 152,
    tstate_native_thread_id: 160,
    tstate_frame: 56,
    cframe_current_frame: 8,
    frame_previous: 48,
    frame_code: 32,
    frame_instr: 56,
    frame_owner: 69,
    frame_is_entry: 68,
    code_filename: 112,
    code_name: 120,
    code_qualname: 128,
    code_firstlineno: 72,
    code_linetable: 136,
    code_adaptive: 184,
    unicode_state: 32,
    unicode_length: 16,
    ascii_data: 48,
    compact_data: 72,
    bytes_size: 16,
    bytes_data: 32,
};

const PY_3_12: PyOffsets = PyOffsets {
    runtime_interpreters_head: 40,
    interp_next: 0,
    interp_threads_head: 72,
    tstate_next: 8,
    tstate_thread_id: 136,
    tstate_native_thread_id: 144,
    tstate_frame: 56,
    cframe_current_frame: 0,
    frame_previous: 8,
    frame_code: 0,
    frame_instr: 56,
    frame_owner: 70,
    frame_is_entry: NONE,
    code_filename: 112,
    code_name: 120,
    code_qualname: 128,
    code_firstlineno: 68,
    code_linetable: 136,
    code_adaptive: 192,
    unicode_state: 32,
    unicode_length: 16,
    // 3.12 dropped `wstr` from PyASCIIObject and `wstr_length` from
    // PyCompactUnicodeObject.
    ascii_data: 40,
    compact_data: 56,
    bytes_size: 16,
    bytes_data: 32,
};

/// `_PyInterpreterFrame.owner` of the frames an eval call pushes to mark
/// its C entry (`FRAME_OWNED_BY_CSTACK`, 3.12+): a walker skips them (their
/// code is an internal shim), and each one is where a native
/// `_PyEval_EvalFrameDefault` frame sits in the native stack.
pub(crate) fn cstack_owner(version: (u8, u8)) -> Option<u8> {
    match version {
        (3, 12) | (3, 13) => Some(3),
        // 3.14 inserted FRAME_OWNED_BY_INTERPRETER before it.
        (3, 14) => Some(4),
        _ => None,
    }
}

/// `_Py_DebugOffsets.cookie`.
pub(crate) const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";

/// Bytes of `_Py_DebugOffsets` that [`from_debug_offsets`] may need (the
/// longest known layout, 3.14's).
pub(crate) const DEBUG_OFFSETS_MAX: usize = LAYOUT_3_14.words() * 8;

/// What a `_Py_DebugOffsets` table says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DebugOffsets {
    /// `PY_VERSION_HEX`.
    pub version_hex: u32,
    /// `sizeof(_PyRuntimeState)` (the `_PyRuntime` symbol's size, when it has one).
    pub runtime_size: u64,
    pub offsets: PyOffsets,
}

/// Why a `_Py_DebugOffsets` table was not taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LayoutError {
    #[error("no _Py_DebugOffsets cookie at the start of _PyRuntime")]
    NoCookie,
    #[error("_Py_DebugOffsets is cut short ({0} bytes)")]
    Short(usize),
    #[error("_Py_DebugOffsets of Python {}.{} has a layout this reader does not know", .0 >> 24, (.0 >> 16) & 0xff)]
    UnknownLayout(u32),
    #[error("_Py_DebugOffsets of pre-release Python {0:#x}: its layout is not fixed before the release candidates")]
    PreRelease(u32),
    #[error("free-threaded CPython (Py_GIL_DISABLED): its objects and frames differ")]
    FreeThreaded,
    #[error("_Py_DebugOffsets field {0} is out of range")]
    BadField(&'static str),
}

/// A `_Py_DebugOffsets` layout: its groups of `uint64_t` fields, in order,
/// after `cookie`, `version` and `free_threaded`. Fields are named as in
/// CPython's header.
struct Layout(&'static [(&'static str, &'static [&'static str])]);

impl Layout {
    /// Words of the whole table, the cookie's 8 bytes as one.
    const fn words(&self) -> usize {
        let mut n = 3;
        let mut i = 0;
        while i < self.0.len() {
            n += self.0[i].1.len();
            i += 1;
        }
        n
    }

    /// Word index of `group.field`.
    fn word(&self, group: &str, field: &str) -> Option<usize> {
        let mut at = 3;
        for (g, fields) in self.0 {
            if *g == group {
                return fields.iter().position(|f| *f == field).map(|i| at + i);
            }
            at += fields.len();
        }
        None
    }
}

/// Include/internal/pycore_runtime.h of 3.13.
const LAYOUT_3_13: Layout = Layout(&[
    ("runtime_state", &["size", "finalizing", "interpreters_head"]),
    (
        "interpreter_state",
        &[
            "size",
            "id",
            "next",
            "threads_head",
            "gc",
            "imports_modules",
            "sysdict",
            "builtins",
            "ceval_gil",
            "gil_runtime_state",
            "gil_runtime_state_enabled",
            "gil_runtime_state_locked",
            "gil_runtime_state_holder",
        ],
    ),
    (
        "thread_state",
        &[
            "size",
            "prev",
            "next",
            "interp",
            "current_frame",
            "thread_id",
            "native_thread_id",
            "datastack_chunk",
            "status",
        ],
    ),
    ("interpreter_frame", &["size", "previous", "executable", "instr_ptr", "localsplus", "owner"]),
    (
        "code_object",
        &[
            "size",
            "filename",
            "name",
            "qualname",
            "linetable",
            "firstlineno",
            "argcount",
            "localsplusnames",
            "localspluskinds",
            "co_code_adaptive",
        ],
    ),
    ("pyobject", &["size", "ob_type"]),
    ("type_object", &["size", "tp_name", "tp_repr", "tp_flags"]),
    ("tuple_object", &["size", "ob_item", "ob_size"]),
    ("list_object", &["size", "ob_item", "ob_size"]),
    ("dict_object", &["size", "ma_keys", "ma_values"]),
    ("float_object", &["size", "ob_fval"]),
    ("long_object", &["size", "lv_tag", "ob_digit"]),
    ("bytes_object", &["size", "ob_size", "ob_sval"]),
    ("unicode_object", &["size", "state", "length", "asciiobject_size"]),
    ("gc", &["size", "collecting"]),
]);

/// Include/internal/pycore_debug_offsets.h of 3.14 (760 bytes).
const LAYOUT_3_14: Layout = Layout(&[
    ("runtime_state", &["size", "finalizing", "interpreters_head"]),
    (
        "interpreter_state",
        &[
            "size",
            "id",
            "next",
            "threads_head",
            "threads_main",
            "gc",
            "imports_modules",
            "sysdict",
            "builtins",
            "ceval_gil",
            "gil_runtime_state",
            "gil_runtime_state_enabled",
            "gil_runtime_state_locked",
            "gil_runtime_state_holder",
            "code_object_generation",
            "tlbc_generation",
        ],
    ),
    (
        "thread_state",
        &[
            "size",
            "prev",
            "next",
            "interp",
            "current_frame",
            "thread_id",
            "native_thread_id",
            "datastack_chunk",
            "status",
        ],
    ),
    (
        "interpreter_frame",
        &["size", "previous", "executable", "instr_ptr", "localsplus", "owner", "stackpointer", "tlbc_index"],
    ),
    (
        "code_object",
        &[
            "size",
            "filename",
            "name",
            "qualname",
            "linetable",
            "firstlineno",
            "argcount",
            "localsplusnames",
            "localspluskinds",
            "co_code_adaptive",
            "co_tlbc",
        ],
    ),
    ("pyobject", &["size", "ob_type"]),
    ("type_object", &["size", "tp_name", "tp_repr", "tp_flags"]),
    ("tuple_object", &["size", "ob_item", "ob_size"]),
    ("list_object", &["size", "ob_item", "ob_size"]),
    ("set_object", &["size", "used", "table", "mask"]),
    ("dict_object", &["size", "ma_keys", "ma_values"]),
    ("float_object", &["size", "ob_fval"]),
    ("long_object", &["size", "lv_tag", "ob_digit"]),
    ("bytes_object", &["size", "ob_size", "ob_sval"]),
    ("unicode_object", &["size", "state", "length", "asciiobject_size"]),
    ("gc", &["size", "collecting"]),
    ("gen_object", &["size", "gi_name", "gi_iframe", "gi_frame_state"]),
    ("llist_node", &["next", "prev"]),
    (
        "debugger_support",
        &[
            "eval_breaker",
            "remote_debugger_support",
            "remote_debugging_enabled",
            "debugger_pending_call",
            "debugger_script_path",
            "debugger_script_path_size",
        ],
    ),
]);

/// Reads a `_Py_DebugOffsets` table (the first bytes of `_PyRuntime`, as
/// the binary's initialized data holds them; at most
/// [`DEBUG_OFFSETS_MAX`] are looked at). Every offset is checked to lie
/// inside its struct's reported size and to fit a `u16`.
pub(crate) fn from_debug_offsets(blob: &[u8]) -> Result<DebugOffsets, LayoutError> {
    if blob.len() < 24 {
        return Err(LayoutError::Short(blob.len()));
    }
    if &blob[..8] != DEBUG_COOKIE {
        return Err(LayoutError::NoCookie);
    }
    let word = |i: usize| blob.get(i * 8..i * 8 + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
    let version_hex = u32::try_from(word(1).unwrap_or_default()).map_err(|_| LayoutError::BadField("version"))?;
    let layout = match (version_hex >> 24, (version_hex >> 16) & 0xff) {
        (3, 13) => &LAYOUT_3_13,
        (3, 14) => {
            // PY_RELEASE_LEVEL: 0xA alpha, 0xB beta, 0xC candidate, 0xF final.
            if (version_hex >> 4) & 0xf < 0xc {
                return Err(LayoutError::PreRelease(version_hex));
            }
            &LAYOUT_3_14
        }
        _ => return Err(LayoutError::UnknownLayout(version_hex)),
    };
    if word(2) != Some(0) {
        return Err(LayoutError::FreeThreaded);
    }
    if blob.len() < layout.words() * 8 {
        return Err(LayoutError::Short(blob.len()));
    }
    // Every (group, field) named below is in both layouts and the blob
    // holds the whole layout; a miss would read as u64::MAX, out of range.
    let get = |group: &str, field: &str| -> u64 { layout.word(group, field).and_then(word).unwrap_or(u64::MAX) };
    // An offset inside its struct (`size` its first word), as a u16.
    let field = |group: &str, name: &'static str| -> Result<u16, LayoutError> {
        let off = get(group, name);
        let size = get(group, "size");
        if off >= size {
            return Err(LayoutError::BadField(name));
        }
        u16::try_from(off).ok().filter(|&v| v != NONE).ok_or(LayoutError::BadField(name))
    };
    let ascii_size = get("unicode_object", "asciiobject_size");
    let ascii_data =
        u16::try_from(ascii_size).ok().filter(|&v| v < 256).ok_or(LayoutError::BadField("asciiobject_size"))?;
    let offsets = PyOffsets {
        runtime_interpreters_head: field("runtime_state", "interpreters_head")?,
        interp_next: field("interpreter_state", "next")?,
        interp_threads_head: field("interpreter_state", "threads_head")?,
        tstate_next: field("thread_state", "next")?,
        tstate_thread_id: field("thread_state", "thread_id")?,
        tstate_native_thread_id: field("thread_state", "native_thread_id")?,
        tstate_frame: field("thread_state", "current_frame")?,
        cframe_current_frame: NONE,
        frame_previous: field("interpreter_frame", "previous")?,
        frame_code: field("interpreter_frame", "executable")?,
        frame_instr: field("interpreter_frame", "instr_ptr")?,
        frame_owner: field("interpreter_frame", "owner")?,
        frame_is_entry: NONE,
        code_filename: field("code_object", "filename")?,
        code_name: field("code_object", "name")?,
        code_qualname: field("code_object", "qualname")?,
        code_firstlineno: field("code_object", "firstlineno")?,
        code_linetable: field("code_object", "linetable")?,
        code_adaptive: field("code_object", "co_code_adaptive")?,
        unicode_state: field("unicode_object", "state")?,
        unicode_length: field("unicode_object", "length")?,
        ascii_data,
        // The table has no sizeof(PyCompactUnicodeObject): since 3.12 it is
        // PyASCIIObject + utf8_length (Py_ssize_t) + utf8 (char*).
        compact_data: ascii_data + 16,
        bytes_size: field("bytes_object", "ob_size")?,
        bytes_data: field("bytes_object", "ob_sval")?,
    };
    Ok(DebugOffsets { version_hex, runtime_size: get("runtime_state", "size"), offsets })
}

#[cfg(test)]
pub(crate) mod layout_tests {
    use super::*;

    /// A table of `layout` as CPython would write it: every field's value
    /// is its word index (so each lies inside `size`, set to 1000).
    fn synthetic(layout: &Layout, version_hex: u32, free_threaded: u64) -> Vec<u8> {
        let mut v = DEBUG_COOKIE.to_vec();
        v.extend_from_slice(&u64::from(version_hex).to_le_bytes());
        v.extend_from_slice(&free_threaded.to_le_bytes());
        let mut at = 3u64;
        for (_, fields) in layout.0 {
            for f in *fields {
                let value = if *f == "size" {
                    1000
                } else if *f == "asciiobject_size" {
                    40
                } else {
                    at
                };
                v.extend_from_slice(&value.to_le_bytes());
                at += 1;
            }
        }
        v
    }

    #[test]
    fn layouts_have_their_headers_sizes() {
        assert_eq!(LAYOUT_3_13.words() * 8, 584);
        assert_eq!(LAYOUT_3_14.words() * 8, 760);
        assert_eq!(DEBUG_OFFSETS_MAX, 760);
    }

    #[test]
    fn reads_each_field_from_its_own_word() {
        let t = from_debug_offsets(&synthetic(&LAYOUT_3_14, 0x030e00f0, 0)).unwrap();
        assert_eq!(t.version_hex, 0x030e00f0);
        // 3.14: interpreter_state starts at word 6; next is its third field.
        assert_eq!(t.offsets.interp_next, 8);
        assert_eq!(t.offsets.interp_threads_head, 9);
        // threads_main, code_object_generation, tlbc_generation shift the rest.
        assert_eq!(t.offsets.tstate_frame, 26);
        assert_eq!(t.offsets.frame_instr, 34);
        assert_eq!(t.offsets.code_adaptive, 48);
        assert_eq!(t.offsets.bytes_data, 76);
        assert_eq!(t.offsets.compact_data, 56);
        let t = from_debug_offsets(&synthetic(&LAYOUT_3_13, 0x030d00f0, 0)).unwrap();
        assert_eq!(t.offsets.tstate_frame, 23);
        assert_eq!(t.offsets.code_adaptive, 43);
        assert_eq!(t.offsets.bytes_data, 66);
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        let ok = synthetic(&LAYOUT_3_13, 0x030d00f0, 0);
        assert!(from_debug_offsets(&ok).is_ok());
        assert_eq!(from_debug_offsets(&ok[..100]), Err(LayoutError::Short(100)));
        assert_eq!(from_debug_offsets(&ok[..3]), Err(LayoutError::Short(3)));
        let mut bad = ok.clone();
        bad[0] = b'y';
        assert_eq!(from_debug_offsets(&bad), Err(LayoutError::NoCookie));
        assert_eq!(from_debug_offsets(&synthetic(&LAYOUT_3_13, 0x030d00f0, 1)), Err(LayoutError::FreeThreaded));
        let e = from_debug_offsets(&synthetic(&LAYOUT_3_14, 0x030f00f0, 0)).unwrap_err();
        assert_eq!(e, LayoutError::UnknownLayout(0x030f00f0));
        assert!(e.to_string().contains("Python 3.15"), "{e}");
        assert_eq!(
            from_debug_offsets(&synthetic(&LAYOUT_3_14, 0x030e00b2, 0)),
            Err(LayoutError::PreRelease(0x030e00b2))
        );
        // An offset past its struct's size.
        let mut bad = ok.clone();
        let w = LAYOUT_3_13.word("thread_state", "current_frame").unwrap();
        bad[w * 8..w * 8 + 8].copy_from_slice(&5000u64.to_le_bytes());
        assert_eq!(from_debug_offsets(&bad), Err(LayoutError::BadField("current_frame")));
    }
}
