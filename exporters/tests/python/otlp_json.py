#!/usr/bin/env python3
"""OTLP/JSON on another stack: the official opentelemetry-proto package from
PyPI (1.45.x, profiles v1development, proto v1.10 layout) and protobuf's own
JSON printer and parser (google.protobuf.json_format). Used by
exporters/tests/otlp_json.rs.

Modes (one document per line on stdin, one answer per line on stdout):
  parse   OTLP/JSON ProfilesData in, base64 of the message's protobuf out.
          The parser is strict: an unknown field or a malformed value fails.
  print   base64 protobuf ProfilesData in, the official printer's JSON out.
  serve   an OTLP/HTTP JSON endpoint on 127.0.0.1 (prints `PORT <n>` first):
          every POSTed body (gzip or not) is parsed as above and its protobuf
          printed as one line of base64; answers 200 with the official
          printer's ExportProfilesServiceResponse (--partial N sets
          partial_success.rejected_profiles = N). Stops when stdin closes.

The generic protobuf JSON parser reads every bytes field as base64, while the
OTLP specification writes trace and span ids (and profcol profile ids, as the
Collector does) as hex; `hex_ids_to_base64` converts them before parsing, as
an OTLP-aware reader would.
"""
import base64
import gzip
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2 as svc_pb2
from opentelemetry.proto.profiles.v1development import profiles_pb2


def hex_to_b64(doc, key):
    v = doc.get(key)
    if isinstance(v, str) and v:
        doc[key] = base64.b64encode(bytes.fromhex(v)).decode()


def hex_ids_to_base64(doc):
    for link in doc.get("dictionary", {}).get("linkTable", []):
        hex_to_b64(link, "traceId")
        hex_to_b64(link, "spanId")
    for rp in doc.get("resourceProfiles", []):
        for sp in rp.get("scopeProfiles", []):
            for p in sp.get("profiles", []):
                hex_to_b64(p, "profileId")
    return doc


def parse(text, message):
    doc = hex_ids_to_base64(json.loads(text))
    return json_format.Parse(json.dumps(doc), message, ignore_unknown_fields=False)


def out(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def serve(partial):
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            try:
                req = parse(body, svc_pb2.ExportProfilesServiceRequest())
            except Exception as e:  # the sender hears why
                self.send_response(400)
                self.end_headers()
                self.wfile.write(str(e).encode())
                with lock:
                    out("ERROR " + str(e).replace("\n", " "))
                return
            with lock:
                out(base64.b64encode(req.SerializeToString()).decode())
            resp = svc_pb2.ExportProfilesServiceResponse()
            if partial:
                resp.partial_success.rejected_profiles = partial
                resp.partial_success.error_message = "rejected by the Python server"
            answer = json_format.MessageToJson(resp, indent=None).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    out(f"PORT {server.server_address[1]}")
    sys.stdin.read()
    server.shutdown()


def main():
    mode = sys.argv[1]
    if mode == "serve":
        partial = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--partial" else 0
        serve(partial)
        return
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        if mode == "parse":
            msg = parse(line, profiles_pb2.ProfilesData())
            out(base64.b64encode(msg.SerializeToString()).decode())
        elif mode == "print":
            msg = profiles_pb2.ProfilesData.FromString(base64.b64decode(line))
            out(json_format.MessageToJson(msg, indent=None))
        else:
            sys.exit(f"unknown mode {mode!r}: parse, print or serve")


if __name__ == "__main__":
    main()
