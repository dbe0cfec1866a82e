# Sourced by the benchmark scripts beside it (run from the repository root):
#
#   node_config FREQ DIR METRICS_ADDRESS [FILE] >file
#
# prints examples/default.yaml, the embedded node agent (or FILE: an older
# checkout's default.yaml, for its own binary), with its sample
# frequency set to FREQ, its pprof files written under DIR/profiles and
# its /metrics served on METRICS_ADDRESS (the YAML text: '""', two quote
# marks, turns it off; agents running side by side need one each). Fails
# if the frequency line was not found.
#
#   node_report_seconds
#
# prints the node agent's report_interval in seconds; fails unless it is
# written in whole seconds.
#
#   with_user_symbols <config >config
#
# adds the user_symbols processor (its defaults) to a config on stdin that
# has kernel_symbols: declared under processors, and after kernel_symbols in
# the pipeline. Fails unless both were found, or when it is there already.
#
#   without_user_symbols <config >config
#
# drops the user_symbols processor (its declaration, its indented keys and
# comments just above it, and its pipeline entry): the embedded default
# without names. Fails unless it was there.
node_config() {
	local out
	out=$(sed -e "s/sample_frequency: [0-9]*/sample_frequency: $1/" \
		-e "s|directory: ./profiles|directory: $2/profiles|" \
		-e "s|^service:|service:\n  telemetry:\n    metrics:\n      address: $3|" "${4:-examples/default.yaml}")
	grep -q "sample_frequency: $1\$" <<<"$out" || { echo "node_config: no sample_frequency line in ${4:-examples/default.yaml}" >&2; return 1; }
	printf '%s\n' "$out"
}
node_report_seconds() {
	local s
	s=$(sed -n 's/^ *report_interval: *\([0-9]*\)s *$/\1/p' examples/default.yaml)
	[ -n "$s" ] || { echo "node_report_seconds: no report_interval in seconds in examples/default.yaml" >&2; return 1; }
	printf '%s\n' "$s"
}
with_user_symbols() {
	local out
	out=$(cat)
	grep -q '^  user_symbols:' <<<"$out" && { echo "with_user_symbols: the config has user_symbols already" >&2; return 1; }
	out=$(sed -e 's/^  kernel_symbols:\(.*\)$/  kernel_symbols:\1\n  user_symbols:/' \
		-e 's/processors: \[\(.*\)kernel_symbols\(.*\)\]/processors: [\1kernel_symbols, user_symbols\2]/' <<<"$out")
	grep -q '^  user_symbols:' <<<"$out" && grep -q 'processors: \[.*kernel_symbols, user_symbols' <<<"$out" ||
		{ echo "with_user_symbols: no kernel_symbols processor and pipeline entry to follow" >&2; return 1; }
	printf '%s\n' "$out"
}
without_user_symbols() {
	local out
	out=$(python3 -c '
import re, sys
lines = sys.stdin.read().split("\n")
out, skip = [], False
for l in lines:
    if l == "  user_symbols:":
        while out and out[-1].startswith("  #"):
            out.pop()
        skip = True
        continue
    if skip and (l.startswith("    ") or l.strip() == ""):
        if l.strip() == "":
            out.append(l)
            skip = False
        continue
    skip = False
    out.append(re.sub(r", user_symbols\b", "", l))
print("\n".join(out))')
	grep -q 'user_symbols' <<<"$out" && { echo "without_user_symbols: user_symbols still named" >&2; return 1; }
	printf '%s\n' "$out"
}
