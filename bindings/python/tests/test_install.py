"""`pip install ./bindings/python` in a fresh virtual environment builds
libkvpage from the repository's sources into the package, and `import kvpage`
then works from any directory with KVPAGE_LIBRARY unset.

Needs PyPI (build isolation installs setuptools; numpy is a dependency): it
is skipped, saying so, when PyPI cannot be reached. It takes about a minute
(the first time also compiles the library); skip it with
KVPAGE_TEST_INSTALL=0 or ``-m "not install"``.
"""

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PLAN = ("import kvpage; print(kvpage.plan(preset='llama-3.1-70b', gpu='h200-141g', "
        "context=32768))")

pytestmark = pytest.mark.install


def _index_reachable() -> str:
    """'' when the package index answers, else why not."""
    url = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/").rstrip("/") + "/setuptools/"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            r.read(1)
        return ""
    except Exception as e:  # noqa: BLE001 - any failure means: no index
        return f"{url}: {e}"


def _clean_env() -> dict:
    """The environment without what would point Python at this checkout or
    at another library (and without the sanitizer preload of SAN=1 runs)."""
    env = dict(os.environ)
    for k in ("KVPAGE_LIBRARY", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LD_PRELOAD",
              "ASAN_OPTIONS", "UBSAN_OPTIONS", "KVPAGE_BUILD_DIR", "KVPAGE_SOURCE_DIR",
              "KVPAGE_CUDA"):
        env.pop(k, None)
    return env


def test_pip_install_in_a_fresh_venv_then_import_anywhere(tmp_path):
    if os.environ.get("KVPAGE_TEST_INSTALL", "1") == "0":
        pytest.skip("KVPAGE_TEST_INSTALL=0")
    why = _index_reachable()
    if why:
        pytest.skip(f"the package index cannot be reached ({why})")
    env = _clean_env()
    start = time.monotonic()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env, timeout=120)
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "--disable-pip-version-check",
                        "./bindings/python"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, f"pip install failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    installed = time.monotonic() - start

    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "build").mkdir(parents=True)
    (elsewhere / "build" / "libkvpage.so.0").write_text("a stale build must not be loaded")
    r = subprocess.run([str(py), "-c", PLAN], cwd=elsewhere, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Plan(llama-3.1-70b on h200-141g:"), r.stdout
    r = subprocess.run([str(py), "-c", "import kvpage; print(kvpage.library_path)"],
                       cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    where = Path(r.stdout.strip())
    assert where.name == "libkvpage.so.0" and venv in where.parents, where
    print(f"\nfresh venv + pip install ./bindings/python: {installed:.0f} s; "
          f"total {time.monotonic() - start:.0f} s")
