#!/bin/sh
# Install into a temporary DESTDIR and build an outside program against the
# installed copy with nothing but pkg-config — shared, then static — and run
# it. This is exactly what an engine's build does.
set -eu

MAKE=${MAKE:-make}
CC=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
prefix=/opt/kvpage-test
root="$tmp/root"

echo "test-install: make install DESTDIR=$root PREFIX=$prefix"
$MAKE --no-print-directory install DESTDIR="$root" PREFIX="$prefix" SAN=0 CC="$CC" \
    ${HAVE_CUDA:+HAVE_CUDA=$HAVE_CUDA} >"$tmp/install.log" 2>&1 || {
    cat "$tmp/install.log"
    echo "test-install: FAILED: make install" >&2
    exit 1
}
for f in include/kvpage.h include/kvpage_cuda.h lib/libkvpage.a lib/libkvpage.so \
         lib/pkgconfig/kvpage.pc bin/kvpage-plan; do
    [ -e "$root$prefix/$f" ] || { echo "test-install: FAILED: $prefix/$f not installed" >&2; exit 1; }
done
soname=$(readelf -d "$root$prefix/lib/libkvpage.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
case "$soname" in
libkvpage.so.[0-9]*) echo "test-install: SONAME $soname" ;;
*) echo "test-install: FAILED: SONAME is '$soname'" >&2; exit 1 ;;
esac

# The package was built for $prefix but sits under DESTDIR: point pkg-config
# at it and relocate its prefix, as a packager's staging build does.
export PKG_CONFIG_LIBDIR="$root$prefix/lib/pkgconfig"
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR || true
pc() { pkg-config --define-variable=prefix="$root$prefix" "$@" kvpage; }
[ "$(pc --modversion)" = "$(sed -n 's/^Version: //p' "$root$prefix/lib/pkgconfig/kvpage.pc")" ] ||
    { echo "test-install: FAILED: pkg-config cannot read kvpage.pc" >&2; exit 1; }

# shared
flags=$(pc --cflags --libs)
echo "test-install: cc examples/hello_kvpage.c $flags"
# shellcheck disable=SC2086
$CC -std=c11 -Wall -Wextra -Wpedantic -Werror -o "$tmp/hello-shared" examples/hello_kvpage.c $flags
readelf -d "$tmp/hello-shared" | grep -q "NEEDED.*\[$soname\]" ||
    { echo "test-install: FAILED: hello-shared does not need $soname" >&2; exit 1; }
LD_LIBRARY_PATH="$root$prefix/lib" "$tmp/hello-shared" >"$tmp/out-shared" ||
    { cat "$tmp/out-shared"; echo "test-install: FAILED: hello-shared did not run" >&2; exit 1; }

# static: an install without the shared object, as a static-only package has
rm -f "$root$prefix"/lib/libkvpage.so*
flags=$(pc --static --cflags --libs)
echo "test-install: cc examples/hello_kvpage.c $flags"
# shellcheck disable=SC2086
$CC -std=c11 -Wall -Wextra -Wpedantic -Werror -o "$tmp/hello-static" examples/hello_kvpage.c $flags
if readelf -d "$tmp/hello-static" | grep -q "NEEDED.*libkvpage"; then
    echo "test-install: FAILED: hello-static still needs libkvpage.so" >&2
    exit 1
fi
"$tmp/hello-static" >"$tmp/out-static" ||
    { cat "$tmp/out-static"; echo "test-install: FAILED: hello-static did not run" >&2; exit 1; }
cmp -s "$tmp/out-shared" "$tmp/out-static" ||
    { echo "test-install: FAILED: shared and static outputs differ" >&2; exit 1; }
sed 's/^/test-install:   | /' "$tmp/out-static"

# uninstall leaves nothing of ours behind
$MAKE --no-print-directory uninstall DESTDIR="$root" PREFIX="$prefix" >/dev/null
left=$(find "$root" -type f -o -type l | grep -E 'kvpage' || true)
[ -z "$left" ] || { echo "test-install: FAILED: uninstall left: $left" >&2; exit 1; }
echo "test-install: PASSED (install, pkg-config shared + static, run, uninstall)"
