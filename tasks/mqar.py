"""MQAR, multi-query associative recall: store key-value pairs, answer queries by key.

Token ids: ``0`` = pad, ``1`` = ``<sep>``; keys ``2 .. 2+K-1`` and values
``2+K .. vocab_size-1`` are disjoint ranges, with ``K = (vocab_size - 2) // 2``
keys and ``vocab_size - 2 - K`` values. Within a sequence the ``num_pairs``
keys are distinct (a uniformly random ordered tuple of distinct keys); each
key's value is drawn uniformly from the value range (values may repeat: the
label is still determined by the key).

Two forms (``form``):

``kimi`` (default; Kimi Linear §5.1's description): the pairs, ``<sep>``, then
a stream of ``num_queries`` query keys, each drawn uniformly (with
replacement) from the sequence's keys; the rest, if any, is pad::

    k1 v1 k2 v2 … kn vn <sep> q1 q2 … qm [pad …]

The label at a query position is the value paired with that key (the model
reads the query and must output its value there); answers never appear in the
input, so there is no copy shortcut. ``num_queries=None`` fills the sequence:
``m = T - 2n - 1``.

Worked example (kimi), ``generate(1, 10, seed=…, vocab_size=12, num_pairs=2)``;
keys 2..6, values 7..11, pairs (3→9), (6→7), ``m = 10 - 4 - 1 = 5`` queries::

    position   0     1     2     3     4      5     6     7     8     9
    inputs     3     9     6     7     1      6     3     3     6     6
               k1    v1    k2    v2    <sep>  q     q     q     q     q
    labels   -100  -100  -100  -100  -100     7     9     9     7     7

``zoology`` (after Arora et al., "Zoology", 2023, with their default of noise
between the queries; written from its description): no ``<sep>``; after the
``2n`` pair tokens, the remaining ``R = T - 2n`` positions form ``S = R // 2``
two-token slots. Every key is queried exactly once: ``n`` slots are drawn
without replacement with probability of slot ``i`` (1-based) proportional to
``i ** (power_a - 1)``, a power law that puts most queries close after the
context (``power_a = 1`` is uniform), and pair ``j`` is queried in the
``j``-th slot drawn. A query sits in its slot's first position (labelled with
its value); every other position of the query region holds noise
(``noise=True``: a uniform draw from the value range, so that a key-range
token in the query region is always a query; Zoology draws its noise from the
whole vocabulary) or pad (``noise=False``).

Worked example (zoology), ``generate(1, 12, seed=…, vocab_size=12,
num_pairs=2, form="zoology", noise=False)``: pairs (5→8), (2→10), 4 slots
at positions 4, 6, 8, 10; key 5 drawn into slot 0, key 2 into slot 2::

    position   0     1     2     3     4     5     6     7     8     9    10    11
    inputs     5     8     2    10     5     0     0     0     2     0     0     0
    labels   -100  -100  -100  -100    8   -100  -100  -100   10   -100  -100  -100

Default number of pairs (``num_pairs=None``), both forms: ``seq_len // 8``
(at least 1): 32, 64, 128, 256 pairs at lengths 256, 512, 1024, 2048. The
pairs fill a quarter of the sequence at every length, so the recall load grows
with length as in Kimi Linear's Fig. 4 sweep; Zoology's own sweep goes up to
64 pairs at length 512, the same ``T // 8``. At 2048 the 256 pairs outnumber
the 128 key dimensions of a head: a state without erasure cannot hold them
all exactly, which is what separates the mixers.
"""

from __future__ import annotations

import numpy as np
import torch

from tasks import require_int, require_real, token_arrays

PAD = 0
SEP = 1
FIRST_KEY = 2
IGNORE = -100
FORMS = ("kimi", "zoology")

# Rows per numpy call: small temporaries that stay in cache (measured best of 2k-16k). The random
# stream is drawn chunk by chunk, so changing this changes what a seed generates.
_CHUNK = 2048


def default_num_pairs(seq_len: int) -> int:
    """The rule used when ``num_pairs`` is None: a quarter of the sequence holds pairs."""
    return max(1, seq_len // 8)


def counts(seq_len: int, form: str, num_pairs: int | None = None,
           num_queries: int | None = None) -> tuple[int, int]:
    """(pairs, queries) of one sequence with the defaults applied, unchecked (the task checks them): kimi's
    queries fill the sequence after the pairs and <sep> unless num_queries says how many; zoology queries
    each key once."""
    n = default_num_pairs(seq_len) if num_pairs is None else num_pairs
    if form != "kimi":
        return n, n
    return n, seq_len - 2 * n - 1 if num_queries is None else num_queries


def _key_value_ranges(vocab_size: int) -> tuple[int, int]:
    """(number of keys, number of values) for ``vocab_size`` total ids."""
    num_keys = (vocab_size - FIRST_KEY) // 2
    return num_keys, vocab_size - FIRST_KEY - num_keys


def _check_vocab_and_form(
    vocab_size: int, form: str, num_queries: int | None, power_a: float | None, noise: bool | None
) -> None:
    if form not in FORMS:
        raise ValueError(f"mqar: unknown form={form!r}; pass one of {FORMS}.")
    require_int("mqar", "vocab_size", vocab_size)
    if num_queries is not None:
        require_int("mqar", "num_queries", num_queries)
    if power_a is not None:
        require_real("mqar", "power_a", power_a)
    if noise is not None and not isinstance(noise, (bool, np.bool_)):
        raise ValueError(f"mqar: noise={noise!r} must be true, false or null.")
    if vocab_size < FIRST_KEY + 2:
        raise ValueError(
            f"mqar: vocab_size={vocab_size} leaves no room for one key and one value after the "
            f"{FIRST_KEY} special tokens; pass vocab_size >= {FIRST_KEY + 2}."
        )
    if form == "kimi":
        # a field that does nothing in this form would silently run another experiment than asked
        for name, value in (("power_a", power_a), ("noise", noise)):
            if value is not None:
                raise ValueError(
                    f"mqar: {name}={value!r} only applies to form='zoology'; set it to null "
                    "for form='kimi' or pass form='zoology'."
                )
    else:
        if num_queries is not None:
            raise ValueError(
                f"mqar: num_queries={num_queries!r} only applies to form='kimi' (the zoology form "
                "queries every key once); set it to null or pass form='kimi'."
            )
        if power_a is not None and not power_a > 0:
            raise ValueError(
                f"mqar: power_a={power_a!r} must be > 0 (slot weight i ** (power_a - 1); "
                "0.01 is Zoology's default, 1 is uniform)."
            )


def _resolve(
    seq_len: int,
    vocab_size: int,
    form: str,
    num_pairs: int | None,
    num_queries: int | None,
    power_a: float | None,
    noise: bool | None,
) -> tuple[int, int]:
    """Validate everything; returns (num_pairs, num_queries) with the defaults applied."""
    _check_vocab_and_form(vocab_size, form, num_queries, power_a, noise)
    require_int("mqar", "seq_len", seq_len)
    if num_pairs is not None:
        require_int("mqar", "num_pairs", num_pairs)
    # kimi: pair + <sep> + query; zoology: pair + one two-token slot
    if seq_len < 4:
        raise ValueError(
            f"mqar: seq_len={seq_len} is too short for one pair and one query; pass seq_len >= 4."
        )
    n, m = counts(seq_len, form, num_pairs, num_queries)
    if n < 1:
        raise ValueError(f"mqar: num_pairs={num_pairs} must be >= 1 (or null for seq_len // 8).")
    num_keys, _ = _key_value_ranges(vocab_size)
    if n > num_keys:
        raise ValueError(
            f"mqar: num_pairs={n} needs {n} distinct keys but vocab_size={vocab_size} has only "
            f"{num_keys} keys ((vocab_size - 2) // 2); pass vocab_size >= {2 * n + FIRST_KEY} "
            "or fewer pairs."
        )
    if form == "kimi":
        room = seq_len - 2 * n - 1
        if room < 1:
            raise ValueError(
                f"mqar: num_pairs={n} leaves no room for a query at seq_len={seq_len} "
                f"(2*num_pairs + 1 (<sep>) + 1 query positions); pass num_pairs <= {(seq_len - 2) // 2} "
                "or a longer seq_len."
            )
        if not 1 <= m <= room:
            raise ValueError(
                f"mqar: num_queries={num_queries} must be in [1, {room}] at seq_len={seq_len} with "
                f"num_pairs={n} (2*num_pairs + 1 + num_queries <= seq_len); or null to fill the sequence."
            )
        return n, m
    slots = (seq_len - 2 * n) // 2
    if slots < n:
        raise ValueError(
            f"mqar: form='zoology' needs 2 positions per query after the pairs (4*num_pairs <= "
            f"seq_len), but num_pairs={n} at seq_len={seq_len} gives {slots} slots; pass "
            f"num_pairs <= {seq_len // 4} or a longer seq_len."
        )
    return n, n


def _distinct_keys(rng: np.random.Generator, rows: int, n: int, num_keys: int) -> np.ndarray:
    """[rows, n] int64 in [0, num_keys), distinct within each row, uniform over ordered tuples.

    Sparse case (n <= num_keys / 2): draw with replacement, then redraw every
    position that repeats an earlier one, until none does. Which position is
    redrawn depends only on where equal values sit, never on the values, so the
    procedure commutes with relabelling the keys; as relabellings act
    transitively on distinct tuples, the result is uniform. Costs O(n log n)
    per row instead of O(num_keys) for a permutation.
    """
    if 2 * n > num_keys:
        # dense: the first n of a random permutation of all keys
        return np.argsort(rng.random((rows, num_keys)), axis=1)[:, :n]
    keys = rng.integers(0, num_keys, size=(rows, n), dtype=np.int64)  # [rows, n]
    position = np.arange(n, dtype=np.int64)
    todo = np.arange(rows)
    while todo.size:
        sub = keys[todo]  # [r, n]
        # sort (key, position) pairs as one integer: ties broken by position, as a stable sort would
        code = np.sort(sub * n + position, axis=1)  # [r, n]
        sorted_key, sorted_position = np.divmod(code, n)
        repeat_sorted = np.zeros(sub.shape, dtype=bool)
        repeat_sorted[:, 1:] = sorted_key[:, 1:] == sorted_key[:, :-1]
        bad_rows = repeat_sorted.any(axis=1)
        if not bad_rows.any():
            break
        repeat_row, _ = np.nonzero(repeat_sorted)
        sub[repeat_row, sorted_position[repeat_sorted]] = rng.integers(0, num_keys, size=repeat_row.size)
        keys[todo] = sub
        todo = todo[bad_rows]
    return keys


def num_tokens(
    *,
    vocab_size: int = 8192,
    form: str = "kimi",
    num_pairs: int | None = None,
    num_queries: int | None = None,
    power_a: float | None = None,
    noise: bool | None = None,
) -> int:
    """Embedding size the model needs: every id in ``generate``'s inputs and labels is below it."""
    _check_vocab_and_form(vocab_size, form, num_queries, power_a, noise)
    if num_pairs is not None:
        require_int("mqar", "num_pairs", num_pairs)
    if num_pairs is not None and num_pairs > _key_value_ranges(vocab_size)[0]:
        raise ValueError(
            f"mqar: num_pairs={num_pairs} exceeds the {_key_value_ranges(vocab_size)[0]} keys of "
            f"vocab_size={vocab_size}; pass vocab_size >= {2 * num_pairs + FIRST_KEY}."
        )
    return vocab_size


def generate(
    num_examples: int,
    seq_len: int,
    *,
    seed: int,
    vocab_size: int = 8192,
    form: str = "kimi",
    num_pairs: int | None = None,
    num_queries: int | None = None,
    power_a: float | None = None,
    noise: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``num_examples`` MQAR sequences of length ``seq_len``.

    Args:
        num_examples: number of sequences N.
        seq_len: length T.
        seed: seed of the local ``numpy.random.default_rng``; same seed, same data.
        vocab_size: total number of token ids (pad, <sep>, keys, values).
        form: ``"kimi"`` (pairs, <sep>, query stream) or ``"zoology"`` (power-law
            placed queries among noise). See the module docstring.
        num_pairs: key-value pairs per sequence; None -> ``seq_len // 8``.
        num_queries: kimi form only; None -> fill the sequence after <sep>.
        power_a: zoology form only; None -> 0.01 (Zoology's default).
        noise: zoology form only; None -> True (noise tokens, else pad).

    Returns:
        ``(inputs, labels)``, int64 ``[N, T]``; labels ``-100`` except at queries.
    """
    if require_int("mqar", "num_examples", num_examples) < 0:
        raise ValueError(f"mqar: num_examples={num_examples} is negative; pass a count >= 0.")
    n, m = _resolve(seq_len, vocab_size, form, num_pairs, num_queries, power_a, noise)
    num_keys, num_values = _key_value_ranges(vocab_size)
    first_value = FIRST_KEY + num_keys
    rng = np.random.default_rng(seed)
    inputs, labels = token_arrays(num_examples, seq_len, PAD, IGNORE)  # [N, T] each
    flat_inputs, flat_labels = inputs.reshape(-1), labels.reshape(-1)  # views: both are contiguous
    if form == "zoology":
        slots = (seq_len - 2 * n) // 2
        a = 0.01 if power_a is None else power_a
        # unnormalised weights: sampling only needs their ratios
        slot_rate = np.arange(1, slots + 1, dtype=np.float64) ** (a - 1.0)  # [S]
    for start in range(0, num_examples, _CHUNK):
        stop = min(start + _CHUNK, num_examples)
        rows = stop - start
        x = inputs[start:stop]  # views: filled in place
        y = labels[start:stop]
        keys = _distinct_keys(rng, rows, n, num_keys) + FIRST_KEY  # [C, n]
        values = rng.integers(first_value, vocab_size, size=(rows, n), dtype=np.int64)  # [C, n]
        x[:, 0 : 2 * n : 2] = keys
        x[:, 1 : 2 * n : 2] = values
        if form == "kimi":
            x[:, 2 * n] = SEP
            # index of each query's pair in the flattened [C * n] tables (one index, two gathers)
            pick = rng.integers(0, n, size=(rows, m), dtype=np.int32)  # [C, m]
            pick = np.add(pick, np.arange(0, rows * n, n)[:, None], dtype=np.int64)
            x[:, 2 * n + 1 : 2 * n + 1 + m] = keys.ravel()[pick]
            y[:, 2 * n + 1 : 2 * n + 1 + m] = values.ravel()[pick]
            continue
        if noise is None or noise:
            region = (rows, seq_len - 2 * n)
            x[:, 2 * n :] = rng.integers(first_value, vocab_size, size=region, dtype=np.int32)
        # Exponential race: slot i fires at Exp(1) / rate_i; the order in which
        # the slots fire is successive sampling without replacement with
        # probabilities proportional to the rates (Efraimidis & Spirakis, 2006).
        fire_time = rng.standard_exponential(size=(rows, slots)) / slot_rate  # [C, S]
        if n < slots:
            chosen = np.argpartition(fire_time, n - 1, axis=1)[:, :n]  # [C, n] unordered
        else:
            chosen = np.broadcast_to(np.arange(slots), (rows, slots)).copy()
        first_fired = np.argsort(np.take_along_axis(fire_time, chosen, axis=1), axis=1)
        chosen = np.take_along_axis(chosen, first_fired, axis=1)  # pair j -> j-th slot drawn
        # positions in the flattened [N * T] outputs: row * T + 2n + 2 * slot
        row_offset = np.arange(start, stop, dtype=np.int64)[:, None] * seq_len + 2 * n  # [C, 1]
        query_pos = 2 * chosen + row_offset  # [C, n]
        flat_inputs[query_pos] = keys
        flat_labels[query_pos] = values
    return torch.from_numpy(inputs), torch.from_numpy(labels)
