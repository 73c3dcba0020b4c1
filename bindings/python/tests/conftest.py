import sys
from pathlib import Path

# Test the checkout's package (not an installed copy). The library it loads
# is KVPAGE_LIBRARY's (`make test-python` sets it to the build's), else the
# package's own copy, else the system's (see kvpage/_lib.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "install: pip-installs the package into a fresh virtual environment "
        "(needs PyPI, about a minute); skip with -m 'not install' or KVPAGE_TEST_INSTALL=0")
