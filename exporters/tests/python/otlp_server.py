#!/usr/bin/env python3
"""An OTLP profiles server on another stack: grpcio + the official
opentelemetry-proto package from PyPI (1.45.x, profiles v1development, proto
v1.10 layout). Used by exporters/tests/otlp_python_interop.rs and
collector/tests/otlp_retry_rules.rs.

Listens on 127.0.0.1 (port 0 unless --port), prints `PORT <n>` and flushes;
with --http also serves OTLP/HTTP (POST /v1development/profiles, protobuf or
JSON, gzip or not) and prints `HTTP_PORT <n>`. Every request is decoded by
Python's protobuf runtime; the server prints one JSON line per request it
answers (request number, answer, monotonic time, samples counted as
observations by profcol's rule, Sample messages, resolved leaf
function names, each resource's service.name, each scope's name/version,
the attribute keys samples carry) and writes accepted requests, re-serialized by Python, to
--out/<n>.pb. Options:
  --unavailable-first N  answer the first N requests UNAVAILABLE with a
                         google.rpc.RetryInfo of 1 s in grpc-status-details-bin
  --partial N            answer with partial_success.rejected_profiles = N
  --script A,B,...       answer the k-th request (gRPC and HTTP counted
                         together) with the k-th answer, then `ok`:
                           ok                  accept
                           partial:N           accept, partial_success rejecting N profiles
                           exhausted           gRPC RESOURCE_EXHAUSTED, no RetryInfo
                           exhausted-retry:S   gRPC RESOURCE_EXHAUSTED + RetryInfo of S seconds
                           unavailable-retry:S gRPC UNAVAILABLE + RetryInfo of S seconds
                           http:CODE:S         HTTP CODE with Retry-After: S (S empty: no header)
Stops when stdin closes.
"""
import argparse
import gzip
import http.server
import json
import os
import sys
import threading
import time
from concurrent import futures

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.profiles.v1development import (
    profiles_service_pb2 as svc_pb2,
    profiles_service_pb2_grpc as svc_grpc,
)


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, wire, payload):
    key = varint((num << 3) | wire)
    if wire == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def retry_info_status(code, message, seconds):
    duration = field(1, 0, varint(seconds))
    retry_info = field(1, 2, duration)
    any_msg = field(1, 2, b"type.googleapis.com/google.rpc.RetryInfo") + field(2, 2, retry_info)
    return field(1, 0, varint(code)) + field(2, 2, message.encode()) + field(3, 2, any_msg)


def observations(sample, counts_events):
    """A Sample's observations (docs/CONFIG.md): the sum of its values where
    the sample type's unit is `count`, else its number of data points; the
    number of its timestamps when it has no values; 1 when it has neither."""
    if counts_events and sample.values:
        return sum(max(v, 0) for v in sample.values)
    return len(sample.values) or len(sample.timestamps_unix_nano) or 1


def summary(request):
    """Samples (observations), Sample messages and resolved leaf function
    names of a request."""
    d = request.dictionary
    samples = 0
    sample_messages = 0
    leaves = {}
    for rp in request.resource_profiles:
        for sp in rp.scope_profiles:
            for p in sp.profiles:
                counts_events = d.string_table[p.sample_type.unit_strindex] == "count"
                for s in p.samples:
                    samples += observations(s, counts_events)
                    sample_messages += 1
                    stack = d.stack_table[s.stack_index]
                    if stack.location_indices:
                        loc = d.location_table[stack.location_indices[0]]
                        if loc.lines:
                            fn = d.function_table[loc.lines[0].function_index]
                            name = d.string_table[fn.name_strindex]
                            leaves[name] = leaves.get(name, 0) + 1
    return samples, sample_messages, leaves


def identity(request):
    """What backends group by: each resource's service.name ("" when it has
    none), each scope's "name/version", and the attribute keys samples carry."""
    d = request.dictionary
    services, scopes, keys = [], [], set()
    for rp in request.resource_profiles:
        names = [a.value.string_value for a in rp.resource.attributes if a.key == "service.name"]
        services.append(names[0] if names else "")
        for sp in rp.scope_profiles:
            scopes.append("%s/%s" % (sp.scope.name, sp.scope.version))
            for p in sp.profiles:
                for s in p.samples:
                    for i in s.attribute_indices:
                        keys.add(d.string_table[d.attribute_table[i].key_strindex])
    return services, scopes, sorted(keys)


class Answers:
    """Numbers requests (both protocols) and picks each one's answer."""

    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.n = 0
        script = [a for a in args.script.split(",") if a] if args.script else []
        script = ["unavailable-retry:1"] * args.unavailable_first + script
        self.script = script

    def next(self):
        with self.lock:
            self.n += 1
            n = self.n
        answer = self.script[n - 1] if n <= len(self.script) else "ok"
        if answer == "ok" and self.args.partial:
            answer = "partial:%d" % self.args.partial
        return n, answer

    def report(self, n, answer, request):
        samples, sample_messages, leaves = summary(request)
        if self.args.out and (answer == "ok" or answer.startswith("partial:")):
            with open(os.path.join(self.args.out, "%06d.pb" % n), "wb") as f:
                f.write(request.SerializeToString())
        services, scopes, sample_keys = identity(request)
        line = {"request": n, "answer": answer, "t": time.monotonic(), "samples": samples,
                "sample_messages": sample_messages, "leaves": leaves, "service_names": services,
                "scopes": scopes, "sample_attribute_keys": sample_keys}
        print(json.dumps(line), flush=True)

    @staticmethod
    def response(answer):
        resp = svc_pb2.ExportProfilesServiceResponse()
        if answer.startswith("partial:"):
            resp.partial_success.rejected_profiles = int(answer.split(":")[1])
            resp.partial_success.error_message = "python says: some profiles rejected"
        return resp


class Service(svc_grpc.ProfilesServiceServicer):
    def __init__(self, answers):
        self.answers = answers

    def Export(self, request, context):
        n, answer = self.answers.next()
        self.answers.report(n, answer, request)
        kind, _, arg = answer.partition(":")
        if kind in ("exhausted-retry", "unavailable-retry"):
            code = grpc.StatusCode.RESOURCE_EXHAUSTED if kind == "exhausted-retry" else grpc.StatusCode.UNAVAILABLE
            status = retry_info_status(code.value[0], "slow down", int(arg))
            context.set_trailing_metadata((("grpc-status-details-bin", status),))
            context.abort(code, "slow down")
        if kind == "exhausted":
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "this request can never fit")
        return self.answers.response(answer)


def http_handler(answers):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def reply(self, code, ctype, body, headers=()):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            is_json = self.headers.get("Content-Type", "").startswith("application/json")
            request = svc_pb2.ExportProfilesServiceRequest()
            if is_json:
                json_format.Parse(body, request)
            else:
                request.ParseFromString(body)
            n, answer = answers.next()
            answers.report(n, answer, request)
            if answer.startswith("http:"):
                _, code, secs = answer.split(":")
                headers = [("Retry-After", secs)] if secs else []
                status = field(1, 0, varint(8)) + field(2, 2, b"throttled")
                return self.reply(int(code), "application/x-protobuf", status, headers)
            resp = answers.response(answer)
            if is_json:
                return self.reply(200, "application/json", json_format.MessageToJson(resp).encode())
            return self.reply(200, "application/x-protobuf", resp.SerializeToString())

    return Handler


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--out", default="")
    ap.add_argument("--unavailable-first", type=int, default=0)
    ap.add_argument("--partial", type=int, default=0)
    ap.add_argument("--script", default="")
    ap.add_argument("--http", action="store_true")
    args = ap.parse_args()
    answers = Answers(args)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        options=[("grpc.max_receive_message_length", 64 << 20)],
    )
    svc_grpc.add_ProfilesServiceServicer_to_server(Service(answers), server)
    port = server.add_insecure_port("127.0.0.1:%d" % args.port)
    server.start()
    print("PORT %d" % port, flush=True)
    if args.http:
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http_handler(answers))
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        print("HTTP_PORT %d" % httpd.server_address[1], flush=True)
    sys.stdin.read()
    server.stop(grace=2).wait()


if __name__ == "__main__":
    main()
