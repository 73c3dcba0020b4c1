"""Python bindings for libkvpage, the KV-cache library for LLM inference engines.

Loads the C library through ctypes (no compiler needed): see
:mod:`kvpage._lib` for where it looks. Every failing call raises a
:class:`kvpage.Error` subclass carrying the library's detail text.

>>> import kvpage
>>> p = kvpage.plan(preset="llama-3.1-8b", gpu="h100-80g", context=8192)
>>> p.max_seqs
58
"""

from . import _lib, cuda
from .errors import (BadState, CudaError, Error, HostFull, InternalError, InvalidArgument,
                     NoDevice, NoSpace, NotFound, NotSupported, OutOfMemory)
from ._handle import Closed
from .kernels import Cache, Context, Isa, Store, dequantize, isa_supported, quantize
from .paging import EventKind, Export, OpKind, PageOp, Pool, PoolEvent, Table
from .sched import Action, Reason, Scheduler
from .tier import PageIO, Tier
from .plan import (CudaDevice, Format, GpuPreset, Layout, ModelPreset, Plan, build_has_cuda,
                   cuda_device, cuda_device_count, format_of, gpu, gpus, layout, parse_size,
                   plan, preset, presets, weight_bytes)

__version__ = "%d.%d.%d" % _lib.EXPECTED_VERSION

#: Path of the loaded shared library.
library_path = _lib.path


def library_version() -> str:
    """Version string of the loaded library, e.g. "0.1.0"."""
    return _lib.lib.kvp_version_string().decode()


__all__ = [
    "Action", "Closed", "Reason", "Scheduler", "cuda",
    "Cache", "Context", "Isa", "Store", "dequantize", "isa_supported", "quantize",
    "EventKind", "Export", "OpKind", "PageOp", "Pool", "PoolEvent", "Table",
    "HostFull", "PageIO", "Tier",
    "BadState", "CudaDevice", "CudaError", "Error", "Format", "GpuPreset", "InternalError",
    "InvalidArgument", "Layout", "ModelPreset", "NoDevice", "NoSpace", "NotFound",
    "NotSupported", "OutOfMemory", "Plan", "build_has_cuda", "cuda_device",
    "cuda_device_count", "format_of", "gpu", "gpus", "layout", "library_path",
    "library_version", "parse_size", "plan", "preset", "presets", "weight_bytes",
]
