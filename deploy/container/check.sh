#!/usr/bin/env bash
# CI: builds the image from this clone (deploy/container/build.sh), exports
# its root filesystem (podman create + podman export) and runs the binary
# from it: `profcol --version` and `profcol validate` of the image's default
# config, as the image's non-root user (and checks it is linked at a fixed
# address, not a PIE), under chroot (the binary is static:
# it needs nothing outside the image; no container runtime is involved).
# Then checks the image's size against the stripped binary's (≤ 1.5×), its
# labels and its user.
#
# Usage: deploy/container/check.sh [--profile dev|release]  (default dev: see
# docs/DEPLOY.md, "The image", for why CI builds the dev profile)
set -euo pipefail
cd "$(dirname "$0")/../.."
profile=dev
[ "${1:-}" = --profile ] && profile="$2"
tag=localhost/profcol:ci-check

summary=$(deploy/container/build.sh --profile "$profile" --tag "$tag" | tail -1)
eval "$(echo "$summary" | tr ' ' '\n' | grep -E '^(binary_bytes|image_bytes)=[0-9]+$')"

root=$(mktemp -d)
chmod 0755 "$root"  # the image's user must reach its own files
cid=
cleanup() {
	[ -n "$cid" ] && podman rm -f "$cid" >/dev/null 2>&1 || true
	podman rmi -f "$tag" >/dev/null 2>&1 || true
	rm -rf "$root"
}
trap cleanup EXIT
cid=$(podman create "$tag")
podman export "$cid" | tar -x -C "$root"

user=$(podman image inspect --format '{{.Config.User}}' "$tag")
[ "$user" = 65532:65532 ] || { echo "check: the image runs as '$user', not the non-root 65532:65532" >&2; exit 1; }
for label in title version revision created licenses; do
	v=$(podman image inspect --format "{{index .Labels \"org.opencontainers.image.$label\"}}" "$tag")
	[ -n "$v" ] || { echo "check: OCI label org.opencontainers.image.$label is missing" >&2; exit 1; }
done

run() { chroot --userspec=65532:65532 "$root" "$@"; }
version=$(run /usr/bin/profcol --version)
case "$version" in profcol\ *) ;; *) echo "check: profcol --version said '$version'" >&2; exit 1 ;; esac
run /usr/bin/profcol validate --config /etc/profcol/config.yaml >/dev/null
# Linked at a fixed address (build.sh): ELF type EXEC, not DYN (static-pie).
elf_type=$(od -An -tu2 -j16 -N2 "$root/usr/bin/profcol" | tr -d ' ')
[ "$elf_type" = 2 ] || { echo "check: /usr/bin/profcol has ELF type $elf_type, not 2 (EXEC): built as a PIE?" >&2; exit 1; }

# Everything but the binary (certificates, config, metadata) is small.
if [ $((image_bytes * 2)) -gt $((binary_bytes * 3)) ]; then
	echo "check: image $image_bytes bytes > 1.5 × the stripped binary's $binary_bytes" >&2
	exit 1
fi
echo "image: $version from the exported rootfs; validate ok; image $image_bytes bytes, binary $binary_bytes bytes (profile $profile)"
