"""pytest entry to the GPU checks; skipped without CUDA or under Triton's interpreter, which tests/conftest.py
turns on unless told otherwise: `TRITON_INTERPRET=0 python -m pytest -m gpu tests/gpu`."""

from __future__ import annotations

import pytest

# skipped where there is no GPU or Triton interprets: tests/gpu/conftest.py
pytestmark = pytest.mark.gpu


def test_bf16_kernels_within_bounds() -> None:
    from check_kernels import run

    assert run([63, 1000, 2048, 8192], [2, 16], None), (
        "some bf16 errors over FLA's bounds; see the printed table"
    )
