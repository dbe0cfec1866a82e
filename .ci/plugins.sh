#!/usr/bin/env bash
# CI part for the WASM plugins, run by .ci/test before the workspace's
# tests (which load examples/plugins/out/*.wasm):
#   - the rustup target wasm32-wasip2, componentize-py (PyPI, builds the
#     Python example) and opentelemetry-proto (its native tests), installed
#     only when missing;
#   - examples/plugins/build.sh: every example plugin, incrementally;
#   - the plugin workspace (plugins/Cargo.toml: the SDK and the Rust
#     examples, outside the root workspace): fmt, clippy (native and
#     wasm32-wasip2) and its tests, natively, through the SDK's harness;
#   - the Python example's logic under the machine's CPython (unittest).
# Quiet unless something fails.
set -euo pipefail
cd "$(dirname "$0")/.."

rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2 >/dev/null 2>&1

PY=python3
COMPONENTIZE_PY=0.25.1
if ! "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('componentize-py') != '$COMPONENTIZE_PY')" 2>/dev/null; then
	"$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore "componentize-py==$COMPONENTIZE_PY" >/dev/null
fi
# Under pyenv a new console script needs its shim.
command -v componentize-py >/dev/null || { command -v pyenv >/dev/null && pyenv rehash; }

if ! "$PY" -c "import opentelemetry.proto.profiles.v1development.profiles_pb2" 2>/dev/null; then
	"$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore "opentelemetry-proto>=1.45,<1.46" >/dev/null
fi

start=$SECONDS
examples/plugins/build.sh

export CARGO_TARGET_DIR="$PWD/plugins/target"
manifest=(--manifest-path plugins/Cargo.toml)
cargo fmt "${manifest[@]}" --all -- --check
cargo clippy -q "${manifest[@]}" --workspace --all-targets -- -D warnings
cargo clippy -q "${manifest[@]}" --workspace --release --target wasm32-wasip2 -- -D warnings
cargo test -q "${manifest[@]}" --workspace
(cd examples/plugins/redact_paths && PYTHONDONTWRITEBYTECODE=1 "$PY" -m unittest -q test_redact_paths)

echo "plugins: $(ls examples/plugins/out | tr '\n' ' ')built and tested in $((SECONDS - start)) s"
