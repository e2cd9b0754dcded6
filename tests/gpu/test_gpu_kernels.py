"""pytest entry to the GPU checks; skipped without CUDA or under Triton's interpreter, which tests/conftest.py
turns on unless told otherwise: `TRITON_INTERPRET=0 python -m pytest -m gpu tests/gpu`."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
        reason="needs a CUDA GPU and compiled (not interpreted) Triton kernels",
    ),
]


def test_bf16_kernels_within_bounds() -> None:
    from check_kernels import run

    assert run([63, 1000, 2048, 8192], [2, 16], None), (
        "some bf16 errors over FLA's bounds; see the printed table"
    )
