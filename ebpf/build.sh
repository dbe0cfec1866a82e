#!/usr/bin/env bash
# Rebuild profcol's BPF objects from ebpf/bpf/*.bpf.c with clang-16.
#
#   ebpf/build.sh           rebuild ebpf/obj/*.bpf.o in place
#   ebpf/build.sh --check   rebuild into a temp dir and fail if the committed
#                           objects differ (CI: catches a stale object)
#
# Needs: clang-16, llvm-16 (llvm-strip-16), libbpf-dev (bpf/bpf_helpers.h),
# linux-libc-dev. The output is reproducible: fixed flags, -g for .BTF and
# .BTF.ext (bpf_find_vma's callback needs func_info; no CO-RE relocations),
# sources compiled by relative path from ebpf/, and llvm-strip -g (no DWARF,
# no paths) plus removal of the .llvm_addrsig section.
set -euo pipefail

cd "$(dirname "$0")"
CLANG=${CLANG:-clang-16}
STRIP=${LLVM_STRIP:-llvm-strip-16}
ARCH_INC=${ARCH_INC:-/usr/include/$(uname -m)-linux-gnu}

check=0
if [[ "${1:-}" == "--check" ]]; then check=1; fi

out=obj
if [[ $check == 1 ]]; then out=$(mktemp -d); trap 'rm -rf "$out"' EXIT; fi
mkdir -p "$out"

for src in bpf/*.bpf.c; do
	name=$(basename "$src" .c)
	"$CLANG" -target bpf -O2 -g -Wall -Werror \
		-mcpu=v3 \
		-D__TARGET_ARCH_x86 \
		-I"$ARCH_INC" \
		-fno-ident \
		-fdebug-prefix-map="$PWD"=. \
		-c "$src" -o "$out/$name.o"
	"$STRIP" -g --remove-section=.llvm_addrsig "$out/$name.o"
	if [[ $check == 1 ]]; then
		if ! cmp -s "$out/$name.o" "obj/$name.o"; then
			echo "ebpf/obj/$name.o is stale: run ebpf/build.sh and commit the result" >&2
			exit 1
		fi
		echo "ebpf/obj/$name.o is up to date"
	else
		echo "built ebpf/obj/$name.o ($(stat -c %s "obj/$name.o") bytes)"
	fi
done
