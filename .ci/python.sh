#!/usr/bin/env bash
# CI needs of the CPython frames test (collector/tests/python_frames.rs):
#   - python3.11 (Debian's build, /usr/bin/python3.11): profiled beside the
#     3.9–3.13 interpreters pyenv provides;
#   - py-spy 0.4 (PyPI), the reference profiler, installed under the
#     workspace's target/py-spy (the test looks there, then on PATH) with
#     Debian's pip (`--target` installs outside the system's packages).
# Idempotent and quiet: installs only what is missing. With CI=true the test
# fails (not skips) when one of these is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
[ -x /usr/bin/python3.11 ] || need+=(python3.11)
/usr/bin/python3.11 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
if [ ${#need[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

dest=target/py-spy
if ! "$dest/bin/py-spy" --version 2>/dev/null | grep -q '^py-spy 0\.4\.'; then
	rm -rf "$dest"
	/usr/bin/python3.11 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
		--target "$dest" "py-spy>=0.4,<0.5" >/dev/null
fi

echo "python: $(/usr/bin/python3.11 --version), $("$dest/bin/py-spy" --version)"
