"""The kvpage package's build step: compile libkvpage from the repository's C
sources with the repository's Makefile, and put the shared library inside the
package (``kvpage/libkvpage.so.0``), so that ``import kvpage`` needs nothing
else. Everything else is in pyproject.toml.

Environment variables:

- ``KVPAGE_CUDA``: ``0`` (default) builds the CPU backend only; ``1`` builds
  the CUDA backend too (needs nvcc: on PATH, ``/usr/local/cuda/bin`` or
  ``NVCC``); ``auto`` builds it when nvcc is found.
- ``KVPAGE_SOURCE_DIR``: the repository root (default: two directories above
  this file).
- ``KVPAGE_BUILD_DIR``: where make puts objects and the library (default:
  setuptools' temporary build directory, reused by later builds).
- ``CC``, ``CFLAGS``, ``NVCC``, ``CUDA_ARCHS``, ``MAKE``: passed to make as usual.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.errors import ExecError, SetupError

HERE = Path(__file__).resolve().parent
PACKAGE = "kvpage"


def _bindings_version() -> tuple[int, int, int]:
    """EXPECTED_VERSION of kvpage/_lib.py: the libkvpage version the bindings are for."""
    text = (HERE / PACKAGE / "_lib.py").read_text()
    m = re.search(r"^EXPECTED_VERSION = \((\d+), (\d+), (\d+)\)", text, re.M)
    if m is None:
        raise SetupError("kvpage: EXPECTED_VERSION not found in kvpage/_lib.py")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


VERSION = _bindings_version()
SONAME = f"libkvpage.so.{VERSION[0]}"


def _source_root() -> Path:
    env = os.environ.get("KVPAGE_SOURCE_DIR")
    root = Path(env).resolve() if env else HERE.parent.parent
    if not (root / "Makefile").is_file() or not (root / "include" / "kvpage.h").is_file():
        where = f"KVPAGE_SOURCE_DIR={env}" if env else f"{root} (two levels above setup.py)"
        raise SetupError(
            f"kvpage: the libkvpage sources (Makefile, include/kvpage.h) are not at {where}. "
            "Install from a checkout of the repository (`pip install ./bindings/python` at its "
            "root), or set KVPAGE_SOURCE_DIR to the repository root.")
    return root


def _header_version(root: Path) -> tuple[int, int, int]:
    text = (root / "include" / "kvpage.h").read_text()
    parts = []
    for name in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(rf"^#define KVP_VERSION_{name} (\d+)", text, re.M)
        if m is None:
            raise SetupError(f"kvpage: KVP_VERSION_{name} not found in include/kvpage.h")
        parts.append(int(m.group(1)))
    return parts[0], parts[1], parts[2]


def _version_suits(have: tuple[int, int, int], want: tuple[int, int, int]) -> bool:
    # the rule of kvpage/_lib.py's version_ok()
    if have[0] != want[0]:
        return False
    return have[1] == want[1] if have[0] == 0 else have[1] >= want[1]


def _need(tool: str, what: str, hint: str) -> str:
    """The path of ``tool`` (a command line whose first word is the program)."""
    words = shlex.split(tool) if tool else []
    path = shutil.which(words[0]) if words else None
    if path is None:
        where = "" if words and os.sep in words[0] else " on PATH"
        raise ExecError(f"kvpage: building libkvpage needs {what}, but '{tool}' was not "
                        f"found{where}. {hint}")
    return path


def _nvcc() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def _cuda_flag() -> str:
    choice = os.environ.get("KVPAGE_CUDA", "0").strip().lower()
    if choice in ("", "0", "no", "off", "false"):
        return "0"
    nvcc = _nvcc()
    if choice == "auto":
        return "1" if nvcc else "0"
    if choice in ("1", "yes", "on", "true"):
        if nvcc is None:
            raise ExecError("kvpage: KVPAGE_CUDA=1 asks for the CUDA backend, but nvcc was not "
                            "found (not on PATH, not /usr/local/cuda/bin/nvcc, NVCC unset). "
                            "Install the CUDA toolkit, set NVCC=/path/to/nvcc, or build the "
                            "CPU backend (KVPAGE_CUDA=0).")
        return "1"
    raise ExecError(f"kvpage: KVPAGE_CUDA={choice!r}: expected 0, 1 or auto")


def build_library(build_dir: Path) -> Path:
    """Run the repository's Makefile; returns the path of the shared library."""
    root = _source_root()
    have = _header_version(root)
    if not _version_suits(have, VERSION):
        raise SetupError(
            f"kvpage: the sources at {root} are libkvpage {'.'.join(map(str, have))}, but these "
            f"bindings are for {'.'.join(map(str, VERSION))} (EXPECTED_VERSION in "
            "kvpage/_lib.py): update one or the other.")
    make = _need(os.environ.get("MAKE", "make"), "GNU make",
                 "Install it (Debian/Ubuntu: apt-get install make build-essential).")
    out = subprocess.run([make, "--version"], capture_output=True, text=True)
    if "GNU Make" not in out.stdout:
        raise ExecError(f"kvpage: building libkvpage needs GNU make; '{make}' is not GNU make "
                        "(set MAKE=/path/to/gmake).")
    _need(os.environ.get("CC", "cc"), "a C compiler (C11)",
          "Install one (Debian/Ubuntu: apt-get install build-essential) or set CC.")
    cuda = _cuda_flag()
    jobs = str(max(1, min(os.cpu_count() or 1, 32)))
    cmd = [make, "-C", str(root), f"-j{jobs}", f"HAVE_CUDA={cuda}",
           f"BUILD_ROOT={build_dir}", "lib"]
    print("kvpage: building libkvpage:", " ".join(shlex.quote(c) for c in cmd), flush=True)
    rc = subprocess.run(cmd).returncode
    if rc != 0:
        raise ExecError(f"kvpage: building libkvpage failed (`{' '.join(cmd)}` exited with "
                        f"{rc}; make's output is above)")
    lib = build_dir / f"libkvpage.so.{have[0]}.{have[1]}.{have[2]}"
    if not lib.is_file():
        raise ExecError(f"kvpage: make succeeded but {lib} is missing")
    return lib


class BuildPyWithLibrary(build_py):
    """build_py, then libkvpage built by make and copied into the package."""

    def run(self) -> None:
        super().run()
        build = self.get_finalized_command("build")
        build_dir = os.environ.get("KVPAGE_BUILD_DIR") or os.path.join(build.build_temp,
                                                                       "libkvpage")
        lib = build_library(Path(build_dir).resolve())
        if self.editable_mode:  # `pip install -e`: the package is the source directory
            package_dir = HERE / PACKAGE
        else:
            package_dir = Path(self.build_lib) / PACKAGE
            self._drop_stale_modules(package_dir)
        package_dir.mkdir(parents=True, exist_ok=True)
        target = package_dir / SONAME
        shutil.copyfile(lib, target)
        os.chmod(target, 0o755)
        self._library = str(target)

    def _drop_stale_modules(self, package_dir: Path) -> None:
        """Modules left in build/lib by an earlier build of an older source tree."""
        sources = {p.name for p in (HERE / PACKAGE).glob("*.py")}
        for p in package_dir.glob("*.py"):
            if p.name not in sources:
                p.unlink()

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        library = getattr(self, "_library", None)
        return outputs + ([library] if library else [])


class BinaryDistribution(Distribution):
    """The package holds a compiled library: platform-specific (platlib) wheels."""

    def has_ext_modules(self) -> bool:
        return True


cmdclass = {"build_py": BuildPyWithLibrary}

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

if bdist_wheel is not None:
    class BdistWheelAnyPython(bdist_wheel):
        """Tag the wheel py3-none-<platform>: ctypes, no Python ABI, one platform."""

        def finalize_options(self) -> None:
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            _python, _abi, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = BdistWheelAnyPython


setup(
    version="%d.%d.%d" % VERSION,
    cmdclass=cmdclass,
    distclass=BinaryDistribution,
)
