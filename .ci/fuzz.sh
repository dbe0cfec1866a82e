#!/usr/bin/env bash
# CI part (run by .ci/test): builds the fuzz target fuzz/fuzz_targets/otlp_request.rs
# (fuzz/ is a cargo workspace of its own) with libFuzzer and AddressSanitizer,
# as `cargo fuzz build` does, and runs it for FUZZ_SECONDS (60) starting from
# the committed seeds. The seeds are read, never written: what the run adds
# to the corpus goes to a temporary directory. A crash, a leak or running out
# of memory fails CI, with libFuzzer's report (the input in base64 when it is
# small) in the log. docs/FUZZING.md says how to run it longer by hand.
#
# The sanitizer flags are unstable (-Z): the installed nightly toolchain
# builds it when there is one, else the pinned toolchain with
# RUSTC_BOOTSTRAP=1. No cargo-fuzz is needed: these are its flags.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
	cargo=(cargo +nightly)
else
	cargo=(cargo)
	export RUSTC_BOOTSTRAP=1
fi
# An explicit --target keeps these flags off build scripts and proc macros.
target="$(uname -m)-unknown-linux-gnu"
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Zsanitizer=address \
-Cdebug-assertions -Coverflow-checks"
# Its own target directory: other flags than the workspace's build.
export CARGO_TARGET_DIR="$PWD/target"

start=$SECONDS
"${cargo[@]}" build --release --quiet --target "$target" --bin otlp_request
built=$((SECONDS - start))

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/corpus" "$work/artifacts"
secs=${FUZZ_SECONDS:-60}
if ! "target/$target/release/otlp_request" "$work/corpus" corpus/otlp_request \
	-max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 \
	-artifact_prefix="$work/artifacts/" -print_final_stats=1 >"$work/log" 2>&1; then
	tail -n 80 "$work/log"
	echo "fuzz: otlp_request failed (above); reproduce with the input shown, see docs/FUZZING.md" >&2
	exit 1
fi
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
echo "fuzz: otlp_request built in ${built}s, ${runs:-?} runs in ${secs}s from $(ls corpus/otlp_request | wc -l) seeds, no crash"
