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


def test_bf16_kernels_within_bounds_with_rebuilt_states() -> None:
    # the op with recompute_states (the layers' lean backward): the backward rebuilds the chunk-entry states
    # by the forward's state pass again. B=1: the forms of few programs (the W/U form, the output kernel);
    # B=8 H=16: the state passes fill the GPU (the WY form with X kept, the output inside the state pass),
    # the training shape's forms. Each also against the op keeping the states (check_kernels.REBUILT_TOL)
    from check_kernels import run

    assert run([63, 1000, 2048], [2, 16], None, fla_at=(), step=False, recompute_states=True), (
        "some bf16 errors with rebuilt states over their bounds; see the printed table"
    )
    assert run([1000], [16], None, fla_at=(), step=False, B=8, recompute_states=True), (
        "some bf16 errors with rebuilt states over their bounds at B=8; see the printed table"
    )
