#!/usr/bin/env bash
# Builds profcol's OCI image without running a container:
#   1. a static profcol for x86_64-unknown-linux-musl (rustup target, Debian's
#      musl-tools for the C parts), the BPF object embedded as in every build,
#      stripped (binutils strip);
#   2. a build context with it, the host's CA bundle (Debian ca-certificates),
#      passwd/group for the non-root user and the default config;
#   3. `podman build` (or `buildah bud`) of deploy/container/Containerfile:
#      FROM scratch, COPY and metadata only, no network.
#
# Usage: deploy/container/build.sh [--profile release|dev] [--tag NAME:TAG]
#   --profile  cargo profile (default release). CI uses dev: the same
#              binary and image layout, built in a fraction of the time.
#   --tag      image name (default localhost/profcol:VERSION).
# Prints, last, the image name, the stripped binary's size and the image's
# size in bytes: `image=... binary_bytes=N image_bytes=M`.
set -euo pipefail
cd "$(dirname "$0")/../.."

profile=release
tag=
while [ $# -gt 0 ]; do
	case "$1" in
	--profile) profile="$2"; shift 2 ;;
	--tag) tag="$2"; shift 2 ;;
	*) echo "build.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
	esac
done

target=x86_64-unknown-linux-musl
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
revision=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
tag=${tag:-localhost/profcol:$version}

need() { command -v "$1" >/dev/null || { echo "build.sh: $1 is missing; $2" >&2; exit 1; }; }
need cargo "install Rust with rustup"
need musl-gcc "apt-get install musl-tools"
need strip "apt-get install binutils"
if ! rustup target list --installed | grep -qx "$target"; then
	rustup target add "$target" >/dev/null
fi
if command -v podman >/dev/null; then
	builder=(podman build --network none --layers=false)
elif command -v buildah >/dev/null; then
	builder=(buildah bud --network none --layers=false)
else
	echo "build.sh: neither podman nor buildah is installed; apt-get install podman (or buildah)" >&2
	exit 1
fi
cacerts=/etc/ssl/certs/ca-certificates.crt
[ -r "$cacerts" ] || { echo "build.sh: $cacerts is missing; apt-get install ca-certificates" >&2; exit 1; }

# No debug info (the image would drop it anyway); the symbols are stripped
# from the copy below, so the build's own binary keeps them.
P=$(echo "$profile" | tr 'a-z-' 'A-Z_')
export "CARGO_PROFILE_${P}_DEBUG=false"
export CC_x86_64_unknown_linux_musl=musl-gcc
# Static and at a fixed address (not static-pie): a PIE relocates its own
# read-only data at start, ~0.9 MiB of private dirty pages its memory
# cgroup charges for good (collector/build.rs does the same for glibc
# builds). With --target, RUSTFLAGS reach only the target's crates.
export RUSTFLAGS="${RUSTFLAGS:-} -C relocation-model=static"
cargo build --locked -q --profile "$profile" --target "$target" -p profcol

target_dir=${CARGO_TARGET_DIR:-target}
outdir=$profile
[ "$profile" = dev ] && outdir=debug
bin="$target_dir/$target/$outdir/profcol"
if file "$bin" 2>/dev/null | grep -q "dynamically linked"; then
	echo "build.sh: $bin is dynamically linked; the image has no libc" >&2
	exit 1
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
install -m 0755 "$bin" "$ctx/profcol"
strip --strip-all "$ctx/profcol"
install -m 0644 "$cacerts" "$ctx/ca-certificates.crt"
install -m 0644 deploy/container/passwd deploy/container/group deploy/container/config.yaml "$ctx/"

"${builder[@]}" -q -f deploy/container/Containerfile -t "$tag" \
	--build-arg VERSION="$version" --build-arg REVISION="$revision" \
	--build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$ctx" >/dev/null

binary_bytes=$(stat -c %s "$ctx/profcol")
if [ "${builder[0]}" = podman ]; then
	image_bytes=$(podman image inspect --format '{{.Size}}' "$tag")
else
	# buildah reports sizes rounded for people; deploy/container/check.sh needs podman.
	image_bytes=unknown
fi
echo "image=$tag binary_bytes=$binary_bytes image_bytes=$image_bytes"
