import atexit
import os
import shutil
import tempfile

# Every test session gets its own kernel cache (set before kjit is imported), removed when the
# process that made it exits (pytest-xdist's workers inherit it and leave it alone).
if "KJIT_CACHE_DIR" not in os.environ:
    os.environ["KJIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="kjit-pytest-cache-")
    atexit.register(shutil.rmtree, os.environ["KJIT_CACHE_DIR"], ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402

import kjit  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def img2gray():
    return kjit.load("img2gray")


@pytest.fixture(scope="module")
def activation():
    return kjit.load("activation")
