"""Loading, versions, struct mirrors and the error mapping."""

import ctypes
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kvpage
from kvpage import _lib
from kvpage.errors import error_for

REPO = Path(__file__).resolve().parents[3]


def test_versions_match():
    assert kvpage.library_version() == kvpage.__version__
    n = _lib.lib.kvp_version_number()
    assert (n // 10000, n // 100 % 100, n % 100) == _lib.EXPECTED_VERSION
    assert os.path.exists(kvpage.library_path)


@pytest.mark.parametrize("status,cls,base", [
    (-1, kvpage.InvalidArgument, ValueError),
    (-2, kvpage.OutOfMemory, MemoryError),
    (-3, kvpage.NoSpace, kvpage.Error),
    (-4, kvpage.NotFound, LookupError),
    (-5, kvpage.NotSupported, kvpage.Error),
    (-6, kvpage.NoDevice, kvpage.Error),
    (-7, kvpage.CudaError, kvpage.Error),
    (-8, kvpage.BadState, kvpage.Error),
    (-9, kvpage.InternalError, kvpage.Error),
])
def test_error_mapping(status, cls, base):
    e = error_for(status, "the detail")
    assert type(e) is cls
    assert isinstance(e, kvpage.Error) and isinstance(e, base)
    assert e.status == status
    assert e.name == _lib.lib.kvp_status_name(status).decode()
    assert e.detail == "the detail"
    assert "the detail" in str(e) and e.name in str(e)


def test_unknown_status_is_plain_error():
    e = error_for(-1234)
    assert type(e) is kvpage.Error
    assert e.name == "KVP_UNKNOWN"


def test_every_library_status_has_a_class():
    # walk the C table through kvp_status_name until it says unknown
    status = -1
    while _lib.lib.kvp_status_name(status).decode() != "KVP_UNKNOWN":
        assert type(error_for(status)) is not kvpage.Error, status
        status -= 1
    assert status <= -10


def _c_offsets(tmp_path):
    """sizeof and offsetof of every mirrored struct, from the C compiler."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler to compare the struct mirrors with")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "kvpage.h"',
             '#include "kvpage_cuda.h"', "int main(void) {"]
    for cname, cls in _lib.MIRRORED.items():
        lines.append(f'printf("{cname} size %zu\\n", sizeof({cname}));')
        for field, _ in cls._fields_:
            lines.append(f'printf("{cname} {field} %zu\\n", offsetof({cname}, {field}));')
    lines.append("return 0; }")
    src = tmp_path / "offsets.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "offsets"
    subprocess.run([cc, "-std=c11", f"-I{REPO / 'include'}", str(src), "-o", str(exe)],
                   check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    table = {}
    for line in out.splitlines():
        struct, field, value = line.split()
        table[(struct, field)] = int(value)
    return table


def test_struct_mirrors_match_the_header(tmp_path):
    c = _c_offsets(tmp_path)
    for cname, cls in _lib.MIRRORED.items():
        assert ctypes.sizeof(cls) == c[(cname, "size")], cname
        for field, _ in cls._fields_:
            assert getattr(cls, field).offset == c[(cname, field)], (cname, field)


def test_missing_library_lists_what_was_tried(tmp_path):
    env = dict(os.environ, KVPAGE_LIBRARY=str(tmp_path / "nope.so"),
               PYTHONPATH=str(REPO / "bindings" / "python"))
    r = subprocess.run([sys.executable, "-c", "import kvpage"], env=env, capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode != 0
    assert "could not load libkvpage" in r.stderr
    assert "KVPAGE_LIBRARY" in r.stderr and "nope.so" in r.stderr


def test_library_env_var_is_used():
    env = dict(os.environ, KVPAGE_LIBRARY=kvpage.library_path,
               PYTHONPATH=str(REPO / "bindings" / "python"))
    r = subprocess.run([sys.executable, "-c", "import kvpage; print(kvpage.library_path)"],
                       env=env, capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == kvpage.library_path


def test_cuda_entry_points_answer_cleanly():
    if not kvpage.build_has_cuda():
        with pytest.raises(kvpage.NotSupported, match="without CUDA"):
            kvpage.cuda_device_count()
        return
    try:
        n = kvpage.cuda_device_count()
    except kvpage.NoDevice as e:
        assert e.detail
        with pytest.raises(kvpage.NoDevice):
            kvpage.cuda_device(0)
        return
    assert n >= 1
    d = kvpage.cuda_device(0)
    assert d.total_bytes > 0 and d.name
    with pytest.raises(kvpage.NoDevice):
        kvpage.cuda_device(n)


def test_handle_destroys_exactly_once():
    import gc

    from kvpage._handle import Handle

    calls = []
    h = Handle(ctypes.c_void_p(1), calls.append)
    h.close()
    h.close()
    del h
    gc.collect()
    assert len(calls) == 1
    with Handle(ctypes.c_void_p(2), calls.append) as h2:
        assert not h2.closed
    assert h2.closed and len(calls) == 2
    h3 = Handle(ctypes.c_void_p(3), calls.append)
    del h3
    gc.collect()
    assert len(calls) == 3
