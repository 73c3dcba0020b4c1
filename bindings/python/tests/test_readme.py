"""Every ```python block of bindings/python/README.md and of the repository's
README.md runs as written, in a fresh interpreter, from an empty directory,
with this test run's library (KVPAGE_LIBRARY) and package.

A block whose first line is ``# requires: <what>, ...`` is skipped, saying
why, where one of them is missing: ``gpu`` (a CUDA build and a device),
``blob`` (a library built with page blobs) or a module name (e.g. ``torch``).
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kvpage

REPO = Path(__file__).resolve().parents[3]
READMES = [REPO / "bindings" / "python" / "README.md", REPO / "README.md"]
_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """(line number, code) of each ```python block of a Markdown file."""
    if not path.exists():
        return []
    text = path.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def _blocks():
    out = []
    for path in READMES:
        for line, code in python_blocks(path):
            rel = path.relative_to(REPO)
            out.append(pytest.param(code, id=f"{rel}:{line}"))
    return out


def _missing(code: str) -> list[str]:
    first = code.lstrip().splitlines()[0] if code.strip() else ""
    m = re.match(r"#\s*requires:\s*(.*)", first)
    if not m:
        return []
    missing = []
    for need in (w.strip() for w in m.group(1).split(",")):
        if not need:
            continue
        if need == "gpu":
            try:
                if kvpage.build_has_cuda() and kvpage.cuda_device_count() > 0:
                    continue
            except kvpage.Error:
                pass
            missing.append("a CUDA build of libkvpage and a GPU")
        elif need == "blob":
            if not kvpage.build_has(kvpage.Feature.BLOB):
                missing.append("a libkvpage built with page blobs (libcrypto, libxxhash)")
        elif importlib.util.find_spec(need) is None:
            missing.append(f"the Python module {need}")
    return missing


def test_the_block_pattern(tmp_path):
    md = tmp_path / "x.md"
    md.write_text("x\n```python\nprint(1)\n```\n```sh\nls\n```\n\n```python\n\nprint(2)\n```\n")
    assert python_blocks(md) == [(2, "print(1)\n"), (9, "\nprint(2)\n")]
    assert python_blocks(tmp_path / "missing.md") == []


def test_the_bindings_readme_has_blocks():
    assert len(python_blocks(READMES[0])) >= 3


@pytest.mark.parametrize("code", _blocks())
def test_readme_block_runs(code, tmp_path):
    missing = _missing(code)
    if missing:
        pytest.skip("needs " + " and ".join(missing))
    env = dict(os.environ, PYTHONPATH=str(REPO / "bindings" / "python"))
    env["KVPAGE_LIBRARY"] = kvpage.library_path
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
