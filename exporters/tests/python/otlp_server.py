#!/usr/bin/env python3
"""An OTLP profiles gRPC server on another stack: grpcio + the official
opentelemetry-proto package from PyPI (1.45.x, profiles v1development, proto
v1.10 layout). Used by exporters/tests/otlp_python_interop.rs.

Listens on 127.0.0.1 (port 0 unless --port), prints `PORT <n>` and flushes.
Every request is decoded by Python's protobuf runtime; the server prints one
JSON line per request (Sample messages, resolved leaf function names) and writes the
request, re-serialized by Python, to --out/<n>.pb. Options:
  --unavailable-first N  answer the first N requests UNAVAILABLE with a
                         google.rpc.RetryInfo of 1 s in grpc-status-details-bin
  --partial N            answer with partial_success.rejected_profiles = N
Stops when stdin closes.
"""
import argparse
import json
import os
import sys
import threading
from concurrent import futures

import grpc
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


class Service(svc_grpc.ProfilesServiceServicer):
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.n = 0
        self.refused = 0

    def Export(self, request, context):
        with self.lock:
            if self.refused < self.args.unavailable_first:
                self.refused += 1
                context.set_trailing_metadata(
                    (("grpc-status-details-bin", retry_info_status(14, "warming up", 1)),)
                )
                context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
            self.n += 1
            n = self.n
        d = request.dictionary
        sample_messages = 0
        leaves = {}
        for rp in request.resource_profiles:
            for sp in rp.scope_profiles:
                for p in sp.profiles:
                    for s in p.samples:
                        sample_messages += 1
                        stack = d.stack_table[s.stack_index]
                        if stack.location_indices:
                            loc = d.location_table[stack.location_indices[0]]
                            if loc.lines:
                                fn = d.function_table[loc.lines[0].function_index]
                                name = d.string_table[fn.name_strindex]
                                leaves[name] = leaves.get(name, 0) + 1
        if self.args.out:
            with open(os.path.join(self.args.out, "%06d.pb" % n), "wb") as f:
                f.write(request.SerializeToString())
        print(json.dumps({"request": n, "sample_messages": sample_messages, "leaves": leaves}), flush=True)
        resp = svc_pb2.ExportProfilesServiceResponse()
        if self.args.partial:
            resp.partial_success.rejected_profiles = self.args.partial
            resp.partial_success.error_message = "python says: some profiles rejected"
        return resp


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--out", default="")
    ap.add_argument("--unavailable-first", type=int, default=0)
    ap.add_argument("--partial", type=int, default=0)
    args = ap.parse_args()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        options=[("grpc.max_receive_message_length", 64 << 20)],
    )
    svc_grpc.add_ProfilesServiceServicer_to_server(Service(args), server)
    port = server.add_insecure_port("127.0.0.1:%d" % args.port)
    server.start()
    print("PORT %d" % port, flush=True)
    sys.stdin.read()
    server.stop(grace=2).wait()


if __name__ == "__main__":
    main()
