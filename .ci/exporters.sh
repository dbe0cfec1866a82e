#!/usr/bin/env bash
# CI needs for the exporters and the otlp receiver (called by .ci/run):
#   - golang-go: `go tool pprof` opens the pprof exporter's files and pushes
#     (exporters/tests/pprof_export.rs, collector/tests/node_agent.rs);
#   - python3 grpcio + opentelemetry-proto 1.45.x (profiles v1development,
#     proto v1.10 layout): the OTLP server on another stack
#     (exporters/tests/python/otlp_server.py, started by testkit's py_otlp for
#     exporters/tests/otlp_python_interop.rs, collector/tests/otlp_retry_rules.rs
#     and collector/tests/node_agent.rs),
#     and protobuf's official JSON printer and parser, which come with it
#     (exporters/tests/otlp_json.rs, exporters/tests/python/otlp_json.py).
# Idempotent and quiet: installs only what is missing. With CI=true the tests
# fail (not skip) when one of these is missing.
set -euo pipefail

if ! command -v go >/dev/null; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends golang-go >/dev/null
fi

PY=python3
if ! "$PY" - <<'PYEOF' 2>/dev/null; then
import grpc, importlib.metadata as m
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2_grpc
assert m.version("opentelemetry-proto").startswith("1.45.")
PYEOF
	"$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
		"grpcio>=1.60,<2" "opentelemetry-proto>=1.45,<1.46" >/dev/null
fi

echo "exporters: $(go version | cut -d' ' -f3), python $("$PY" -c 'import grpc, importlib.metadata as m; print("grpcio", grpc.__version__, "opentelemetry-proto", m.version("opentelemetry-proto"))')"
