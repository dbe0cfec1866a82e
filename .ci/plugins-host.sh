#!/usr/bin/env bash
# CI part for the plugin host: the wasm32-wasip2 target and the
# misbehaving test plugins of plugins/testdata (their own workspace), which
# the tests of profcol-plugins and collector/tests/wasm_plugins.rs load.
# Idempotent and quiet unless something fails.
set -euo pipefail
cd "$(dirname "$0")/.."

rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2 >/dev/null 2>&1
plugins/testdata/build.sh
