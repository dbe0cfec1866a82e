#!/usr/bin/env bash
# CI needs for the config schema test (collector/tests/schema.rs): python3
# jsonschema (a JSON Schema 2020-12 validator from PyPI) and PyYAML to read
# the example configs. Idempotent and quiet. With CI=true the test fails
# (not skips) when they are missing.
set -euo pipefail

PY=python3
if ! "$PY" -c 'import jsonschema, yaml; jsonschema.Draft202012Validator' 2>/dev/null; then
	"$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
		"jsonschema>=4.18,<5" "PyYAML>=6,<7" >/dev/null
fi
echo "schema: python jsonschema $("$PY" -c 'import importlib.metadata as m; print(m.version("jsonschema"))')"
