"""Stack: track many independent stacks through a stream of push and pop operations.

Kimi Linear §5.1 uses 64 independent stacks to test state tracking: at every
pop the model must name the element most recently pushed onto that stack and
not yet popped, which needs the whole history of that stack, not just its
last write.

Token ids: ``0`` = pad, ``1`` = ``<push>``, ``2`` = ``<pop>``, stack ids
``3 .. 3+num_stacks-1``, elements ``3+num_stacks .. 3+num_stacks+num_elements-1``.

Layout: ``T // 3`` operation triples ``op s e`` at positions ``3j, 3j+1, 3j+2``
(pad fills the last ``T % 3`` positions):

- ``<push> s e``: push element ``e`` onto stack ``s``;
- ``<pop> s e``: pop stack ``s``; ``e`` is the element that comes off.

Labels: only pops are scored, at the stack-id position: after reading
``<pop> s`` (position ``3j+1``) the model must output ``e``, so
``labels[3j+1] = inputs[3j+2] = e``. The ``e`` of a pop is then given as input
(teacher forcing), so the stream stays a complete record of the stacks.

Sampling, per step: a stack is chosen uniformly among all ``num_stacks``; if it
is empty the operation is a push, otherwise a push with probability
``push_prob`` and a pop otherwise (so pops only ever hit non-empty stacks, and
``push_prob`` sets how deep the stacks grow: 0.5 is a reflecting random walk
per stack). Pushed elements are uniform over the ``num_elements`` elements. So
that every sequence has at least one scored position, a sequence with no pop by
its last triple ends with a pop of the stack of its latest push.

Worked example, ``generate(1, 20, seed=…, num_stacks=2, num_elements=3)``: stacks
``A = 3``, ``B = 4``, elements ``5, 6, 7``; 6 triples and 2 pads::

    position  0   1   2    3   4   5    6   7   8    9  10  11   12  13  14   15  16  17  18  19
    inputs    1   3   6    1   4   5    1   3   7    2   3   7    2   3   6    2   4   5   0   0
              push A 6     push B 5     push A 7     pop A ->7    pop A ->6    pop B ->5    pad
    labels    .   .   .    .   .   .    .   .   .    .   7   .    .   6   .    .   5   .   .   .

(``.`` = -100). At position 10 the model has read ``<pop> A`` and must answer 7,
the top of A; at 13 the next one down, 6.
"""

from __future__ import annotations

import numpy as np
import torch

from tasks import require_int, require_real, token_arrays

PAD = 0
PUSH = 1
POP = 2
FIRST_STACK = 3
IGNORE = -100

# Rows simulated together: small enough that each step's random reads and writes
# of the stack tables (about 1 KB per row) stay in cache; measured best of 1k-16k.
# The random stream is drawn chunk by chunk, so changing this changes what a seed generates.
_CHUNK = 2048
_INITIAL_DEPTH = 8


def _check(num_examples: int, seq_len: int, num_stacks: int, num_elements: int, push_prob: float) -> None:
    for name, value in (
        ("num_examples", num_examples),
        ("seq_len", seq_len),
        ("num_stacks", num_stacks),
        ("num_elements", num_elements),
    ):
        require_int("stack", name, value)
    require_real("stack", "push_prob", push_prob)
    if num_examples < 0:
        raise ValueError(f"stack: num_examples={num_examples} is negative; pass a count >= 0.")
    if seq_len < 6:
        raise ValueError(
            f"stack: seq_len={seq_len} is too short for a push and a pop (3 tokens each); pass seq_len >= 6."
        )
    if num_stacks < 1:
        raise ValueError(f"stack: num_stacks={num_stacks} must be >= 1.")
    if num_elements < 2:
        raise ValueError(
            f"stack: num_elements={num_elements} makes every pop's answer known in advance; "
            "pass num_elements >= 2."
        )
    if not 0.0 < push_prob < 1.0:
        raise ValueError(
            f"stack: push_prob={push_prob!r} must lie strictly inside (0, 1) (probability of a push "
            "on a non-empty stack; 0.5 is balanced)."
        )


def num_tokens(*, num_stacks: int = 64, num_elements: int = 64, push_prob: float = 0.5) -> int:
    """Embedding size the model needs: every id in ``generate``'s inputs and labels is below it."""
    _check(0, 6, num_stacks, num_elements, push_prob)
    return FIRST_STACK + num_stacks + num_elements


def _simulate(
    rng: np.random.Generator, rows: int, steps: int, num_stacks: int, num_elements: int, push_prob: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run ``rows`` streams in parallel; returns (is_push, stack, element), each ``[steps, rows]``.

    ``element`` is the pushed element for a push and the popped one for a pop
    (0-based ids, offsets added by the caller). Arrays are step-major so that
    each step reads and writes contiguous rows.
    """
    stack = rng.integers(0, num_stacks, size=(steps, rows), dtype=np.int64)  # [L, C]
    wants_push = rng.random((steps, rows)) < push_prob  # [L, C]
    element = rng.integers(0, num_elements, size=(steps, rows), dtype=np.int64)  # [L, C]
    is_push = np.empty((steps, rows), dtype=bool)  # [L, C]

    # Flat tables indexed by slot = row * num_stacks + stack: one 1-D gather or
    # scatter per step instead of multi-array fancy indexing.
    slot = stack + np.arange(rows, dtype=np.int64) * num_stacks  # [L, C]
    depth = np.zeros(rows * num_stacks, dtype=np.int32)  # [C * num_stacks]
    # contents[slot * capacity + i]: i-th element from the bottom of that stack; the
    # smallest dtype that holds an element keeps this table, the hot spot, in cache
    capacity = _INITIAL_DEPTH
    store_dtype = np.int16 if num_elements <= np.iinfo(np.int16).max else np.int32
    contents = np.zeros(rows * num_stacks * capacity, dtype=store_dtype)
    first_cell = slot * capacity  # [L, C] where each step's stack starts in contents
    for j in range(steps):
        d = depth[slot[j]]  # [C]
        push = np.logical_or(wants_push[j], d == 0, out=is_push[j])  # empty stacks must push
        if j >= capacity and int(d.max()) >= capacity:
            # a push may land at index d (depth <= j, hence the j test): double every stack's room
            grown = np.zeros((rows * num_stacks, 2 * capacity), dtype=store_dtype)
            grown[:, :capacity] = contents.reshape(-1, capacity)
            capacity *= 2
            contents = grown.ravel()
            first_cell = slot * capacity
        # a push writes at index d, a pop reads the top at d - 1
        index = d - 1
        index += push
        cell = first_cell[j] + index  # [C]
        moved = np.where(push, element[j], contents[cell])
        contents[cell] = moved
        element[j] = moved
        index += push
        depth[slot[j]] = index
    # Guarantee a scored position: a row that never popped (possible on short
    # sequences with many stacks) turns its last push into a pop of the stack of
    # the push before it, the most recent push overall, so its element comes off.
    never_popped = is_push.all(axis=0)  # [C]
    if steps >= 2 and never_popped.any():
        is_push[-1, never_popped] = False
        stack[-1, never_popped] = stack[-2, never_popped]
        element[-1, never_popped] = element[-2, never_popped]
    return is_push, stack, element


def generate(
    num_examples: int,
    seq_len: int,
    *,
    seed: int,
    num_stacks: int = 64,
    num_elements: int = 64,
    push_prob: float = 0.5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``num_examples`` stack-operation streams of length ``seq_len``.

    Args:
        num_examples: number of sequences N.
        seq_len: length T (T // 3 operations; any T >= 6).
        seed: seed of the local ``numpy.random.default_rng``; same seed, same data.
        num_stacks: independent stacks (Kimi Linear: 64).
        num_elements: distinct elements that can be pushed.
        push_prob: probability that an operation on a non-empty stack is a push.

    Returns:
        ``(inputs, labels)``, int64 ``[N, T]``; labels ``-100`` except at the
        stack-id position of each pop. See the module docstring for an example.
    """
    _check(num_examples, seq_len, num_stacks, num_elements, push_prob)
    rng = np.random.default_rng(seed)
    steps = seq_len // 3
    first_element = FIRST_STACK + num_stacks
    inputs, labels = token_arrays(num_examples, seq_len, PAD, IGNORE)  # [N, T] each
    end = 3 * steps
    for start in range(0, num_examples, _CHUNK):
        stop = min(start + _CHUNK, num_examples)
        is_push, stack, element = _simulate(rng, stop - start, steps, num_stacks, num_elements, push_prob)
        element_token = (element + first_element).T  # [C, L]
        inputs[start:stop, 0:end:3] = np.where(is_push.T, PUSH, POP)
        inputs[start:stop, 1:end:3] = stack.T + FIRST_STACK
        inputs[start:stop, 2:end:3] = element_token
        labels[start:stop, 1:end:3] = np.where(is_push.T, IGNORE, element_token)
    return torch.from_numpy(inputs), torch.from_numpy(labels)
