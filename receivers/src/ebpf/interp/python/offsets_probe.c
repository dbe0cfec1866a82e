/* Prints, as "field value" lines, the offsets and sizes PyOffsets holds,
   from the CPython headers it is compiled against (-DPy_BUILD_CORE). The
   offsets test compares them with the Rust tables. */
#include <Python.h>
#include <frameobject.h>
#include <stddef.h>
#include <stdio.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#include "internal/pycore_code.h"
#endif

#define P(name, value) printf("%s %ld\n", name, (long)(value))
#define NONE() (-1)

int main(void) {
    P("version_hex", PY_VERSION_HEX);
#ifdef Py_GIL_DISABLED
    P("free_threaded", 1);
#else
    P("free_threaded", 0);
#endif
    P("runtime_interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
    P("interp_next", offsetof(PyInterpreterState, next));
#if PY_VERSION_HEX >= 0x030B0000
    P("interp_threads_head", offsetof(PyInterpreterState, threads.head));
#else
    P("interp_threads_head", offsetof(PyInterpreterState, tstate_head));
#endif
    P("tstate_next", offsetof(PyThreadState, next));
    P("tstate_thread_id", offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX >= 0x030B0000
    P("tstate_native_thread_id", offsetof(PyThreadState, native_thread_id));
#else
    P("tstate_native_thread_id", NONE());
#endif
#if PY_VERSION_HEX >= 0x030D0000
    P("tstate_frame", offsetof(PyThreadState, current_frame));
    P("cframe_current_frame", NONE());
    P("frame_previous", offsetof(_PyInterpreterFrame, previous));
    P("frame_code", offsetof(_PyInterpreterFrame, f_executable));
    P("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
    P("frame_owner", offsetof(_PyInterpreterFrame, owner));
    P("frame_is_entry", NONE());
#elif PY_VERSION_HEX >= 0x030B0000
    P("tstate_frame", offsetof(PyThreadState, cframe));
    P("cframe_current_frame", offsetof(_PyCFrame, current_frame));
    P("frame_previous", offsetof(_PyInterpreterFrame, previous));
    P("frame_code", offsetof(_PyInterpreterFrame, f_code));
    P("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
    P("frame_owner", offsetof(_PyInterpreterFrame, owner));
#if PY_VERSION_HEX < 0x030C0000
    P("frame_is_entry", offsetof(_PyInterpreterFrame, is_entry));
#else
    P("frame_is_entry", NONE());
#endif
#else
    P("tstate_frame", offsetof(PyThreadState, frame));
    P("cframe_current_frame", NONE());
    P("frame_previous", offsetof(PyFrameObject, f_back));
    P("frame_code", offsetof(PyFrameObject, f_code));
    P("frame_instr", offsetof(PyFrameObject, f_lasti));
    P("frame_owner", NONE());
    P("frame_is_entry", NONE());
#endif
    P("code_filename", offsetof(PyCodeObject, co_filename));
    P("code_name", offsetof(PyCodeObject, co_name));
#if PY_VERSION_HEX >= 0x030B0000
    P("code_qualname", offsetof(PyCodeObject, co_qualname));
    P("code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
#else
    P("code_qualname", NONE());
    P("code_adaptive", NONE());
#endif
    P("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
#if PY_VERSION_HEX >= 0x030A0000
    P("code_linetable", offsetof(PyCodeObject, co_linetable));
#else
    P("code_linetable", offsetof(PyCodeObject, co_lnotab));
#endif
    P("unicode_state", offsetof(PyASCIIObject, state));
    P("unicode_length", offsetof(PyASCIIObject, length));
    P("ascii_data", sizeof(PyASCIIObject));
    P("compact_data", sizeof(PyCompactUnicodeObject));
    P("bytes_size", offsetof(PyBytesObject, ob_base.ob_size));
    P("bytes_data", offsetof(PyBytesObject, ob_sval));
    return 0;
}
