"""The planner layer: formats, exact page byte counts, and capacity plans."""

from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass, fields
from typing import Optional, Union

from . import _lib
from .errors import InvalidArgument, check, errbuf

L = _lib.lib

Size = Union[int, str]


class Format(enum.IntEnum):
    """KV element formats (keys and values are chosen independently)."""

    FP32 = 0
    FP16 = 1
    BF16 = 2
    FP8_E4M3 = 3
    INT8 = 4
    INT4_V1 = 5  #: the first int4 ("int4_v1"): fewer int8 key channels, values not rotated
    INT4 = 6  #: int4: head_dim/8 int8 key channels, values in a rotated basis

    def __str__(self) -> str:  # the library's canonical name, e.g. "fp8_e4m3"
        return L.kvp_format_name(int(self)).decode()


def format_of(value: Union[Format, int, str]) -> Format:
    """A :class:`Format` from a Format, its integer value or a name ("int8", "fp8")."""
    if isinstance(value, Format):
        return value
    if isinstance(value, bool):
        raise TypeError("a format is a Format, an int or a name, not a bool")
    if isinstance(value, int):
        try:
            return Format(value)
        except ValueError:
            raise InvalidArgument(-1, f"unknown format value {value}") from None
    if isinstance(value, str):
        out = ctypes.c_int32()
        err = errbuf()
        check(L.kvp_format_parse(value.encode(), ctypes.byref(out), err, len(err)), err)
        return Format(out.value)
    raise TypeError(f"a format is a Format, an int or a name, not {type(value).__name__}")


def parse_size(text: Size) -> int:
    """Bytes from "80GiB", "24GB", "1.5T", "4096" (an int is returned as is, if > 0)."""
    if isinstance(text, bool):
        raise TypeError("a size is an int or a string, not a bool")
    if isinstance(text, int):
        if text <= 0 or text >= 1 << 64:
            raise InvalidArgument(-1, f"size {text} is not in 1 .. 2^64-1 bytes")
        return text
    if not isinstance(text, str):
        raise TypeError(f"a size is an int or a string, not {type(text).__name__}")
    out = ctypes.c_uint64()
    err = errbuf()
    check(L.kvp_parse_size(text.encode(), ctypes.byref(out), err, len(err)), err)
    return out.value


def _to_dataclass(cls, c_struct, **extra):
    values = {}
    for f in fields(cls):
        if f.name in extra:
            values[f.name] = extra[f.name]
        else:
            values[f.name] = getattr(c_struct, f.name)
    return cls(**values)


@dataclass(frozen=True)
class Layout:
    """Exact byte counts of one page (see ``kvp_layout_t``)."""

    layers: int
    kv_heads: int
    head_dim: int
    page_size: int
    k_format: Format
    v_format: Format
    needs_staging: bool
    k_block_bytes: int
    v_block_bytes: int
    page_bytes: int
    staging_page_bytes: int
    fixed_bytes: int
    element_bytes_per_token: int
    bytes_per_token: float

    def _c(self) -> _lib.LayoutC:
        c = _lib.new_struct(_lib.LayoutC)
        for f in fields(self):
            setattr(c, f.name, int(getattr(self, f.name)) if f.name != "bytes_per_token"
                    else getattr(self, f.name))
        return c

    def arena_bytes(self, num_pages: int, num_staging: int = 0) -> int:
        """Bytes of an arena with this many pool and staging pages."""
        out = ctypes.c_uint64()
        err = errbuf()
        c = self._c()
        check(L.kvp_arena_bytes(ctypes.byref(c), _u64(num_pages, "num_pages"),
                                _u64(num_staging, "num_staging"), ctypes.byref(out), err,
                                len(err)), err)
        return out.value


def _u64(v: int, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{what} must be an int")
    if v < 0 or v >= 1 << 64:
        raise InvalidArgument(-1, f"{what} = {v} is out of range")
    return v


def _i32(v: int, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{what} must be an int")
    if not -(1 << 31) <= v < 1 << 31:
        raise InvalidArgument(-1, f"{what} = {v} does not fit in 32 bits")
    return v


def layout(layers: int, kv_heads: int, head_dim: int, page_size: int = 16,
           k_format: Union[Format, int, str] = Format.FP16,
           v_format: Union[Format, int, str] = Format.FP16) -> Layout:
    """Exact byte counts of a page for a model shape and K/V formats."""
    kf, vf = format_of(k_format), format_of(v_format)
    c = _lib.new_struct(_lib.LayoutC)
    err = errbuf()
    check(L.kvp_layout_compute(_i32(layers, "layers"), _i32(kv_heads, "kv_heads"),
                               _i32(head_dim, "head_dim"), _i32(page_size, "page_size"),
                               int(kf), int(vf), ctypes.byref(c), err, len(err)), err)
    return _to_dataclass(Layout, c, k_format=kf, v_format=vf,
                         needs_staging=bool(c.needs_staging))


@dataclass(frozen=True)
class ModelPreset:
    """A public model configuration known to the planner."""

    name: str
    source: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    max_context: int
    params: int


@dataclass(frozen=True)
class GpuPreset:
    """A device memory size known to the planner."""

    name: str
    description: str
    memory_bytes: int


def _preset_from_c(c) -> ModelPreset:
    return ModelPreset(c.name.decode(), c.source.decode(), c.layers, c.q_heads, c.kv_heads,
                       c.head_dim, c.max_context, c.params)


def _gpu_from_c(c) -> GpuPreset:
    return GpuPreset(c.name.decode(), c.description.decode(), c.memory_bytes)


def presets() -> list[ModelPreset]:
    """Every model preset, in the library's order."""
    out = []
    for i in range(L.kvp_model_preset_count()):
        c = _lib.new_struct(_lib.ModelPresetC)
        check(L.kvp_model_preset_get(i, ctypes.byref(c)))
        out.append(_preset_from_c(c))
    return out


def preset(name: str) -> ModelPreset:
    """A model preset by name (case-insensitive); NotFound lists the known ones."""
    c = _lib.new_struct(_lib.ModelPresetC)
    err = errbuf()
    check(L.kvp_model_preset_find(_text(name, "preset"), ctypes.byref(c), err, len(err)), err)
    return _preset_from_c(c)


def gpus() -> list[GpuPreset]:
    """Every GPU preset, in the library's order."""
    out = []
    for i in range(L.kvp_gpu_preset_count()):
        c = _lib.new_struct(_lib.GpuPresetC)
        check(L.kvp_gpu_preset_get(i, ctypes.byref(c)))
        out.append(_gpu_from_c(c))
    return out


def gpu(name: str) -> GpuPreset:
    """A GPU preset by name (case-insensitive); NotFound lists the known ones."""
    c = _lib.new_struct(_lib.GpuPresetC)
    err = errbuf()
    check(L.kvp_gpu_preset_find(_text(name, "gpu"), ctypes.byref(c), err, len(err)), err)
    return _gpu_from_c(c)


def _text(v, what: str) -> bytes:
    if not isinstance(v, str):
        raise TypeError(f"{what} must be a str, not {type(v).__name__}")
    return v.encode()


def weight_bytes(params: int, weight_dtype: str = "bf16") -> int:
    """Bytes of a model's weights from its parameter count and weight type."""
    out = ctypes.c_uint64()
    err = errbuf()
    check(L.kvp_weight_bytes(_u64(params, "params"), _text(weight_dtype, "weight_dtype"),
                             ctypes.byref(out), err, len(err)), err)
    return out.value


@dataclass(frozen=True)
class CudaDevice:
    """A CUDA device as the library sees it."""

    device: int
    name: str
    cc_major: int
    cc_minor: int
    sm_count: int
    total_bytes: int
    free_bytes: int
    runtime_version: int
    driver_version: int


class Feature(enum.IntEnum):
    """Optional parts of a build (``kvp_feature``), for :func:`build_has`."""

    CUDA = 1  #: the CUDA backend (kvpage_cuda.h)
    BLOB = 2  #: page blobs and chain hashes (kvpage_blob.h; OpenSSL libcrypto and libxxhash)
    REDIS = 4  #: the Redis/Valkey tier (:class:`kvpage.RedisTier`; hiredis)


def build_has(feature: Feature) -> bool:
    """Whether the loaded library was built with ``feature``."""
    return bool(L.kvp_build_has(int(feature)))


def build_has_cuda() -> bool:
    """Whether the loaded library was built with the CUDA backend."""
    return build_has(Feature.CUDA)


def cuda_device_count() -> int:
    """Visible CUDA devices. NoDevice without one; NotSupported in a CPU-only build."""
    n = ctypes.c_int32()
    err = errbuf()
    check(L.kvp_cuda_device_count(ctypes.byref(n), err, len(err)), err)
    return n.value


def cuda_device(device: int = 0) -> CudaDevice:
    """Name, compute capability and memory of a CUDA device."""
    c = _lib.new_struct(_lib.CudaDeviceInfoC)
    err = errbuf()
    check(L.kvp_cuda_device_query(_i32(device, "device"), ctypes.byref(c), err, len(err)), err)
    return CudaDevice(c.device, c.name.decode(), c.cc_major, c.cc_minor, c.sm_count,
                      c.total_bytes, c.free_bytes, c.runtime_version, c.driver_version)


@dataclass(frozen=True)
class Plan:
    """How many pages, tokens and sequences fit (see ``kvp_plan_t``).

    The first fields echo the inputs; the rest are the library's figures.
    """

    preset: Optional[str]
    gpu: Optional[str]
    layers: int
    kv_heads: int
    head_dim: int
    q_heads: int
    memory_bytes: int
    weight_bytes: int
    reserve_bytes: int
    utilization: float
    k_format: Format
    v_format: Format
    page_size: int
    context: int
    needs_staging: bool
    kv_budget_bytes: int
    bytes_per_token: int
    bytes_per_token_stored: float
    bytes_per_token_per_layer: float
    page_bytes: int
    staging_page_bytes: int
    fixed_bytes: int
    num_pages: int
    num_staging: int
    arena_bytes: int
    max_tokens: int
    pages_per_seq: int
    seq_bytes: int
    max_seqs: int

    def __str__(self) -> str:
        model = self.preset or f"{self.layers}x{self.kv_heads}x{self.head_dim}"
        kv = str(self.k_format) if self.k_format == self.v_format else \
            f"K {self.k_format} / V {self.v_format}"
        return (f"Plan({model} on {self.gpu or 'a budget'}: {kv} KV, page {self.page_size}, "
                f"budget {self.kv_budget_bytes / 2**30:.2f} GiB -> {self.num_pages} pages, "
                f"{self.max_tokens} tokens, {self.max_seqs} "
                f"sequence{'' if self.max_seqs == 1 else 's'} of {self.context} tokens)")


def plan(preset: Optional[str] = None, gpu: Optional[str] = None, context: int = 4096, *,
         layers: Optional[int] = None, kv_heads: Optional[int] = None,
         head_dim: Optional[int] = None, q_heads: Optional[int] = None,
         format: Union[Format, int, str, None] = None,
         k_format: Union[Format, int, str, None] = None,
         v_format: Union[Format, int, str, None] = None, page_size: int = 16,
         vram: Optional[Size] = None, weights: Optional[Size] = None,
         weight_dtype: Optional[str] = None, reserve: Size = 0, utilization: float = 0.90,
         kv_budget: Optional[Size] = None) -> Plan:
    """Plan the KV cache: ``kvpage.plan(preset="llama-3.1-8b", gpu="h100-80g", context=8192)``.

    The model is a ``preset`` or ``layers``/``kv_heads``/``head_dim`` (which
    override a preset's). Memory is ``gpu`` (a preset name, or ``"cuda:N"`` for
    a device of this machine) or ``vram``; the weights are ``weights`` bytes, or
    the preset's parameter count times ``weight_dtype`` (bf16 by default); or a
    direct ``kv_budget``. Sizes accept ints or strings such as ``"80GiB"``.
    Formats accept :class:`Format`, ints or names; ``format`` sets both.
    """
    p = _lib.new_struct(_lib.PlanParamsC)
    L.kvp_plan_params_init(ctypes.byref(p))
    model = None
    params = 0
    if preset is not None:
        model = _find_preset(preset)  # `preset` the argument shadows preset() here
        p.layers, p.kv_heads, p.head_dim, p.q_heads = (model.layers, model.kv_heads,
                                                      model.head_dim, model.q_heads)
        params = model.params
    for name, value in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim),
                        ("q_heads", q_heads)):
        if value is not None:
            setattr(p, name, _i32(value, name))
    if kv_heads is not None and q_heads is None and model is not None:
        p.q_heads = 0
    if p.layers == 0 or p.kv_heads == 0 or p.head_dim == 0:
        raise InvalidArgument(-1, "give a preset, or layers, kv_heads and head_dim")
    if format is not None and (k_format is not None or v_format is not None):
        raise InvalidArgument(-1, "give format, or k_format and v_format, not both")
    kf = format_of(format if format is not None else (k_format if k_format is not None else 1))
    vf = format_of(format if format is not None else (v_format if v_format is not None else 1))
    p.k_format, p.v_format = int(kf), int(vf)
    p.page_size = _i32(page_size, "page_size")
    p.context = _u64(context, "context")
    gpu_name = None
    if kv_budget is not None:
        if any(v is not None for v in (gpu, vram, weights, weight_dtype)) or reserve:
            raise InvalidArgument(-1, "kv_budget is the KV budget itself: do not combine it "
                                      "with gpu, vram, weights, weight_dtype or reserve")
        p.kv_budget_bytes = parse_size(kv_budget)
    else:
        if gpu is not None and vram is not None:
            raise InvalidArgument(-1, "give gpu or vram, not both")
        if gpu is None and vram is None:
            raise InvalidArgument(-1, "no memory given: pass gpu=, vram= or kv_budget=")
        if gpu is not None:
            gpu_name = gpu
            p.memory_bytes = _gpu_memory(gpu)
        else:
            p.memory_bytes = parse_size(vram)
        p.utilization = float(utilization)
        p.reserve_bytes = 0 if reserve in (0, "0") else parse_size(reserve)
        if weights is not None and weight_dtype is not None:
            raise InvalidArgument(-1, "give weights or weight_dtype, not both")
        if weights is not None:
            p.weight_bytes = parse_size(weights)
        elif params:
            p.weight_bytes = weight_bytes(params, weight_dtype or "bf16")
        elif weight_dtype is not None:
            raise InvalidArgument(-1, "weight_dtype needs a preset (for the parameter count)")
    out = _lib.new_struct(_lib.PlanC)
    err = errbuf()
    check(L.kvp_plan_compute(ctypes.byref(p), ctypes.byref(out), err, len(err)), err)
    return Plan(
        preset=model.name if model else None, gpu=gpu_name, layers=p.layers,
        kv_heads=p.kv_heads, head_dim=p.head_dim, q_heads=p.q_heads,
        memory_bytes=p.memory_bytes, weight_bytes=p.weight_bytes,
        reserve_bytes=p.reserve_bytes, utilization=p.utilization, k_format=kf, v_format=vf,
        page_size=out.page_size, context=out.context, needs_staging=bool(out.needs_staging),
        kv_budget_bytes=out.kv_budget_bytes, bytes_per_token=out.bytes_per_token,
        bytes_per_token_stored=out.bytes_per_token_stored,
        bytes_per_token_per_layer=out.bytes_per_token_per_layer, page_bytes=out.page_bytes,
        staging_page_bytes=out.staging_page_bytes, fixed_bytes=out.fixed_bytes,
        num_pages=out.num_pages, num_staging=out.num_staging, arena_bytes=out.arena_bytes,
        max_tokens=out.max_tokens, pages_per_seq=out.pages_per_seq, seq_bytes=out.seq_bytes,
        max_seqs=out.max_seqs)


def _find_preset(name: str) -> ModelPreset:
    return preset(name)


def _gpu_memory(name: str) -> int:
    if not isinstance(name, str):
        raise TypeError("gpu must be a str")
    if name == "cuda" or name.startswith("cuda:"):
        index = name[5:] if name.startswith("cuda:") else "0"
        if not index.isdigit():
            raise InvalidArgument(-1, f"gpu '{name}': expected cuda:N")
        return cuda_device(int(index)).total_bytes
    return gpu(name).memory_bytes
