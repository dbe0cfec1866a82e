"""Native tests of redact_paths' logic (run by .ci/plugins.sh): app.py under
the machine's CPython, with the WIT bindings componentize-py generates and
the host's counter recorded. The component itself runs in the host's
end-to-end test."""

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
WIT = os.path.join(HERE, "..", "..", "..", "plugins", "wit")

_bindings = tempfile.mkdtemp(prefix="redact_paths-bindings-")
atexit.register(shutil.rmtree, _bindings, ignore_errors=True)
subprocess.run(["componentize-py", "-d", WIT, "-w", "processor", "bindings", _bindings], check=True, stdout=subprocess.DEVNULL)
sys.path[:0] = [_bindings, HERE]

from componentize_py_types import Err  # noqa: E402
from opentelemetry.proto.profiles.v1development.profiles_pb2 import ProfilesData  # noqa: E402
from wit_world.imports import host  # noqa: E402
from wit_world.imports.types import ErrorKind  # noqa: E402

import app  # noqa: E402

COUNTERS = {}
host.counter_add = lambda name, value: COUNTERS.__setitem__(name, COUNTERS.get(name, 0) + value)


def batch() -> ProfilesData:
    """A function and a mapping under /home/alice, a function named like a path."""
    d = ProfilesData()
    s = d.dictionary.string_table
    s.extend(["", "main", "/home/alice/src/app.c", "/home/alice/bin/app", "/home/alice/src/app.c", "/usr/lib/libc.so.6"])
    d.dictionary.function_table.add()
    d.dictionary.function_table.add(name_strindex=1, filename_strindex=2)
    # Its name is the same string as a path: names are not paths, it stays.
    d.dictionary.function_table.add(name_strindex=4, filename_strindex=2)
    d.dictionary.mapping_table.add()
    d.dictionary.mapping_table.add(filename_strindex=3)
    d.dictionary.mapping_table.add(filename_strindex=5)
    return d


def process(config: dict, data: ProfilesData) -> ProfilesData:
    p = app.ProcessBatch()
    p.init(json.dumps(config))
    out = ProfilesData()
    out.ParseFromString(p.process(data.SerializeToString()))
    return out


class RedactPaths(unittest.TestCase):
    def test_paths_are_rewritten_names_and_entry_zero_are_not(self):
        COUNTERS.clear()
        out = process({"pattern": "^/home/[^/]+/", "replacement": "/home/~/"}, batch())
        s, d = out.dictionary.string_table, out.dictionary
        files = [s[f.filename_strindex] for f in d.function_table]
        self.assertEqual(files, ["", "/home/~/src/app.c", "/home/~/src/app.c"])
        self.assertEqual([s[f.name_strindex] for f in d.function_table], ["", "main", "/home/alice/src/app.c"])
        self.assertEqual([s[m.filename_strindex] for m in d.mapping_table], ["", "/home/~/bin/app", "/usr/lib/libc.so.6"])
        self.assertEqual(s[0], "")
        self.assertEqual(COUNTERS, {"paths_redacted": 2})

    def test_a_pattern_matching_the_empty_string_leaves_entry_zero(self):
        out = process({"pattern": "^"}, batch())
        d = out.dictionary
        self.assertEqual(d.function_table[0].filename_strindex, 0)
        self.assertEqual(d.mapping_table[0].filename_strindex, 0)
        self.assertEqual(d.string_table[0], "")
        self.assertEqual(d.string_table[d.mapping_table[2].filename_strindex], "<redacted>/usr/lib/libc.so.6")

    def test_bad_config_and_bad_batch(self):
        p = app.ProcessBatch()
        for config, words in [("null", "`pattern`"), ('{"pattern": "("}', "pattern"), ('{"pattern": "x", "x": 1}', "unknown field `x`"), ("{", "not JSON")]:
            with self.assertRaises(Err) as e:
                p.init(config)
            self.assertIn(words, e.exception.value)
        p.init('{"pattern": "x"}')
        with self.assertRaises(Err) as e:
            p.process(b"\xff\xff\xff")
        self.assertEqual(e.exception.value.kind, ErrorKind.PERMANENT)


if __name__ == "__main__":
    unittest.main()
