"""The GPU tests say why they skip: no CUDA device, or Triton interpreting (tests/gpu/conftest.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _gpu_conftest():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("gpu_conftest", ROOT / "tests" / "gpu" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_tests_name_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = _gpu_conftest()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.skip_reason() == "needs a CUDA GPU"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "run TRITON_INTERPRET=0 python -m pytest -m gpu tests/gpu" in gpu.skip_reason()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert gpu.skip_reason() is None
