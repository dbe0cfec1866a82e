"""redact_paths: a profcol processor plugin in Python (componentize-py).

Rewrites the file paths of a batch (source files of functions, binaries of
mappings) with a regex, e.g. to take user names out of /home/NAME/... before
profiles leave the host:

    processors:
      wasm/redact_paths:
        path: examples/plugins/out/redact_paths.wasm
        config: { pattern: "^/home/[^/]+/", replacement: "/home/~/" }
        call_timeout: 5s

A changed path is added to the string table and only the function or
mapping that names it points at it, so a function name that happens to
equal a path is left alone; entry 0 of every table stays the zero value.
"""

import json
import re

from componentize_py_types import Err
from google.protobuf.message import DecodeError
from opentelemetry.proto.profiles.v1development.profiles_pb2 import ProfilesData

from wit_world import exports
from wit_world.imports import host
from wit_world.imports.types import ErrorKind, PluginError

# The plugin's state: one instance of the component serves one call at a time.
_pattern = None
_replacement = ""


class ProcessBatch(exports.ProcessBatch):
    def init(self, config: str) -> None:
        global _pattern, _replacement
        try:
            cfg = json.loads(config) or {}
        except ValueError as e:
            raise Err(f"config is not JSON: {e}")
        if not isinstance(cfg, dict):
            raise Err("config: a map with `pattern` and `replacement` is expected")
        unknown = sorted(set(cfg) - {"pattern", "replacement"})
        if unknown:
            raise Err(f"config: unknown field `{unknown[0]}`, expected `pattern` or `replacement`")
        pattern = cfg.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise Err("config: `pattern` (a regex of the path parts to replace) is required")
        replacement = cfg.get("replacement", "<redacted>")
        if not isinstance(replacement, str):
            raise Err("config: `replacement` must be a string")
        try:
            _pattern = re.compile(pattern)
        except re.error as e:
            raise Err(f"config: pattern: {e}")
        _replacement = replacement

    def process(self, batch: bytes):
        if _pattern is None:
            raise Err(PluginError(ErrorKind.PERMANENT, "called before init succeeded"))
        data = ProfilesData()
        try:
            data.ParseFromString(batch)
        except DecodeError as e:
            raise Err(PluginError(ErrorKind.PERMANENT, f"batch does not decode: {e}"))
        strings = data.dictionary.string_table
        # Old string index -> index of its redacted form (each path once).
        redacted = {}
        changed = 0

        def redact(i: int) -> int:
            nonlocal changed
            if i <= 0 or i >= len(strings):
                return i  # string 0 is "" in every valid batch; others are the host's to refuse
            if i not in redacted:
                new = _pattern.sub(_replacement, strings[i])
                if new == strings[i]:
                    redacted[i] = i
                else:
                    strings.append(new)
                    redacted[i] = len(strings) - 1
                    changed += 1
            return redacted[i]

        d = data.dictionary
        for table in (d.function_table, d.mapping_table):
            for entry in table[1:]:
                entry.filename_strindex = redact(entry.filename_strindex)
        if changed:
            host.counter_add("paths_redacted", changed)
        return data.SerializeToString()
