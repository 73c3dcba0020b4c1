#!/bin/sh
# Install into a temporary DESTDIR and build outside programs against the
# installed copy with nothing but pkg-config, exactly as the README tells an
# engine to: every header compiled alone (C and C++), then the examples
# linked against the shared library with an rpath and run without
# LD_LIBRARY_PATH, then linked statically while the shared library is still
# installed beside the archive, and run again.
set -eu

MAKE=${MAKE:-make}
CC=${CC:-cc}
CXX=${CXX:-c++}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
prefix=/opt/kvpage-test
root="$tmp/root"
fail() { echo "test-install: FAILED: $*" >&2; exit 1; }

echo "test-install: make install DESTDIR=$root PREFIX=$prefix"
$MAKE --no-print-directory install DESTDIR="$root" PREFIX="$prefix" SAN=0 CC="$CC" \
    ${HAVE_CUDA:+HAVE_CUDA=$HAVE_CUDA} >"$tmp/install.log" 2>&1 || {
    cat "$tmp/install.log"
    fail "make install"
}
headers="kvpage.h kvpage_ext.h kvpage_plan.h kvpage_tier.h kvpage_sched.h kvpage_cuda.h kvpage_blob.h"
for f in $(printf 'include/%s ' $headers) lib/libkvpage.a lib/libkvpage.so \
         lib/pkgconfig/kvpage.pc bin/kvpage-plan bin/kvpage-sim; do
    [ -e "$root$prefix/$f" ] || fail "$prefix/$f not installed"
done
[ ! -e "$root$prefix/bin/kvpage-bench" ] || fail "kvpage-bench (a benchmark) was installed"
soname=$(readelf -d "$root$prefix/lib/libkvpage.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
case "$soname" in
libkvpage.so.[0-9]*) echo "test-install: SONAME $soname" ;;
*) fail "SONAME is '$soname'" ;;
esac

# The package was built for $prefix but sits under DESTDIR: point pkg-config
# at it and relocate its prefix, as a packager's staging build does.
export PKG_CONFIG_LIBDIR="$root$prefix/lib/pkgconfig"
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR || true
pc() { pkg-config --define-variable=prefix="$root$prefix" "$@" kvpage; }
[ "$(pc --modversion)" = "$(sed -n 's/^Version: //p' "$root$prefix/lib/pkgconfig/kvpage.pc")" ] ||
    fail "pkg-config cannot read kvpage.pc"

# Every installed header stands alone, in C11 (pedantic) and in C++.
for h in $headers; do
    printf '#include <%s>\nint main(void) { return 0; }\n' "$h" >"$tmp/alone.c"
    # shellcheck disable=SC2046
    $CC -std=c11 -Wall -Wextra -Wpedantic -Werror $(pc --cflags) -c "$tmp/alone.c" -o "$tmp/alone.o" ||
        fail "$h does not compile alone (C11)"
    if command -v "$CXX" >/dev/null 2>&1; then
        # shellcheck disable=SC2046
        $CXX -x c++ -Wall -Wextra -Werror $(pc --cflags) -c "$tmp/alone.c" -o "$tmp/alone.o" ||
            fail "$h does not compile alone (C++)"
    fi
done
echo "test-install: each of $headers compiles alone (C11, C++)"

# decode_loop.c uses the core header alone, and the README shows its loop as it is.
grep -q '#include <kvpage_' examples/decode_loop.c && fail "examples/decode_loop.c leaves the core API"
region=$(sed -n '/\[decode-loop\]/,/\[\/decode-loop\]/p' examples/decode_loop.c | sed '1d;$d' | tr '\n' '\001')
readme=$(tr '\n' '\001' <README.md)
[ -n "$region" ] || fail "examples/decode_loop.c has no [decode-loop] region"
case "$readme" in
*"$region"*) echo "test-install: README.md shows examples/decode_loop.c's decode loop as it is" ;;
*) fail "README.md's decode loop differs from examples/decode_loop.c's [decode-loop] region" ;;
esac

libdir=$(pc --variable=libdir)
for prog in hello_kvpage decode_loop; do
    # shared, found at run time through the rpath (no LD_LIBRARY_PATH)
    flags="$(pc --cflags --libs) -Wl,-rpath,$libdir -lm"
    echo "test-install: cc examples/$prog.c $flags"
    # shellcheck disable=SC2086
    $CC -std=c11 -Wall -Wextra -Wpedantic -Werror -o "$tmp/$prog-shared" examples/$prog.c $flags
    readelf -d "$tmp/$prog-shared" | grep -q "NEEDED.*\[$soname\]" ||
        fail "$prog-shared does not need $soname"
    env -u LD_LIBRARY_PATH "$tmp/$prog-shared" >"$tmp/$prog-out-shared" ||
        { cat "$tmp/$prog-out-shared"; fail "$prog-shared did not run"; }

    # static, with libkvpage.so still installed beside the archive
    flags="$(pc --cflags) $(pc --variable=static_libs)"
    echo "test-install: cc examples/$prog.c $flags"
    # shellcheck disable=SC2086
    $CC -std=c11 -Wall -Wextra -Wpedantic -Werror -o "$tmp/$prog-static" examples/$prog.c $flags
    if readelf -d "$tmp/$prog-static" | grep -q "NEEDED.*libkvpage"; then
        fail "$prog-static still needs libkvpage.so"
    fi
    "$tmp/$prog-static" >"$tmp/$prog-out-static" ||
        { cat "$tmp/$prog-out-static"; fail "$prog-static did not run"; }
    cmp -s "$tmp/$prog-out-shared" "$tmp/$prog-out-static" ||
        fail "$prog: shared and static outputs differ"
    sed 's/^/test-install:   | /' "$tmp/$prog-out-static"
done

# uninstall leaves nothing of ours behind
$MAKE --no-print-directory uninstall DESTDIR="$root" PREFIX="$prefix" >/dev/null
left=$(find "$root" -type f -o -type l | grep -E 'kvpage' || true)
[ -z "$left" ] || fail "uninstall left: $left"
echo "test-install: PASSED (install, headers alone, pkg-config shared + rpath and static, run, uninstall)"
