#!/bin/sh
# Install libnerva-client for C programs: the shared and static library, include/nerva.h and a
# pkg-config file, under PREFIX.
#
#   libnerva-client/install.sh PREFIX [--profile release|debug] [--no-build] [--target-dir DIR]
#                                     [--libdir lib|lib64|...]
#
#   PREFIX/lib/libnerva_client.so, PREFIX/lib/libnerva_client.a
#   PREFIX/include/nerva.h
#   PREFIX/lib/pkgconfig/nerva-client.pc
#
# Then:  PKG_CONFIG_PATH=PREFIX/lib/pkgconfig cc app.c $(pkg-config --cflags --libs nerva-client)
#        (static: pkg-config --static --libs nerva-client, and pass the .a explicitly or -static)
#
# --profile    cargo profile whose artifacts are installed (default: release)
# --no-build   install what is already built instead of running `cargo build` first
# --target-dir cargo target directory (default: $CARGO_TARGET_DIR, else <workspace>/target)
# --libdir     library directory name under PREFIX (default: lib)
set -eu

usage() {
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

[ $# -ge 1 ] || usage
case "$1" in -*) usage ;; esac
prefix=$1
shift
profile=release
build=1
libdir=lib
here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)
workspace=$(dirname -- "$here")
target_dir=${CARGO_TARGET_DIR:-$workspace/target}
while [ $# -gt 0 ]; do
    case "$1" in
    --profile) [ $# -ge 2 ] || usage; profile=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --target-dir) [ $# -ge 2 ] || usage; target_dir=$2; shift 2 ;;
    --libdir) [ $# -ge 2 ] || usage; libdir=$2; shift 2 ;;
    *) usage ;;
    esac
done
case "$libdir" in ''|/*|*..*) echo "install.sh: --libdir must be a relative name" >&2; exit 2 ;; esac

# cargo's "dev" profile writes to target/debug.
case "$profile" in
dev|debug) profile_dir=debug; cargo_profile=dev ;;
*) profile_dir=$profile; cargo_profile=$profile ;;
esac

if [ "$build" = 1 ]; then
    cargo build --manifest-path "$workspace/Cargo.toml" -p nerva-client --lib \
        --profile "$cargo_profile" --target-dir "$target_dir"
fi

artifacts=$target_dir/$profile_dir
# cargo copies the libraries up from deps/ only when nerva-client itself was selected; a build
# of a dependent crate (cargo test -p nerva-tests) leaves the newest ones in deps/.
if [ -f "$artifacts/deps/libnerva_client.so" ] && { [ ! -f "$artifacts/libnerva_client.so" ] ||
    [ "$artifacts/deps/libnerva_client.so" -nt "$artifacts/libnerva_client.so" ]; }; then
    artifacts=$artifacts/deps
fi
for f in libnerva_client.so libnerva_client.a; do
    if [ ! -f "$artifacts/$f" ]; then
        echo "install.sh: $artifacts/$f not found (build it, or drop --no-build)" >&2
        exit 1
    fi
done
header=$workspace/include/nerva.h
[ -f "$header" ] || { echo "install.sh: $header not found" >&2; exit 1; }

# The package version, from cargo ("path+file:///...#nerva-client@0.1.0" or "...#0.1.0").
version=$(cargo pkgid --manifest-path "$workspace/Cargo.toml" -p nerva-client | sed 's/.*[#@]//')
case "$version" in [0-9]*) ;; *) echo "install.sh: cannot read the version ($version)" >&2; exit 1 ;; esac

# A Rust staticlib needs the native libraries of Rust's std; rustc lists them for this toolchain.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo '' | rustc --crate-type staticlib --crate-name nerva_probe --edition 2021 \
    --print native-static-libs -o "$probe/probe.a" - 2>"$probe/notes"
libs_private=$(sed -n 's/^note: native-static-libs: //p' "$probe/notes")
[ -n "$libs_private" ] || { echo "install.sh: rustc did not list native-static-libs" >&2; exit 1; }

mkdir -p "$prefix/$libdir/pkgconfig" "$prefix/include"
prefix=$(CDPATH='' cd -- "$prefix" && pwd)
install -m 0755 "$artifacts/libnerva_client.so" "$prefix/$libdir/libnerva_client.so"
install -m 0644 "$artifacts/libnerva_client.a" "$prefix/$libdir/libnerva_client.a"
install -m 0644 "$header" "$prefix/include/nerva.h"
sed -e "s|@PREFIX@|$prefix|" -e "s|@LIBDIR@|$libdir|" -e "s|@VERSION@|$version|" \
    -e "s|@LIBS_PRIVATE@|$libs_private|" \
    "$here/nerva-client.pc.in" >"$prefix/$libdir/pkgconfig/nerva-client.pc"
echo "installed nerva-client $version into $prefix"
