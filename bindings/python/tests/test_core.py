"""Loading, the library search order, versions, struct mirrors, the declared
functions and the error mapping."""

import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kvpage
from kvpage import _lib
from kvpage.errors import error_for

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "bindings" / "python"
HEADERS = ["kvpage.h", "kvpage_ext.h", "kvpage_plan.h", "kvpage_tier.h", "kvpage_sched.h",
           "kvpage_cuda.h", "kvpage_blob.h"]


def _env(**changes):
    """This process's environment with changes (None removes a variable)."""
    env = dict(os.environ)
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _python(code, cwd, **env):
    return subprocess.run([sys.executable, "-c", code], env=_env(**env), capture_output=True,
                          text=True, cwd=cwd, timeout=120)


def test_versions_match():
    assert kvpage.library_version() == kvpage.__version__
    n = _lib.lib.kvp_version_number()
    assert (n // 10000, n // 100 % 100, n % 100) == _lib.EXPECTED_VERSION
    assert os.path.exists(kvpage.library_path)


def test_header_version_is_the_bindings_version():
    text = (REPO / "include" / "kvpage.h").read_text()
    have = tuple(int(re.search(rf"#define KVP_VERSION_{n} (\d+)", text).group(1))
                 for n in ("MAJOR", "MINOR", "PATCH"))
    assert have == _lib.EXPECTED_VERSION


def test_version_rule():
    ok = _lib.version_ok
    assert ok(200, (0, 2, 0)) and ok(205, (0, 2, 0))
    assert not ok(100, (0, 2, 0)) and not ok(300, (0, 2, 0))  # before 1.0: same minor
    assert ok(10300, (1, 2, 0)) and not ok(10100, (1, 2, 0)) and not ok(20200, (1, 2, 0))


def test_version_mismatch_is_explained():
    class OldLibrary:
        @staticmethod
        def kvp_version_number():
            return 100  # 0.1.0

    with pytest.raises(_lib.LibraryMismatch, match=r"/x/libkvpage.so.0 is libkvpage 0\.1\.0"):
        _lib._check_version(OldLibrary(), "/x/libkvpage.so.0")
    with pytest.raises(ImportError, match="not libkvpage"):
        _lib._check_version(object(), "/x/libc.so.6")


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
    lines = ['#include <stdio.h>', '#include <stddef.h>']
    lines += [f'#include "{h}"' for h in HEADERS]
    lines.append("int main(void) {")
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


def _declared_functions():
    names = set()
    for h in HEADERS:
        text = (REPO / "include" / h).read_text()
        names |= set(re.findall(r"\bKVP_API\b[^;(]*?\b(kvp_\w+)\s*\(", text))
    return names


def test_every_bound_function_is_declared_in_the_headers():
    declared = _declared_functions()
    assert "kvp_cache_parts" in declared and "kvp_build_has" in declared
    missing = [n for n in _lib.DECLARED if n not in declared]
    assert missing == [], f"bound but not in include/*.h (removed or renamed?): {missing}"


def test_missing_library_lists_what_was_tried(tmp_path):
    r = _python("import kvpage", tmp_path, KVPAGE_LIBRARY=str(tmp_path / "nope.so"),
                PYTHONPATH=str(PACKAGE))
    assert r.returncode != 0
    assert "could not load libkvpage" in r.stderr
    assert "KVPAGE_LIBRARY" in r.stderr and "nope.so" in r.stderr
    assert "LibraryNotFound" in r.stderr


def test_library_env_var_is_used():
    r = _python("import kvpage; print(kvpage.library_path)", "/",
                KVPAGE_LIBRARY=kvpage.library_path, PYTHONPATH=str(PACKAGE))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == kvpage.library_path


def _planted_build_tree(tmp_path):
    """A directory whose build/ holds a file that is not a library: loading
    it would fail loudly."""
    work = tmp_path / "work" / "sub"
    work.mkdir(parents=True)
    for d in (tmp_path / "work", work):
        (d / "build").mkdir()
        for name in ("libkvpage.so", "libkvpage.so.0"):
            (d / "build" / name).write_text("not a library")
    return work


def test_current_directory_is_never_searched(tmp_path):
    work = _planted_build_tree(tmp_path)
    r = _python("import kvpage; print(kvpage.library_path)", work, KVPAGE_LIBRARY=None,
                PYTHONPATH=str(PACKAGE))
    assert str(tmp_path) not in r.stdout + r.stderr
    if r.returncode != 0:  # no library installed with this checkout's package nor on the system
        assert "could not load libkvpage" in r.stderr
        assert "installed with the package" in r.stderr and "system loader" in r.stderr


def test_the_package_copy_comes_before_the_system(tmp_path):
    """A package with its own libkvpage.so.0 (as `pip install` makes it) loads
    that copy, from any directory, with KVPAGE_LIBRARY unset."""
    site = tmp_path / "site"
    shutil.copytree(PACKAGE / "kvpage", site / "kvpage",
                    ignore=shutil.ignore_patterns("__pycache__", "libkvpage.so*"))
    shutil.copyfile(kvpage.library_path, site / "kvpage" / _lib.BUNDLED_NAME)
    work = _planted_build_tree(tmp_path)
    r = _python("import kvpage; print(kvpage.library_path)", work, KVPAGE_LIBRARY=None,
                PYTHONPATH=str(site))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(site / "kvpage" / _lib.BUNDLED_NAME)
    # KVPAGE_LIBRARY still comes first
    r = _python("import kvpage; print(kvpage.library_path)", work,
                KVPAGE_LIBRARY=kvpage.library_path, PYTHONPATH=str(site))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == kvpage.library_path


def test_build_features():
    assert kvpage.build_has(kvpage.Feature.CUDA) == kvpage.build_has_cuda()
    assert kvpage.build_has(12345) is False


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


def test_then_the_system_library(tmp_path):
    """Without KVPAGE_LIBRARY nor a copy in the package, the dynamic loader's
    libkvpage.so.0 (here through LD_LIBRARY_PATH) is loaded, and
    library_path names its file."""
    site = tmp_path / "site"
    shutil.copytree(PACKAGE / "kvpage", site / "kvpage",
                    ignore=shutil.ignore_patterns("__pycache__", "libkvpage.so*"))
    libdir = tmp_path / "lib"
    libdir.mkdir()
    shutil.copyfile(kvpage.library_path, libdir / "libkvpage.so.0")
    work = _planted_build_tree(tmp_path)
    ld = os.pathsep.join(filter(None, [str(libdir), os.environ.get("LD_LIBRARY_PATH")]))
    r = _python("import kvpage; print(kvpage.library_path)", work, KVPAGE_LIBRARY=None,
                PYTHONPATH=str(site), LD_LIBRARY_PATH=ld)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(libdir / "libkvpage.so.0")
