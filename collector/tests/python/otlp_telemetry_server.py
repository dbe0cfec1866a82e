#!/usr/bin/env python3
"""An OTLP server for profcol's own telemetry, on the official protos
(grpcio + opentelemetry-proto from PyPI): the gRPC metrics, logs and trace
services, and OTLP/HTTP (POST /v1/metrics, /v1/logs, /v1/traces, protobuf).
Used by collector/tests/self_telemetry.rs.

Listens on 127.0.0.1, prints `PORT <grpc port>` and `HTTP_PORT <http port>`,
then one JSON line per request it accepts:
  {"signal": "metrics" | "logs" | "traces", "transport": "grpc" | "http",
   "t": <monotonic seconds>, "body": <the request as protobuf's JSON mapping,
   field names as in the .proto>}
Stops when stdin closes.
"""
import http.server
import json
import sys
import threading
import time
from concurrent import futures

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as logs_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc as logs_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as metrics_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as metrics_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as trace_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as trace_grpc

LOCK = threading.Lock()


def emit(signal, transport, request):
    body = json_format.MessageToDict(request, preserving_proto_field_name=True)
    line = json.dumps({"signal": signal, "transport": transport, "t": time.monotonic(), "body": body})
    with LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Metrics(metrics_grpc.MetricsServiceServicer):
    def Export(self, request, context):
        emit("metrics", "grpc", request)
        return metrics_pb2.ExportMetricsServiceResponse()


class Logs(logs_grpc.LogsServiceServicer):
    def Export(self, request, context):
        emit("logs", "grpc", request)
        return logs_pb2.ExportLogsServiceResponse()


class Traces(trace_grpc.TraceServiceServicer):
    def Export(self, request, context):
        emit("traces", "grpc", request)
        return trace_pb2.ExportTraceServiceResponse()


HTTP_ROUTES = {
    "/v1/metrics": ("metrics", metrics_pb2.ExportMetricsServiceRequest, metrics_pb2.ExportMetricsServiceResponse),
    "/v1/logs": ("logs", logs_pb2.ExportLogsServiceRequest, logs_pb2.ExportLogsServiceResponse),
    "/v1/traces": ("traces", trace_pb2.ExportTraceServiceRequest, trace_pb2.ExportTraceServiceResponse),
}


class HttpHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        route = HTTP_ROUTES.get(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if route is None or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_response(404 if route is None else 415)
            self.end_headers()
            return
        signal, req_type, resp_type = route
        req = req_type()
        req.ParseFromString(body)
        emit(signal, "http", req)
        out = resp_type().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    metrics_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    logs_grpc.add_LogsServiceServicer_to_server(Logs(), server)
    trace_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HttpHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    with LOCK:
        print(f"PORT {port}", flush=True)
        print(f"HTTP_PORT {httpd.server_address[1]}", flush=True)
    sys.stdin.read()
    httpd.shutdown()
    server.stop(0)


if __name__ == "__main__":
    main()
