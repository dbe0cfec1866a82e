#!/usr/bin/env bash
# Builds the example plugins into examples/plugins/out/NAME.wasm.
#   Rust (drop_frames, add_attribute, folded_exporter): the plugin workspace
#   plugins/Cargo.toml for wasm32-wasip2 (`rustup target add wasm32-wasip2`),
#   target dir plugins/target.
# Incremental and quiet: cargo rebuilds what changed, and an output file is
# replaced only when its content changed, so its mtime (and the host's
# compile cache key) stay put otherwise.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$here/out"
mkdir -p "$out"

# Copies $1 to $2 unless $2 already holds the same bytes.
install_if_changed() {
	cmp -s "$1" "$2" || cp "$1" "$2"
}

rust_plugins=(drop_frames add_attribute folded_exporter)
target="${PROFCOL_PLUGINS_TARGET_DIR:-$root/plugins/target}"
pkgs=()
for p in "${rust_plugins[@]}"; do pkgs+=(-p "$p"); done
CARGO_TARGET_DIR="$target" cargo build --quiet --release --target wasm32-wasip2 \
	--manifest-path "$root/plugins/Cargo.toml" "${pkgs[@]}"
for p in "${rust_plugins[@]}"; do
	install_if_changed "$target/wasm32-wasip2/release/$p.wasm" "$out/$p.wasm"
done
