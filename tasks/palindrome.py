"""Palindrome: read a random string, then write it out reversed.

Kimi Linear §5.1 uses it to test exact retrieval of the whole history from a
fixed-size state: every token of the first half must come back, in reverse
order, after the separator.

Token ids: ``0`` = pad, ``1`` = ``<sep>``, ``2 .. vocab_size-1`` = symbols.

Layout for a sequence of length ``T``: ``n = (T - 1) // 2`` symbols
``x1 … xn``, then ``<sep>``, then ``xn … x1``; when ``T`` is even one pad
token closes the sequence (never scored).

Labels: ``labels[t]`` is the target of the model's output at ``t`` (it has read
``inputs[:t+1]``), i.e. the next token, scored only where that next token
belongs to the reversed half. These are the ``n`` positions ``t = n .. 2n-1``
(the ``<sep>`` and the reversed half except its last token):
``labels[t] = inputs[t + 1] = inputs[2n - 1 - t]``. All other positions are
``-100``. The first half is random, so there is nothing to score there.

Worked example, ``generate(1, 8, seed=…, vocab_size=6)`` (symbols 2..5),
``n = 3``, with ``x = (4, 2, 5)``::

    position   0     1     2     3      4     5     6     7
    inputs     4     2     5     1      5     2     4     0
               x1    x2    x3    <sep>  x3    x2    x1    pad
    labels   -100  -100  -100    5      2     4   -100  -100

At ``<sep>`` (t=3) the model must say ``x3 = 5``; at t=6 it has written the whole
reversed string, and the following pad is not scored.
"""

from __future__ import annotations

import numpy as np
import torch

from tasks import require_int, token_arrays

PAD = 0
SEP = 1
FIRST_SYMBOL = 2
IGNORE = -100

# Rows generated per numpy call: keeps the temporaries to a few MB at T=2048.
# The random stream is drawn chunk by chunk, so the data depend on this
# constant: changing it changes what a seed generates.
_CHUNK = 4096


def _check(num_examples: int, seq_len: int, vocab_size: int) -> None:
    for name, value in (("num_examples", num_examples), ("seq_len", seq_len), ("vocab_size", vocab_size)):
        require_int("palindrome", name, value)
    if num_examples < 0:
        raise ValueError(f"palindrome: num_examples={num_examples} is negative; pass a count >= 0.")
    if seq_len < 3:
        raise ValueError(
            f"palindrome: seq_len={seq_len} is too short; it needs at least 3 positions "
            "(one symbol, <sep>, its copy): pass seq_len >= 3."
        )
    if vocab_size < FIRST_SYMBOL + 2:
        raise ValueError(
            f"palindrome: vocab_size={vocab_size} leaves {vocab_size - FIRST_SYMBOL} symbol(s) after "
            f"the {FIRST_SYMBOL} special tokens (pad, <sep>); pass vocab_size >= {FIRST_SYMBOL + 2} "
            "so that the string is random."
        )


def num_tokens(*, vocab_size: int = 64) -> int:
    """Embedding size the model needs: every id in ``generate``'s inputs and labels is below it."""
    _check(0, 3, vocab_size)
    return vocab_size


def generate(
    num_examples: int, seq_len: int, *, seed: int, vocab_size: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """``num_examples`` palindrome sequences of length ``seq_len``.

    Args:
        num_examples: number of sequences N.
        seq_len: length T of each sequence (any T >= 3; odd T has no pad).
        seed: seed of the local ``numpy.random.default_rng``; same seed, same data.
        vocab_size: total number of token ids, the two specials included
            (symbols are drawn uniformly from ``2 .. vocab_size-1``).

    Returns:
        ``(inputs, labels)``, int64 ``[N, T]``; labels are ``-100`` where nothing
        is scored. See the module docstring for the layout and a worked example.
    """
    _check(num_examples, seq_len, vocab_size)
    rng = np.random.default_rng(seed)
    n = (seq_len - 1) // 2
    inputs, labels = token_arrays(num_examples, seq_len, PAD, IGNORE)  # [N, T] each
    for start in range(0, num_examples, _CHUNK):
        stop = min(start + _CHUNK, num_examples)
        symbols = rng.integers(FIRST_SYMBOL, vocab_size, size=(stop - start, n), dtype=np.int32)  # [C, n]
        reversed_half = symbols[:, ::-1]
        inputs[start:stop, :n] = symbols
        inputs[start:stop, n] = SEP
        inputs[start:stop, n + 1 : 2 * n + 1] = reversed_half
        # the output at t predicts inputs[t + 1]: t = n (<sep>) .. 2n-1
        labels[start:stop, n : 2 * n] = reversed_half
    return torch.from_numpy(inputs), torch.from_numpy(labels)
