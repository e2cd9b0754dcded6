"""The tests here run the compiled kernels: skipped, saying which of the two is missing, where there is no
CUDA device or where Triton interprets (tests/conftest.py sets TRITON_INTERPRET=1 unless it is set, so a
plain `pytest -m gpu` on a GPU machine would skip them all)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


def skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return ("runs the compiled Triton kernels, and TRITON_INTERPRET=1 (tests/conftest.py's default for "
                "the CPU tests): run TRITON_INTERPRET=0 python -m pytest -m gpu tests/gpu")
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = skip_reason()
    if reason is None:
        return
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.skip(reason=reason))
