#!/usr/bin/env bash
# Builds the misbehaving test plugins into plugins/testdata/out/*.wasm
# (incremental; quiet unless something fails). Needs the wasm32-wasip2 target.
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TARGET_DIR="$PWD/target"
rel=target/wasm32-wasip2/release
mkdir -p out/wit-next
# The same WIT one version later, for the plugin the host must refuse.
sed 's/@0\.1\.0/@0.2.0/g' ../wit/plugin.wit > out/wit-next/plugin.wit.new
cmp -s out/wit-next/plugin.wit.new out/wit-next/plugin.wit || mv out/wit-next/plugin.wit.new out/wit-next/plugin.wit
rm -f out/wit-next/plugin.wit.new
build() { cargo build -q --release --target wasm32-wasip2 "$@"; }
# The second version of misbehave (reload test): same behaviour, other counter.
build -p misbehave --features v2
cp "$rel/misbehave.wasm" out/misbehave_v2.wasm
build -p misbehave -p misbehave_export -p future_version -p wrong_signature
cp "$rel/misbehave.wasm" "$rel/misbehave_export.wasm" "$rel/future_version.wasm" "$rel/wrong_signature.wasm" out/
