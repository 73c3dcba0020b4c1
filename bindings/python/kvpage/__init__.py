"""Python bindings for libkvpage, the KV-cache library for LLM inference engines.

Loads the C library through ctypes: see :mod:`kvpage._lib` for where it
looks (``KVPAGE_LIBRARY``, then the copy installed with the package, then the
system's). Every failing call raises a :class:`kvpage.Error` subclass
carrying the library's detail text.

>>> import kvpage
>>> p = kvpage.plan(preset="llama-3.1-8b", gpu="h100-80g", context=8192)
>>> p.max_seqs
58
"""

from . import _lib, blob, cuda
from ._handle import Closed
from .blob import (BlobCodec, BlobInfo, BlobReason, BlobStorage, BlobTier, CacheEvent, FileTier,
                   PyTier, QueueTier, RedisTier, TierPolicy, fingerprint, hash_hex)
from .cache import Cache, StepView
from .context import Context, ContextInfo, Isa, isa_supported
from .errors import (AccessDenied, BadBlob, BadState, CudaError, Error, HostFull, InternalError,
                     InvalidArgument, NoDevice, NoSpace, NotFound, NotSupported, OutOfMemory,
                     TierIOError)
from .paging import EventKind, Export, OpKind, PageOp, Pool, PoolEvent, Table
from .plan import (CudaDevice, Feature, Format, GpuPreset, Layout, ModelPreset, Plan, build_has,
                   build_has_cuda, cuda_device, cuda_device_count, format_of, gpu, gpus, layout,
                   parse_size, plan, preset, presets, weight_bytes)
from .sched import Action, Reason, Scheduler
from .store import Backend, Store, StoreInfo, dequantize, quantize
from .tier import PageIO, Tier

#: The version of these bindings: the libkvpage version they were written for.
__version__ = "%d.%d.%d" % _lib.EXPECTED_VERSION

#: Path of the loaded shared library.
library_path = _lib.path


def library_version() -> str:
    """Version string of the loaded library, e.g. "0.2.0"."""
    return _lib.lib.kvp_version_string().decode()


__all__ = [
    "Action", "Closed", "Reason", "Scheduler", "cuda",
    "Backend", "Cache", "Context", "ContextInfo", "Isa", "StepView", "Store", "StoreInfo",
    "dequantize", "isa_supported", "quantize",
    "EventKind", "Export", "OpKind", "PageOp", "Pool", "PoolEvent", "Table",
    "HostFull", "PageIO", "Tier",
    "BadBlob", "BlobCodec", "BlobInfo", "BlobReason", "BlobStorage", "BlobTier", "CacheEvent",
    "AccessDenied", "FileTier", "PyTier", "QueueTier", "RedisTier", "TierIOError", "TierPolicy",
    "blob", "fingerprint", "hash_hex",
    "BadState", "CudaDevice", "CudaError", "Error", "Feature", "Format", "GpuPreset",
    "InternalError", "InvalidArgument", "Layout", "ModelPreset", "NoDevice", "NoSpace",
    "NotFound", "NotSupported", "OutOfMemory", "Plan", "build_has", "build_has_cuda",
    "cuda_device", "cuda_device_count", "format_of", "gpu", "gpus", "layout", "library_path",
    "library_version", "parse_size", "plan", "preset", "presets", "weight_bytes",
]
