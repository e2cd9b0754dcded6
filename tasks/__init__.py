"""Synthetic tasks: one module per task, found by name (``tasks.<name>``), no registry.

Each module exposes (docs/design.md §5)::

    generate(num_examples, seq_len, *, seed, **params) -> (inputs, labels)   # int64 [N, T]
    num_tokens(**params) -> int                                              # ids are all below it

``labels[t]`` is the target of the model's output at position ``t`` (it has
read ``inputs[:, :t+1]``); ``-100`` where nothing is scored. Same seed, same
data (a local ``numpy.random.default_rng(seed)``). Layouts, defaults and the
reasons for them: ``tasks/README.md`` and each module's docstring.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch


def require_int(task: str, name: str, value: object) -> int:
    """``value`` as an int, or a ValueError naming it (a config can hand over ``"20"`` or ``1e3``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{task}: {name}={value!r} must be an integer; write it without quotes or decimals.")
    return int(value)


def require_real(task: str, name: str, value: object) -> float:
    """``value`` as a float, or a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{task}: {name}={value!r} must be a number; write it without quotes.")
    return float(value)


def token_arrays(num_examples: int, seq_len: int, pad: int, ignore: int) -> tuple[np.ndarray, np.ndarray]:
    """``(inputs, labels)``: int64 ``[N, T]`` numpy views of fresh torch tensors, filled with ``pad`` and
    ``ignore``. numpy asks the kernel for huge pages on large arrays, and where it compacts memory to make
    them (transparent_hugepage/defrag = madvise) the first touch of a few GB takes seconds more than
    torch's allocator, which asks for none."""
    inputs = torch.full((num_examples, seq_len), pad, dtype=torch.int64)
    labels = torch.full((num_examples, seq_len), ignore, dtype=torch.int64)
    return inputs.numpy(), labels.numpy()
