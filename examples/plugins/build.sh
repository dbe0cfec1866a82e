#!/usr/bin/env bash
# Builds the example plugins into examples/plugins/out/NAME.wasm.
#   Rust (drop_frames, add_attribute, folded_exporter, pass_through): the plugin workspace
#   plugins/Cargo.toml for wasm32-wasip2 (`rustup target add wasm32-wasip2`),
#   target dir plugins/target.
#   Python (redact_paths): componentize-py, see below.
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

rust_plugins=(drop_frames add_attribute folded_exporter pass_through)
target="${PROFCOL_PLUGINS_TARGET_DIR:-$root/plugins/target}"
pkgs=()
for p in "${rust_plugins[@]}"; do pkgs+=(-p "$p"); done
CARGO_TARGET_DIR="$target" cargo build --quiet --release --target wasm32-wasip2 \
	--manifest-path "$root/plugins/Cargo.toml" "${pkgs[@]}"
for p in "${rust_plugins[@]}"; do
	install_if_changed "$target/wasm32-wasip2/release/$p.wasm" "$out/$p.wasm"
done

# Python (redact_paths): componentize-py (PyPI) bundles CPython, app.py and
# the pure-Python wheels of requirements.txt into one component. Rebuilt
# only when its sources or the WIT are newer than the output.
py_plugins=(redact_paths)
for p in "${py_plugins[@]}"; do
	src="$here/$p"
	wasm="$out/$p.wasm"
	if [ -f "$wasm" ] && [ -z "$(find "$src" "$root/plugins/wit" -type f -newer "$wasm" -not -path '*/__pycache__/*' | head -1)" ]; then
		continue
	fi
	# The wheels, installed again only when requirements.txt changes.
	site="$target/python/$p-site-$(sha256sum "$src/requirements.txt" | cut -c1-16)"
	fresh=false
	if [ ! -d "$site" ]; then
		rm -rf "$target/python/$p-site-"*
		python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-compile --target "$site.tmp" \
			--no-deps --only-binary=:all: --platform any --implementation py -r "$src/requirements.txt" >/dev/null
		mv "$site.tmp" "$site"
		fresh=true
	fi
	# From $src: componentize-py bundles the Python files under its working
	# directory. Its CPython imports the app while building and writes the
	# modules' bytecode to __pycache__; on fresh sources that compile work is
	# left in the snapshot (30 MB instead of 19 MB), so a fresh site is
	# built twice and only the second kept.
	build() { (cd "$src" && componentize-py -d "$root/plugins/wit" -w processor componentize app -p . -p "$site" -o "$wasm.tmp" >/dev/null); }
	build
	if $fresh; then build; fi
	mv "$wasm.tmp" "$wasm"
done
