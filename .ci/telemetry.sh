#!/usr/bin/env bash
# CI needs of the self-telemetry tests (collector/tests/self_telemetry.rs):
#   - promtool (Debian's prometheus package): `promtool check metrics` on /metrics;
#   - python3 grpcio + opentelemetry-proto: the OTLP metrics/logs/trace server
#     (collector/tests/python/otlp_telemetry_server.py); .ci/exporters.sh
#     installs them, this part only checks they are there.
# Idempotent and quiet: installs only what is missing. With CI=true the tests
# fail (not skip) when one of these is missing.
set -euo pipefail

if ! command -v promtool >/dev/null; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends prometheus >/dev/null
	# The package starts a Prometheus server where systemd runs; CI needs the tool only.
	if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
		systemctl disable --now prometheus >/dev/null 2>&1 || true
	fi
fi

echo "telemetry: $(promtool --version 2>&1 | head -1)"
