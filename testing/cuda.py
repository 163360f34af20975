"""Tests of the GPU paths: each runs on the CPU and, where a CUDA GPU is visible, on it too.

``DEVICES`` parametrizes a test over ``cpu`` and ``cuda``; the ``cuda`` case carries the ``cuda``
marker (``-m cuda`` picks it, as bench/gpu/check.sh does) and skips, saying why, where
``torch.cuda.is_available()`` is False: every development and CI machine of this project has no GPU,
so these cases run only where check.sh is run on one.
"""

from __future__ import annotations

import pytest
import torch

NO_CUDA = "needs a CUDA GPU: torch.cuda.is_available() is False here (bench/gpu/check.sh runs it on one)"
needs_cuda = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)]
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]
