"""Loading libkvpage through ctypes, and the C structs mirrored field by field.

The shared library is looked for, in this order:

1. ``KVPAGE_LIBRARY``: the path of a libkvpage shared library (a build
   tree's ``build/libkvpage.so.0.x.y``, a sanitized build, ...). When it is
   set, nothing else is tried: an explicit choice that fails is an error;
2. the copy inside this package (``kvpage/libkvpage.so.0``), which
   ``pip install ./bindings/python`` builds from the repository's C sources;
3. the system's ``libkvpage.so.0`` through the dynamic loader (``make
   install``, ``LD_LIBRARY_PATH``), then whatever
   ``ctypes.util.find_library("kvpage")`` names.

The current directory and its parents are never searched, so a stale or
planted ``build/`` cannot shadow the real library. When nothing loads,
:class:`LibraryNotFound` lists every place that was tried; a library of
another version raises :class:`LibraryMismatch`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

#: The library version these bindings were written for (``kvp_version_number``).
#: Before 1.0 the layered headers may change in a minor release, so the major
#: and minor versions must match exactly; from 1.0 on the same major version
#: with at least this minor version is accepted. The patch level is not checked.
EXPECTED_VERSION = (0, 2, 0)

_SONAME = f"libkvpage.so.{EXPECTED_VERSION[0]}"

#: File name of the copy installed inside the package.
BUNDLED_NAME = _SONAME


class LibraryNotFound(ImportError):
    """libkvpage could not be loaded; the message lists what was tried."""


class LibraryMismatch(ImportError):
    """The library that loaded is not the version these bindings need."""


def bundled_path() -> Path:
    """Where ``pip install`` puts the package's own copy of the library."""
    return Path(__file__).resolve().parent / BUNDLED_NAME


def _candidates() -> list[tuple[str, str]]:
    env = os.environ.get("KVPAGE_LIBRARY")
    if env:
        return [("KVPAGE_LIBRARY", env)]
    out = [("installed with the package", str(bundled_path())),
           ("system loader", _SONAME)]
    found = ctypes.util.find_library("kvpage")
    if found and found != _SONAME:
        out.append(("ctypes.util.find_library", found))
    return out


def _load() -> tuple[ctypes.CDLL, str]:
    tried = []
    for how, where in _candidates():
        if how == "installed with the package" and not os.path.exists(where):
            tried.append(f"  {how}: {where} (no such file)")
            continue
        try:
            return ctypes.CDLL(where), where
        except OSError as e:
            tried.append(f"  {how}: {where} ({e})")
    raise LibraryNotFound(
        "kvpage: could not load libkvpage. Install the bindings with "
        "`pip install ./bindings/python` (it builds the library), install the library "
        "(`make install`), or set KVPAGE_LIBRARY=/path/to/libkvpage.so. Tried:\n"
        + "\n".join(tried)
    )


def _loaded_path(cdll: ctypes.CDLL, where: str) -> str:
    """The file a library was loaded from (the loader resolves a bare soname)."""
    if os.sep in where:
        return os.path.abspath(where)
    try:
        info = _DlInfo()
        libdl = ctypes.CDLL(None)
        libdl.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        addr = ctypes.cast(cdll.kvp_version_number, ctypes.c_void_p)
        if libdl.dladdr(addr, ctypes.byref(info)) and info.dli_fname:
            return os.path.abspath(info.dli_fname.decode())
    except (AttributeError, OSError):
        pass
    return where


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def version_ok(number: int, want: tuple[int, int, int] = EXPECTED_VERSION) -> bool:
    """Whether a ``kvp_version_number()`` value suits bindings written for ``want``."""
    major, minor = number // 10000, number // 100 % 100
    if major != want[0]:
        return False
    return minor == want[1] if major == 0 else minor >= want[1]


def _check_version(cdll: ctypes.CDLL, where: str) -> None:
    try:
        fn = cdll.kvp_version_number
    except AttributeError:
        raise LibraryMismatch(f"kvpage: {where} is not libkvpage (no kvp_version_number)") \
            from None
    fn.restype, fn.argtypes = ctypes.c_uint, []
    n = fn()
    if not version_ok(n):
        want = EXPECTED_VERSION
        need = (f"{want[0]}.{want[1]}.x" if want[0] == 0 else
                f"{want[0]}.{want[1]} or a later {want[0]}.x")
        raise LibraryMismatch(
            f"kvpage: {where} is libkvpage {n // 10000}.{n // 100 % 100}.{n % 100}, but these "
            f"bindings (kvpage {'.'.join(map(str, want))}) need libkvpage {need}. Reinstall "
            "the bindings from the same checkout as the library (`pip install "
            "./bindings/python`), or point KVPAGE_LIBRARY at a matching build."
        )


lib, _where = _load()
#: The file the library was loaded from.
path = _loaded_path(lib, _where)
_check_version(lib, path)

# ---- structs (must match include/kvpage.h field for field) --------------------

c_i32 = ctypes.c_int32
c_u32 = ctypes.c_uint32
c_u64 = ctypes.c_uint64
c_dbl = ctypes.c_double
c_char_p = ctypes.c_char_p


class Allocator(ctypes.Structure):
    _fields_ = [("alloc", ctypes.c_void_p), ("free", ctypes.c_void_p), ("opaque", ctypes.c_void_p)]


class LayoutC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("layers", c_i32),
        ("kv_heads", c_i32),
        ("head_dim", c_i32),
        ("page_size", c_i32),
        ("k_format", c_i32),
        ("v_format", c_i32),
        ("needs_staging", c_i32),
        ("k_block_bytes", c_u64),
        ("v_block_bytes", c_u64),
        ("page_bytes", c_u64),
        ("staging_page_bytes", c_u64),
        ("fixed_bytes", c_u64),
        ("element_bytes_per_token", c_u64),
        ("bytes_per_token", c_dbl),
    ]


class PlanParamsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("layers", c_i32),
        ("kv_heads", c_i32),
        ("head_dim", c_i32),
        ("q_heads", c_i32),
        ("k_format", c_i32),
        ("v_format", c_i32),
        ("page_size", c_i32),
        ("context", c_u64),
        ("kv_budget_bytes", c_u64),
        ("memory_bytes", c_u64),
        ("weight_bytes", c_u64),
        ("reserve_bytes", c_u64),
        ("utilization", c_dbl),
    ]


class PlanC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("k_format", c_i32),
        ("v_format", c_i32),
        ("page_size", c_i32),
        ("needs_staging", c_i32),
        ("reserved_", c_i32),
        ("kv_budget_bytes", c_u64),
        ("bytes_per_token", c_u64),
        ("bytes_per_token_stored", c_dbl),
        ("bytes_per_token_per_layer", c_dbl),
        ("page_bytes", c_u64),
        ("staging_page_bytes", c_u64),
        ("fixed_bytes", c_u64),
        ("num_pages", c_u64),
        ("num_staging", c_u64),
        ("arena_bytes", c_u64),
        ("max_tokens", c_u64),
        ("context", c_u64),
        ("pages_per_seq", c_u64),
        ("seq_bytes", c_u64),
        ("max_seqs", c_u64),
    ]


class ModelPresetC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("name", c_char_p),
        ("source", c_char_p),
        ("layers", c_i32),
        ("q_heads", c_i32),
        ("kv_heads", c_i32),
        ("head_dim", c_i32),
        ("max_context", c_i32),
        ("reserved_", c_i32),
        ("params", c_u64),
    ]


class GpuPresetC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("reserved_", c_i32),
        ("name", c_char_p),
        ("description", c_char_p),
        ("memory_bytes", c_u64),
    ]


class CudaDeviceInfoC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("device", c_i32),
        ("cc_major", c_i32),
        ("cc_minor", c_i32),
        ("sm_count", c_i32),
        ("runtime_version", c_i32),
        ("driver_version", c_i32),
        ("reserved_", c_i32),
        ("total_bytes", c_u64),
        ("free_bytes", c_u64),
        ("name", ctypes.c_char * 256),
    ]


class KvViewC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("batch", c_i32),
        ("page_size", c_i32),
        ("num_pages", c_i32),
        ("num_staging", c_i32),
        ("reserved_", c_i32),
        ("indptr", ctypes.POINTER(c_i32)),
        ("indices", ctypes.POINTER(c_i32)),
        ("last_page_len", ctypes.POINTER(c_i32)),
    ]


class PageOpC(ctypes.Structure):
    _fields_ = [("kind", c_i32), ("src", c_i32), ("dst", c_i32), ("count", c_i32), ("row", c_i32)]


#: Structs a test compares with the C compiler's sizeof/offsetof.
MIRRORED = {
    "kvp_allocator_t": Allocator,
    "kvp_layout_t": LayoutC,
    "kvp_plan_params_t": PlanParamsC,
    "kvp_plan_t": PlanC,
    "kvp_model_preset_t": ModelPresetC,
    "kvp_gpu_preset_t": GpuPresetC,
    "kvp_cuda_device_info_t": CudaDeviceInfoC,
    "kvp_kv_view_t": KvViewC,
    "kvp_page_op_t": PageOpC,
}

# ---- function signatures --------------------------------------------------------

_sz = ctypes.c_size_t
_vp = ctypes.c_void_p
ERR_SIZE = 256


#: Every function the bindings call, in declaration order (a test checks that
#: the headers declare each of them).
DECLARED: list[str] = []
_MISSING: list[str] = []


def _sig(name, restype, *argtypes):
    DECLARED.append(name)
    try:
        fn = getattr(lib, name)
    except AttributeError:  # reported all together at the end of this module
        _MISSING.append(name)
        return None
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


_sig("kvp_version_number", ctypes.c_uint)
_sig("kvp_version_string", c_char_p)
_sig("kvp_strerror", c_char_p, ctypes.c_int)
_sig("kvp_status_name", c_char_p, ctypes.c_int)
_sig("kvp_format_name", c_char_p, c_i32)
_sig("kvp_format_parse", ctypes.c_int, c_char_p, ctypes.POINTER(c_i32), c_char_p, _sz)
_sig("kvp_layout_compute", ctypes.c_int, c_i32, c_i32, c_i32, c_i32, c_i32, c_i32,
     ctypes.POINTER(LayoutC), c_char_p, _sz)
_sig("kvp_arena_bytes", ctypes.c_int, ctypes.POINTER(LayoutC), c_u64, c_u64,
     ctypes.POINTER(c_u64), c_char_p, _sz)
_sig("kvp_plan_params_init", None, ctypes.POINTER(PlanParamsC))
_sig("kvp_plan_compute", ctypes.c_int, ctypes.POINTER(PlanParamsC), ctypes.POINTER(PlanC),
     c_char_p, _sz)
_sig("kvp_model_preset_count", c_i32)
_sig("kvp_model_preset_get", ctypes.c_int, c_i32, ctypes.POINTER(ModelPresetC))
_sig("kvp_model_preset_find", ctypes.c_int, c_char_p, ctypes.POINTER(ModelPresetC), c_char_p, _sz)
_sig("kvp_gpu_preset_count", c_i32)
_sig("kvp_gpu_preset_get", ctypes.c_int, c_i32, ctypes.POINTER(GpuPresetC))
_sig("kvp_gpu_preset_find", ctypes.c_int, c_char_p, ctypes.POINTER(GpuPresetC), c_char_p, _sz)
_sig("kvp_weight_bytes", ctypes.c_int, c_u64, c_char_p, ctypes.POINTER(c_u64), c_char_p, _sz)
_sig("kvp_parse_size", ctypes.c_int, c_char_p, ctypes.POINTER(c_u64), c_char_p, _sz)
_sig("kvp_build_has", ctypes.c_int, c_i32)
_sig("kvp_cuda_device_count", ctypes.c_int, ctypes.POINTER(c_i32), c_char_p, _sz)
_sig("kvp_cuda_device_query", ctypes.c_int, c_i32, ctypes.POINTER(CudaDeviceInfoC), c_char_p, _sz)




def new_struct(cls):
    """An instance of a struct_size-first struct with struct_size set."""
    s = cls()
    s.struct_size = ctypes.sizeof(cls)
    return s


# ---- scheduler ---------------------------------------------------------------------

class SchedParamsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("page_size", c_i32),
        ("needs_staging", c_i32),
        ("max_requests", c_i32),
        ("max_batch", c_i32),
        ("token_budget", c_i32),
        ("max_prefill_chunk", c_i32),
        ("horizon", c_i32),
        ("hysteresis", c_i32),
        ("actions", c_i32),
        ("drop_below_priority", c_i32),
        ("total_pages", ctypes.c_int64),
        ("watermark_pages", ctypes.c_int64),
        ("max_queue_delay", ctypes.c_int64),
        ("page_bytes", c_u64),
        ("staging_page_bytes", c_u64),
        ("host_bytes_per_s", c_dbl),
        ("prefill_tokens_per_s", c_dbl),
        ("allocator", Allocator),
    ]


class SchedRequestC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("priority", c_i32),
        ("id", ctypes.c_int64),
        ("prompt_tokens", ctypes.c_int64),
        ("max_new_tokens", ctypes.c_int64),
        ("cached_tokens", ctypes.c_int64),
        ("arrival", ctypes.c_int64),
        ("deadline", ctypes.c_int64),
    ]


class SchedInputC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("reserved_", c_i32),
        ("free_pages", ctypes.c_int64),
        ("free_staging", ctypes.c_int64),
        ("host_free_bytes", c_u64),
        ("now", ctypes.c_int64),
    ]


class SchedItemC(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int64), ("tokens", c_i32), ("reason", c_i32),
                ("start", ctypes.c_int64)]


class SchedPlanC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("n_swap_out", c_i32),
        ("n_preempt", c_i32),
        ("n_drop", c_i32),
        ("n_swap_in", c_i32),
        ("n_prefill", c_i32),
        ("n_decode", c_i32),
        ("n_reject", c_i32),
        ("n_finished", c_i32),
        ("pressure", c_i32),
        ("swap_out", ctypes.POINTER(SchedItemC)),
        ("preempt", ctypes.POINTER(SchedItemC)),
        ("drop", ctypes.POINTER(SchedItemC)),
        ("swap_in", ctypes.POINTER(SchedItemC)),
        ("prefill", ctypes.POINTER(SchedItemC)),
        ("decode", ctypes.POINTER(ctypes.c_int64)),
        ("reject", ctypes.POINTER(SchedItemC)),
        ("finished", ctypes.POINTER(ctypes.c_int64)),
        ("pages_needed", ctypes.c_int64),
        ("forecast_pages", ctypes.c_int64),
    ]


class SchedStatsC(ctypes.Structure):
    _fields_ = [("struct_size", c_u32), ("reserved_", c_i32)] + [
        (n, ctypes.c_int64) for n in ("waiting", "running", "swapped", "steps", "admitted",
                                      "swap_outs", "swap_ins", "preemptions", "drops",
                                      "rejects", "finished")]


MIRRORED.update({
    "kvp_sched_params_t": SchedParamsC,
    "kvp_sched_request_t": SchedRequestC,
    "kvp_sched_input_t": SchedInputC,
    "kvp_sched_item_t": SchedItemC,
    "kvp_sched_plan_t": SchedPlanC,
    "kvp_sched_stats_t": SchedStatsC,
})

_P = ctypes.POINTER
_sig("kvp_sched_params_init", None, _P(SchedParamsC))
_sig("kvp_sched_create", ctypes.c_int, _P(SchedParamsC), _P(_vp), c_char_p, _sz)
_sig("kvp_sched_destroy", None, _vp)
_sig("kvp_sched_last_error", c_char_p, _vp)
_sig("kvp_sched_submit", ctypes.c_int, _vp, _P(SchedRequestC))
_sig("kvp_sched_finish", ctypes.c_int, _vp, ctypes.c_int64)
_sig("kvp_sched_step", ctypes.c_int, _vp, _P(SchedInputC), _P(SchedPlanC))
_sig("kvp_sched_stats", ctypes.c_int, _vp, _P(SchedStatsC))


# ---- pool and table ---------------------------------------------------------------

class PoolParamsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("page_size", c_i32),
        ("num_pages", c_i32),
        ("num_staging", c_i32),
        ("prefix_cache", c_i32),
        ("reserved_", c_i32),
        ("hash_seed", c_u64),
        ("allocator", Allocator),
    ]


class PoolStatsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("page_size", c_i32),
        ("total_pages", ctypes.c_int64),
        ("used_pages", ctypes.c_int64),
        ("cached_pages", ctypes.c_int64),
        ("free_pages", ctypes.c_int64),
        ("reserved_pages", ctypes.c_int64),
        ("available_pages", ctypes.c_int64),
        ("total_staging", ctypes.c_int64),
        ("used_staging", ctypes.c_int64),
        ("live_seqs", ctypes.c_int64),
        ("live_tokens", ctypes.c_int64),
        ("utilization", c_dbl),
        ("prefix_lookups", c_u64),
        ("prefix_hit_tokens", c_u64),
        ("prefix_miss_tokens", c_u64),
        ("pages_stored", c_u64),
        ("pages_evicted", c_u64),
    ]


class PoolEventC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("kind", c_i32),
        ("page", c_i32),
        ("parent", c_i32),
        ("priority", c_i32),
        ("reserved_", c_i32),
        ("hash", c_u64),
    ]


PoolEventFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(PoolEventC))


class SeqInfoC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("num_pages", c_i32),
        ("length", ctypes.c_int64),
        ("last_page_len", c_i32),
        ("staging_page", c_i32),
        ("reserved_tokens", ctypes.c_int64),
        ("reserved_pages", c_i32),
        ("priority", c_i32),
        ("salt", c_u64),
        ("swapped", c_i32),
        ("reserved_", c_i32),
    ]


class BatchBuffersC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("reserved_", c_i32),
        ("indptr", _vp),
        ("indices", _vp),
        ("last_page_len", _vp),
        ("slot_mapping", _vp),
        ("qo_indptr", _vp),
        ("indices_capacity", ctypes.c_int64),
        ("slots_capacity", ctypes.c_int64),
    ]


MIRRORED.update({
    "kvp_pool_params_t": PoolParamsC,
    "kvp_pool_stats_t": PoolStatsC,
    "kvp_pool_event_t": PoolEventC,
    "kvp_seq_info_t": SeqInfoC,
    "kvp_batch_buffers_t": BatchBuffersC,
})

_i32p = ctypes.POINTER(c_i32)
_i64p = ctypes.POINTER(ctypes.c_int64)
_sig("kvp_pool_params_init", None, _P(PoolParamsC))
_sig("kvp_pool_create", ctypes.c_int, _P(PoolParamsC), _P(_vp), c_char_p, _sz)
_sig("kvp_pool_create_from_plan", ctypes.c_int, _P(PlanC), _P(PoolParamsC), _P(_vp), c_char_p,
     _sz)
_sig("kvp_pool_destroy", None, _vp)
_sig("kvp_pool_last_error", c_char_p, _vp)
_sig("kvp_pool_alloc", ctypes.c_int, _vp, c_i32, _i32p)
_sig("kvp_pool_alloc_staging", ctypes.c_int, _vp, c_i32, _i32p)
_sig("kvp_pool_retain", ctypes.c_int, _vp, c_i32, _i32p)
_sig("kvp_pool_release", ctypes.c_int, _vp, c_i32, _i32p)
_sig("kvp_pool_refcount", ctypes.c_int, _vp, c_i32, _i32p)
_sig("kvp_pool_evict", ctypes.c_int, _vp, c_i32, _i32p)
_sig("kvp_pool_stats", ctypes.c_int, _vp, _P(PoolStatsC))
_sig("kvp_pool_set_event_callback", ctypes.c_int, _vp, PoolEventFn, _vp)
_sig("kvp_table_create", ctypes.c_int, _vp, c_i32, _P(_vp), c_char_p, _sz)
_sig("kvp_table_destroy", None, _vp)
_sig("kvp_table_last_error", c_char_p, _vp)
_sig("kvp_table_seq_create", ctypes.c_int, _vp, c_i32, c_u64, _i32p)
_sig("kvp_table_seq_release", ctypes.c_int, _vp, c_i32)
_sig("kvp_table_reserve", ctypes.c_int, _vp, c_i32, ctypes.c_int64)
_sig("kvp_table_append", ctypes.c_int, _vp, c_i32, ctypes.c_int64, _i32p, _i64p, _P(PageOpC),
     c_i32, _i32p)
_sig("kvp_table_truncate", ctypes.c_int, _vp, c_i32, ctypes.c_int64, _P(PageOpC), c_i32, _i32p)
_sig("kvp_table_fork", ctypes.c_int, _vp, c_i32, _i32p, _P(PageOpC), c_i32, _i32p)
_sig("kvp_table_attach_prefix", ctypes.c_int, _vp, c_i32, _i32p, ctypes.c_int64, _i64p)
_sig("kvp_table_lookup_prefix", ctypes.c_int, _vp, c_u64, _i32p, ctypes.c_int64, _i64p)
_sig("kvp_table_set_priority", ctypes.c_int, _vp, c_i32, c_i32)
_sig("kvp_table_set_range_priority", ctypes.c_int, _vp, c_i32, ctypes.c_int64, ctypes.c_int64,
     c_i32)
_sig("kvp_table_seq_info", ctypes.c_int, _vp, c_i32, _P(SeqInfoC))
_sig("kvp_table_seq_pages", ctypes.c_int, _vp, c_i32, _i32p, c_i32)
_sig("kvp_table_export_size", ctypes.c_int, _vp, _i32p, c_i32, _i32p, _i64p, _i64p)
_sig("kvp_table_export", ctypes.c_int, _vp, _i32p, c_i32, _i32p, _P(BatchBuffersC),
     _P(KvViewC))


# ---- store, quantize, context, attention, cache -------------------------------------

class StoreParamsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("layers", c_i32),
        ("kv_heads", c_i32),
        ("head_dim", c_i32),
        ("page_size", c_i32),
        ("k_format", c_i32),
        ("v_format", c_i32),
        ("k_order", c_i32),
        ("num_pages", c_u64),
        ("num_staging", c_u64),
        ("allocator", Allocator),
    ]


class RegionC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("format", c_i32),
        ("order", c_i32),
        ("first_page", c_i32),
        ("base", _vp),
        ("pages", c_u64),
        ("page_stride", c_u64),
        ("head_stride", c_u64),
        ("block_bytes", c_u64),
        ("scale_offset", c_u64),
        ("token_stride", c_u64),
        ("dim_stride", c_u64),
    ]


class StoreInfoC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("backend", c_i32),
        ("device", c_i32),
        ("k_order", c_i32),
        ("num_pages", c_i32),
        ("num_staging", c_i32),
        ("arena", _vp),
        ("arena_bytes", c_u64),
    ]


class AppendC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("layer", c_i32),
        ("rows", c_i32),
        ("dtype", c_i32),
        ("k", _vp),
        ("v", _vp),
        ("k_row_stride", ctypes.c_int64),
        ("v_row_stride", ctypes.c_int64),
        ("slots", _vp),
        ("ops", _vp),
        ("num_ops", c_i32),
        ("reserved_", c_i32),
    ]


class QuantDescC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("format", c_i32),
        ("is_value", c_i32),
        ("k_order", c_i32),
        ("page_size", c_i32),
        ("head_dim", c_i32),
        ("heads", c_i32),
        ("dtype", c_i32),
        ("fp8_scale", ctypes.c_float),
        ("reserved_", c_i32),
    ]


class CtxParamsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("threads", c_i32),
        ("isa", c_i32),
        ("reserved_", c_i32),
        ("workspace_bytes", c_u64),
        ("allocator", Allocator),
    ]


class CtxInfoC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("backend", c_i32),
        ("device", c_i32),
        ("isa", c_i32),
        ("threads", c_i32),
        ("reserved_", c_i32),
        ("workspace_bytes", c_u64),
    ]


class AttentionParamsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("layer", c_i32),
        ("q_heads", c_i32),
        ("dtype", c_i32),
        ("causal", c_i32),
        ("window_left", c_i32),
        ("sm_scale", ctypes.c_float),
        ("logit_soft_cap", ctypes.c_float),
        ("qo_indptr", _vp),
        ("q", _vp),
        ("out", _vp),
        ("lse", _vp),
    ]


class CacheParamsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("layers", c_i32),
        ("kv_heads", c_i32),
        ("head_dim", c_i32),
        ("page_size", c_i32),
        ("k_format", c_i32),
        ("v_format", c_i32),
        ("k_order", c_i32),
        ("max_seqs", c_i32),
        ("prefix_cache", c_i32),
        ("threads", c_i32),
        ("isa", c_i32),
        ("reserved_", c_i32),
        ("num_pages", ctypes.c_int64),
        ("kv_budget_bytes", c_u64),
        ("hash_seed", c_u64),
        ("host_bytes", c_u64),
        ("allocator", Allocator),
    ]


class CachePartsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("reserved_", c_i32),
        ("pool", _vp),
        ("table", _vp),
        ("store", _vp),
        ("ctx", _vp),
        ("tier", _vp),
    ]


MIRRORED.update({
    "kvp_store_params_t": StoreParamsC,
    "kvp_store_info_t": StoreInfoC,
    "kvp_ctx_info_t": CtxInfoC,
    "kvp_cache_parts_t": CachePartsC,
    "kvp_region_t": RegionC,
    "kvp_append_params_t": AppendC,
    "kvp_quant_desc_t": QuantDescC,
    "kvp_ctx_params_t": CtxParamsC,
    "kvp_attention_params_t": AttentionParamsC,
    "kvp_cache_params_t": CacheParamsC,
})

_sig("kvp_store_params_init", None, _P(StoreParamsC))
_sig("kvp_store_create", ctypes.c_int, _P(StoreParamsC), _P(_vp), c_char_p, _sz)
_sig("kvp_store_destroy", None, _vp)
_sig("kvp_store_last_error", c_char_p, _vp)
_sig("kvp_store_layout", ctypes.c_int, _vp, _P(LayoutC))
_sig("kvp_store_info", ctypes.c_int, _vp, _P(StoreInfoC))
_sig("kvp_store_region", ctypes.c_int, _vp, c_i32, c_i32, _P(RegionC))
_sig("kvp_store_set_fp8_scale", ctypes.c_int, _vp, c_i32, c_i32, c_i32, ctypes.c_float)
_sig("kvp_store_get_fp8_scale", ctypes.c_int, _vp, c_i32, c_i32, c_i32, _P(ctypes.c_float))
_sig("kvp_append_params_init", None, _P(AppendC))
_sig("kvp_store_append", ctypes.c_int, _vp, _P(AppendC))
_sig("kvp_store_apply_ops", ctypes.c_int, _vp, _P(PageOpC), c_i32)
_sig("kvp_store_read", ctypes.c_int, _vp, c_i32, c_i32, c_i32, c_i32, _P(ctypes.c_float),
     _P(ctypes.c_float))
_sig("kvp_store_nonfinite_count", ctypes.c_int, _vp, _P(c_u64))
_sig("kvp_quant_block_bytes", ctypes.c_int, _P(QuantDescC), _P(c_u64), c_char_p, _sz)
_sig("kvp_quantize", ctypes.c_int, _P(QuantDescC), _vp, ctypes.c_int64, _vp, c_char_p, _sz)
_sig("kvp_dequantize", ctypes.c_int, _P(QuantDescC), _vp, ctypes.c_int64, _vp, c_char_p, _sz)
_sig("kvp_ctx_params_init", None, _P(CtxParamsC))
_sig("kvp_ctx_create", ctypes.c_int, _P(CtxParamsC), _P(_vp), c_char_p, _sz)
_sig("kvp_ctx_destroy", None, _vp)
_sig("kvp_ctx_last_error", c_char_p, _vp)
_sig("kvp_ctx_info", ctypes.c_int, _vp, _P(CtxInfoC))
_sig("kvp_isa_name", c_char_p, c_i32)
_sig("kvp_isa_supported", ctypes.c_int, c_i32)
_sig("kvp_attention_params_init", None, _P(AttentionParamsC))
_sig("kvp_attention", ctypes.c_int, _vp, _vp, _P(KvViewC), _P(AttentionParamsC))
_sig("kvp_cache_params_init", None, _P(CacheParamsC))
_sig("kvp_cache_create", ctypes.c_int, _P(CacheParamsC), _P(_vp), c_char_p, _sz)
_sig("kvp_cache_destroy", None, _vp)
_sig("kvp_cache_last_error", c_char_p, _vp)
_sig("kvp_cache_parts", ctypes.c_int, _vp, _P(CachePartsC))
_sig("kvp_cache_seq_create", ctypes.c_int, _vp, c_i32, c_u64, _i32p)
_sig("kvp_cache_seq_release", ctypes.c_int, _vp, c_i32)
_sig("kvp_cache_seq_attach_prefix", ctypes.c_int, _vp, c_i32, _i32p, ctypes.c_int64, _i64p)
_sig("kvp_cache_seq_fork", ctypes.c_int, _vp, c_i32, _i32p)
_sig("kvp_cache_seq_truncate", ctypes.c_int, _vp, c_i32, ctypes.c_int64)
_sig("kvp_cache_begin_step", ctypes.c_int, _vp, _i32p, c_i32, _i32p, _i32p)
_sig("kvp_cache_write", ctypes.c_int, _vp, c_i32, c_i32, _vp, _vp, ctypes.c_int64,
     ctypes.c_int64)
_sig("kvp_cache_attend", ctypes.c_int, _vp, _P(AttentionParamsC))
_sig("kvp_cache_seq_swap_out", ctypes.c_int, _vp, c_i32)
_sig("kvp_cache_seq_swap_in", ctypes.c_int, _vp, c_i32)
_sig("kvp_cache_step_view", ctypes.c_int, _vp, _P(KvViewC), _P(_i64p), _P(_i32p), _i32p)


# ---- host tier -------------------------------------------------------------------------

#: int copy_to_host(void *opaque, int32_t page, uint64_t offset, void *dst, uint64_t bytes)
COPY_TO_HOST = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, c_i32, c_u64, ctypes.c_void_p,
                                c_u64)
#: int copy_from_host(void *opaque, int32_t page, uint64_t offset, const void *src, uint64_t bytes)
COPY_FROM_HOST = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, c_i32, c_u64, ctypes.c_void_p,
                                  c_u64)


class PageIoC(ctypes.Structure):
    _fields_ = [("struct_size", c_u32), ("reserved_", c_i32), ("copy_to_host", COPY_TO_HOST),
                ("copy_from_host", COPY_FROM_HOST), ("opaque", ctypes.c_void_p)]


class TierParamsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("reserved_", c_i32),
        ("host_bytes", c_u64),
        ("layout", ctypes.POINTER(LayoutC)),
        ("page_io", ctypes.POINTER(PageIoC)),
        ("allocator", Allocator),
        ("host_allocator", Allocator),
    ]


class TierSeqInfoC(ctypes.Structure):
    _fields_ = [("struct_size", c_u32)] + [
        (n, c_i32) for n in ("swapped", "private_pages", "shared_pages", "host_slots", "ops",
                             "staging", "reserved_")] + [
        ("host_bytes", c_u64), ("copy_bytes", c_u64)]


class TierStatsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("staging_chunks", c_i32),
        ("slot_bytes", c_u64),
        ("staging_bytes", c_u64),
        ("host_bytes", c_u64),
        ("total_slots", ctypes.c_int64),
        ("free_slots", ctypes.c_int64),
        ("free_bytes", c_u64),
        ("swapped_seqs", ctypes.c_int64),
        ("swapped_tokens", ctypes.c_int64),
    ] + [(n, c_u64) for n in ("swap_outs", "swap_ins", "drops", "pages_out", "pages_in",
                              "pages_kept", "pages_reattached", "bytes_out", "bytes_in")]


MIRRORED.update({
    "kvp_page_io_t": PageIoC,
    "kvp_tier_params_t": TierParamsC,
    "kvp_tier_seq_info_t": TierSeqInfoC,
    "kvp_tier_stats_t": TierStatsC,
})

_sig("kvp_tier_params_init", None, _P(TierParamsC))
_sig("kvp_tier_create", ctypes.c_int, _vp, _P(TierParamsC), _P(_vp), c_char_p, _sz)
_sig("kvp_tier_destroy", None, _vp)
_sig("kvp_tier_last_error", c_char_p, _vp)
_sig("kvp_tier_swap_out", ctypes.c_int, _vp, c_i32, _P(PageOpC), c_i32, _P(c_i32))
_sig("kvp_tier_swap_in", ctypes.c_int, _vp, c_i32, _P(PageOpC), c_i32, _P(c_i32))
_sig("kvp_tier_drop", ctypes.c_int, _vp, c_i32)
_sig("kvp_tier_seq_info", ctypes.c_int, _vp, c_i32, _P(TierSeqInfoC))
_sig("kvp_tier_stats", ctypes.c_int, _vp, _P(TierStatsC))
_sig("kvp_tier_host_memory", ctypes.c_int, _vp, _P(_vp), _P(c_u64))


# ---- store page I/O and the CUDA backend ------------------------------------------------

_sig("kvp_store_page_to_host", ctypes.c_int, _vp, c_i32, c_u64, _vp, c_u64)
_sig("kvp_store_page_from_host", ctypes.c_int, _vp, c_i32, c_u64, _vp, c_u64)
_sig("kvp_store_page_check", ctypes.c_int, _vp, c_i32, _vp, c_u64)
_sig("kvp_store_synchronize", ctypes.c_int, _vp)
_sig("kvp_store_page_io", ctypes.c_int, _vp, _P(PageIoC))


class CudaAllocatorC(ctypes.Structure):
    _fields_ = [("alloc", _vp), ("free", _vp), ("opaque", _vp)]


class CudaParamsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("device", c_i32),
        ("stream", _vp),
        ("arena", _vp),
        ("arena_bytes", c_u64),
        ("staging_bytes", c_u64),
        ("allocator", CudaAllocatorC),
    ]


MIRRORED.update({
    "kvp_cuda_allocator_t": CudaAllocatorC,
    "kvp_cuda_params_t": CudaParamsC,
})

_sig("kvp_cuda_params_init", None, _P(CudaParamsC))
_sig("kvp_cuda_store_create", ctypes.c_int, _P(StoreParamsC), _P(CudaParamsC), _P(_vp), c_char_p,
     _sz)
_sig("kvp_cuda_ctx_create", ctypes.c_int, _P(CtxParamsC), _P(CudaParamsC), _P(_vp), c_char_p, _sz)
_sig("kvp_cuda_store_set_stream", ctypes.c_int, _vp, _vp)
_sig("kvp_cuda_ctx_set_stream", ctypes.c_int, _vp, _vp)
_sig("kvp_cuda_ctx_set_timing", ctypes.c_int, _vp, ctypes.c_int)
_sig("kvp_cuda_ctx_kernel_time", ctypes.c_int, _vp, _P(ctypes.c_double))
_sig("kvp_cuda_ctx_set_pipeline", ctypes.c_int, _vp, ctypes.c_int)
_sig("kvp_cuda_quantize", ctypes.c_int, _P(QuantDescC), _vp, ctypes.c_int64, _vp, _vp, c_char_p,
     _sz)
_sig("kvp_cuda_dequantize", ctypes.c_int, _P(QuantDescC), _vp, ctypes.c_int64, _vp, _vp,
     c_char_p, _sz)
_sig("kvp_cuda_host_alloc", ctypes.c_int, c_u64, _P(_vp), c_char_p, _sz)
_sig("kvp_cuda_host_free", None, _vp)
_sig("kvp_cuda_cache_create", ctypes.c_int, _P(CacheParamsC), _P(CudaParamsC), _P(_vp), c_char_p, _sz)



# ---- page blobs, blob tiers and the cache's use of them (kvpage_blob.h) ------------------

#: Bytes of a blob's header, of a fingerprint, of a chain hash; most bytes of a key;
#: number of ``kvp_blob_reason`` values.
BLOB_HEADER_BYTES = 192
FINGERPRINT_BYTES = 32
HASH_BYTES = 32
BLOB_MAX_KEY_BYTES = 64
BLOB_REASONS = 14


class HashC(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint8 * HASH_BYTES)]


class BlobParamsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("shard_index", c_i32),
        ("shard_count", c_i32),
        ("auth_key_bytes", c_i32),
        ("fingerprint", ctypes.c_uint8 * FINGERPRINT_BYTES),
        ("auth_key", _vp),
        ("allocator", Allocator),
    ]


class BlobInfoC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("staging", c_i32),
        ("tokens", c_i32),
        ("reserved_", c_i32),
        ("payload_bytes", c_u64),
        ("hash", HashC),
    ]


class BlobStatsC(ctypes.Structure):
    _fields_ = [("struct_size", c_u32), ("reserved_", c_i32)] + [
        (n, c_u64) for n in ("exported", "imported", "rejected", "bytes_out", "bytes_in")] + [
        ("rejects", c_u64 * BLOB_REASONS)]


#: int get(void *self, int32_t n, const kvp_hash_t *keys, void *const *bufs,
#:         const uint64_t *caps, uint64_t *sizes)
TIER_GET = ctypes.CFUNCTYPE(ctypes.c_int, _vp, c_i32, _vp, _P(_vp), _P(c_u64), _P(c_u64))
#: int put(void *self, int32_t n, const kvp_hash_t *keys, const void *const *blobs,
#:         const uint64_t *sizes)
TIER_PUT = ctypes.CFUNCTYPE(ctypes.c_int, _vp, c_i32, _vp, _P(_vp), _P(c_u64))
#: int exists(void *self, int32_t n, const kvp_hash_t *keys, uint8_t *present)
TIER_EXISTS = ctypes.CFUNCTYPE(ctypes.c_int, _vp, c_i32, _vp, _P(ctypes.c_uint8))
#: int remove(void *self, int32_t n, const kvp_hash_t *keys)
TIER_REMOVE = ctypes.CFUNCTYPE(ctypes.c_int, _vp, c_i32, _vp)
#: int usage(void *self, uint64_t *entries, uint64_t *bytes)
TIER_USAGE = ctypes.CFUNCTYPE(ctypes.c_int, _vp, _P(c_u64), _P(c_u64))
#: const char *last_error(void *self): a pointer the implementation keeps alive
TIER_LAST_ERROR = ctypes.CFUNCTYPE(_vp, _vp)
#: void destroy(void *self)
TIER_DESTROY = ctypes.CFUNCTYPE(None, _vp)


class BlobTierOpsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("reserved_", c_i32),
        ("get", TIER_GET),
        ("put", TIER_PUT),
        ("exists", TIER_EXISTS),
        ("remove", TIER_REMOVE),
        ("usage", TIER_USAGE),
        ("last_error", TIER_LAST_ERROR),
        ("destroy", TIER_DESTROY),
    ]


class BlobTierStatsC(ctypes.Structure):
    _fields_ = [("struct_size", c_u32), ("reserved_", c_i32)] + [
        (n, c_u64) for n in ("gets", "hits", "puts", "errors", "bytes_in", "bytes_out",
                             "get_ns", "put_ns", "entries", "bytes")]


class FileTierParamsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("fsync", c_i32),
        ("path", c_char_p),
        ("max_bytes", c_u64),
        ("allocator", Allocator),
    ]


class QueueTierParamsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("reserved_", c_i32),
        ("inner", _vp),
        ("max_bytes", c_u64),
        ("allocator", Allocator),
    ]


class QueueTierInfoC(ctypes.Structure):
    _fields_ = [("struct_size", c_u32), ("reserved_", c_i32)] + [
        (n, c_u64) for n in ("queued", "queued_bytes", "dropped", "failed")]


class RedisTierParamsC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("cluster", c_i32),
        ("uri", c_char_p),
        ("user", c_char_p),
        ("password", c_char_p),
        ("prefix", c_char_p),
        ("connect_timeout_ms", c_i32),
        ("timeout_ms", c_i32),
        ("ttl_s", c_i32),
        ("retry_min_ms", c_i32),
        ("retry_max_ms", c_i32),
        ("reserved_", c_i32),
        ("allocator", Allocator),
    ]


#: Counters of ``kvp_redis_tier_info_t`` after its three ``int32_t`` fields.
REDIS_TIER_COUNTERS = ("round_trips", "commands", "connects", "failures", "timeouts", "skipped",
                       "server_errors", "moved", "asked", "slot_refreshes")


class RedisTierInfoC(ctypes.Structure):
    _fields_ = [("struct_size", c_u32), ("cluster", c_i32), ("nodes", c_i32),
                ("nodes_down", c_i32)] + [(n, c_u64) for n in REDIS_TIER_COUNTERS]


class CacheTierStatsC(ctypes.Structure):
    _fields_ = [("struct_size", c_u32), ("reserved_", c_i32)] + [
        (n, c_u64) for n in ("lookups", "hit_pages", "miss_pages", "rejected")] + [
        ("rejects", c_u64 * BLOB_REASONS)] + [
        (n, c_u64) for n in ("written", "errors", "bytes_in", "bytes_out", "read_ns",
                             "write_ns")]


class CacheEventC(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_u32),
        ("kind", c_i32),
        ("page", c_i32),
        ("parent", c_i32),
        ("priority", c_i32),
        ("tier", c_i32),
        ("hash", c_u64),
        ("chain", HashC),
        ("parent_chain", HashC),
        ("seq_no", c_u64),
        ("page_size", c_i32),
        ("num_tokens", c_i32),
        ("tokens", _P(c_i32)),
    ]


CacheEventFn = ctypes.CFUNCTYPE(None, _vp, _P(CacheEventC))

MIRRORED.update({
    "kvp_hash_t": HashC,
    "kvp_blob_params_t": BlobParamsC,
    "kvp_blob_info_t": BlobInfoC,
    "kvp_blob_stats_t": BlobStatsC,
    "kvp_blob_tier_ops_t": BlobTierOpsC,
    "kvp_blob_tier_stats_t": BlobTierStatsC,
    "kvp_file_tier_params_t": FileTierParamsC,
    "kvp_queue_tier_params_t": QueueTierParamsC,
    "kvp_queue_tier_info_t": QueueTierInfoC,
    "kvp_redis_tier_params_t": RedisTierParamsC,
    "kvp_redis_tier_info_t": RedisTierInfoC,
    "kvp_cache_tier_stats_t": CacheTierStatsC,
    "kvp_cache_event_t": CacheEventC,
})

_hp = _P(HashC)
_sig("kvp_blob_reason_name", c_char_p, c_i32)
_sig("kvp_fingerprint", ctypes.c_int, _P(_vp), _P(c_u64), c_i32, _P(ctypes.c_uint8))
_sig("kvp_blob_params_init", None, _P(BlobParamsC))
_sig("kvp_blob_codec_create", ctypes.c_int, _vp, _P(BlobParamsC), _P(_vp), c_char_p, _sz)
_sig("kvp_blob_codec_destroy", None, _vp)
_sig("kvp_blob_codec_last_error", c_char_p, _vp)
_sig("kvp_blob_chain_root", ctypes.c_int, _vp, c_u64, _hp)
_sig("kvp_blob_chain", ctypes.c_int, _vp, _hp, _i32p, ctypes.c_int64, _hp)
_sig("kvp_hash_hex", ctypes.c_int, _hp, c_char_p)
_sig("kvp_blob_size", ctypes.c_int, _vp, c_i32, _P(c_u64))
_sig("kvp_blob_export", ctypes.c_int, _vp, c_i32, c_i32, _hp, _vp, c_u64)
_sig("kvp_blob_validate", ctypes.c_int, _vp, _vp, c_u64, _hp, c_i32, _P(BlobInfoC), _i32p)
_sig("kvp_blob_import", ctypes.c_int, _vp, c_i32, _vp, c_u64, _hp, c_i32, _i32p)
_sig("kvp_blob_codec_stats", ctypes.c_int, _vp, _P(BlobStatsC))
_sig("kvp_blob_tier_create", ctypes.c_int, _P(BlobTierOpsC), _vp, c_char_p, _P(_vp), c_char_p,
     _sz)
_sig("kvp_blob_tier_destroy", None, _vp)
_sig("kvp_blob_tier_last_error", c_char_p, _vp)
_sig("kvp_blob_tier_name", c_char_p, _vp)
_sig("kvp_blob_tier_get", ctypes.c_int, _vp, c_i32, _hp, _P(_vp), _P(c_u64), _P(c_u64))
_sig("kvp_blob_tier_put", ctypes.c_int, _vp, c_i32, _hp, _P(_vp), _P(c_u64))
_sig("kvp_blob_tier_exists", ctypes.c_int, _vp, c_i32, _hp, _P(ctypes.c_uint8))
_sig("kvp_blob_tier_remove", ctypes.c_int, _vp, c_i32, _hp)
_sig("kvp_blob_tier_stats", ctypes.c_int, _vp, _P(BlobTierStatsC))
_sig("kvp_file_tier_params_init", None, _P(FileTierParamsC))
_sig("kvp_file_tier_create", ctypes.c_int, _P(FileTierParamsC), _P(_vp), c_char_p, _sz)
_sig("kvp_queue_tier_params_init", None, _P(QueueTierParamsC))
_sig("kvp_queue_tier_create", ctypes.c_int, _P(QueueTierParamsC), _P(_vp), c_char_p, _sz)
_sig("kvp_queue_tier_info", ctypes.c_int, _vp, _P(QueueTierInfoC))
_sig("kvp_queue_tier_drain", ctypes.c_int, _vp)
_sig("kvp_redis_tier_params_init", None, _P(RedisTierParamsC))
_sig("kvp_redis_tier_create", ctypes.c_int, _P(RedisTierParamsC), _P(_vp), c_char_p, _sz)
_sig("kvp_redis_tier_info", ctypes.c_int, _vp, _P(RedisTierInfoC))
_sig("kvp_redis_tier_reconnect", ctypes.c_int, _vp)
_sig("kvp_cache_set_blob", ctypes.c_int, _vp, _P(BlobParamsC))
_sig("kvp_cache_blob_codec", ctypes.c_int, _vp, _P(_vp))
_sig("kvp_cache_add_tier", ctypes.c_int, _vp, _vp, c_i32, _i32p)
_sig("kvp_cache_tier_stats", ctypes.c_int, _vp, c_i32, _P(CacheTierStatsC))
_sig("kvp_cache_flush", ctypes.c_int, _vp)
_sig("kvp_cache_set_event_callback", ctypes.c_int, _vp, CacheEventFn, _vp)
_sig("kvp_cache_clear_prefix", ctypes.c_int, _vp)
_sig("kvp_cache_seq_export_size", ctypes.c_int, _vp, c_i32, _i32p, _P(c_u64))
_sig("kvp_cache_seq_export", ctypes.c_int, _vp, c_i32, _i32p, ctypes.c_int64, _vp, c_u64)
_sig("kvp_cache_seq_import", ctypes.c_int, _vp, c_i32, _i32p, ctypes.c_int64, _vp, c_u64,
     _i32p)


if _MISSING:
    raise LibraryMismatch(
        f"kvpage: {path} lacks functions these bindings call: {', '.join(_MISSING)}. It "
        "is not the libkvpage these bindings were written for; reinstall the bindings from "
        "the same checkout as the library, or point KVPAGE_LIBRARY at a matching build.")
