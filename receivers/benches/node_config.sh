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
