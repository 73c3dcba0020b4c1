import os
import sys
from pathlib import Path

# Test the checkout's package (not an installed copy) against the checkout's
# build, unless KVPAGE_LIBRARY says otherwise.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
