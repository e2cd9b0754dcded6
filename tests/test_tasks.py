"""The synthetic task generators (tasks/): layout, labels, determinism, validation, speed.

Labels are checked against slow, obvious references that replay each sequence
token by token and derive the label at t from inputs[:t+1] only, so they also
check that every label is a function of what a causal model has read.
"""

from __future__ import annotations

import time
from collections import Counter
from types import ModuleType

import numpy as np
import pytest
import torch

from tasks import mqar, palindrome, stack

IGNORE = -100

# (module, params) settings: paper-like defaults, the small CPU settings, odd lengths, edge cases
CASES: list[tuple[ModuleType, dict, int]] = [
    (palindrome, {}, 256),
    (palindrome, {"vocab_size": 4}, 63),
    (palindrome, {"vocab_size": 10}, 3),
    (mqar, {}, 256),
    (mqar, {"vocab_size": 64}, 64),
    (mqar, {"vocab_size": 20, "num_pairs": 9, "num_queries": 5}, 41),
    (mqar, {"vocab_size": 8, "num_pairs": 3}, 9),  # dense: all 3 keys used
    (mqar, {"form": "zoology"}, 256),
    (mqar, {"form": "zoology", "vocab_size": 64, "num_pairs": 5, "power_a": 1.0}, 65),
    (mqar, {"form": "zoology", "vocab_size": 40, "num_pairs": 4, "noise": False}, 16),
    (stack, {}, 256),
    (stack, {"num_stacks": 4, "num_elements": 8}, 64),
    (stack, {"num_stacks": 2, "num_elements": 3, "push_prob": 0.9}, 301),
    (stack, {"num_stacks": 64, "num_elements": 2}, 7),  # forces the final pop on almost every row
    (stack, {"num_stacks": 3, "num_elements": 40000}, 90),  # elements beyond int16: the int32 store
]
IDS = [f"{m.__name__.split('.')[-1]}-{p}-T{t}" for m, p, t in CASES]


def replay_palindrome(x: np.ndarray) -> np.ndarray:
    """Labels of one palindrome sequence, derived position by position from the prefix."""
    labels = np.full(len(x), IGNORE)
    sep = None
    for t in range(len(x)):
        if sep is None and x[t] == palindrome.SEP:
            sep = t
        # after <sep> at position p, the output at t must be the mirror image x[2p-1-t], until t = 2p-1
        if sep is not None and t < 2 * sep:
            labels[t] = x[2 * sep - 1 - t]
    return labels


def replay_mqar(x: np.ndarray, vocab_size: int, form: str, num_pairs: int) -> np.ndarray:
    """Labels of one MQAR sequence: remember the pairs, answer each key-range token after them."""
    first_value = mqar.FIRST_KEY + (vocab_size - mqar.FIRST_KEY) // 2
    labels = np.full(len(x), IGNORE)
    pairs: dict[int, int] = {}
    context_end = 2 * num_pairs + (1 if form == "kimi" else 0)
    for t, token in enumerate(x.tolist()):
        if t < 2 * num_pairs:
            if t % 2 == 0:
                assert mqar.FIRST_KEY <= token < first_value, f"key {token} at {t} outside the key range"
                assert token not in pairs, f"key {token} repeats at {t}"
                pairs[token] = -1
            else:
                assert first_value <= token < vocab_size, f"value {token} at {t} outside the value range"
                pairs[x[t - 1]] = token
        elif t < context_end:
            assert token == mqar.SEP
        elif mqar.FIRST_KEY <= token < first_value:
            labels[t] = pairs[token]  # KeyError: a query of a key that is not in the context
    return labels


def replay_stack(x: np.ndarray, num_stacks: int) -> np.ndarray:
    """Labels of one stack stream: simulate the stacks with Python lists."""
    first_element = stack.FIRST_STACK + num_stacks
    stacks: list[list[int]] = [[] for _ in range(num_stacks)]
    labels = np.full(len(x), IGNORE)
    for j in range(len(x) // 3):
        op, s, e = x[3 * j : 3 * j + 3].tolist()
        assert stack.FIRST_STACK <= s < first_element and e >= first_element
        s -= stack.FIRST_STACK
        if op == stack.PUSH:
            stacks[s].append(e)
        else:
            assert op == stack.POP, f"op token {op} at {3 * j}"
            assert stacks[s], f"pop of the empty stack {s} at step {j}"
            # the label sits at the stack-id position: the model has read <pop> s, not e
            labels[3 * j + 1] = stacks[s].pop()
            assert e == labels[3 * j + 1], "the input e of a pop must be the popped element"
    assert (x[3 * (len(x) // 3) :] == stack.PAD).all()
    return labels


def replay(module: ModuleType, params: dict, x: np.ndarray) -> np.ndarray:
    if module is palindrome:
        return replay_palindrome(x)
    if module is mqar:
        n = params.get("num_pairs") or mqar.default_num_pairs(len(x))
        return replay_mqar(x, params.get("vocab_size", 8192), params.get("form", "kimi"), n)
    return replay_stack(x, params.get("num_stacks", 64))


@pytest.mark.parametrize(("module", "params", "seq_len"), CASES, ids=IDS)
def test_layout_and_labels_match_replay(module: ModuleType, params: dict, seq_len: int) -> None:
    inputs, labels = module.generate(64, seq_len, seed=3, **params)
    assert inputs.shape == labels.shape == (64, seq_len)
    assert inputs.dtype == labels.dtype == torch.int64
    vocab = module.num_tokens(**params)
    assert 0 <= int(inputs.min()) and int(inputs.max()) < vocab
    scored = labels != IGNORE
    assert (labels[scored] >= 0).all() and (labels[scored] < vocab).all()
    assert scored.any(dim=1).all(), "every sequence needs at least one scored position"
    for x, y in zip(inputs.numpy(), labels.numpy(), strict=True):
        np.testing.assert_array_equal(y, replay(module, params, x))


@pytest.mark.parametrize(("module", "params", "seq_len"), CASES, ids=IDS)
def test_same_seed_same_data_other_seed_other_data(module: ModuleType, params: dict, seq_len: int) -> None:
    a = module.generate(32, seq_len, seed=11, **params)
    b = module.generate(32, seq_len, seed=11, **params)
    c = module.generate(32, seq_len, seed=12, **params)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_seed_is_local() -> None:
    """No global RNG: reseeding or drawing from numpy's global state changes nothing."""
    np.random.seed(0)
    a = mqar.generate(8, 64, seed=5, vocab_size=64)
    np.random.seed(1)
    np.random.random(10)
    b = mqar.generate(8, 64, seed=5, vocab_size=64)
    assert torch.equal(a[0], b[0])


@pytest.mark.parametrize("seq_len", [256, 512, 1024, 2048])
def test_every_task_generates_at_every_fig4_length(seq_len: int) -> None:
    """Kimi Fig. 4's lengths with the yaml defaults; num_pairs follows seq_len // 8."""
    for module in (palindrome, mqar, stack):
        inputs, labels = module.generate(4, seq_len, seed=0)
        for x, y in zip(inputs.numpy(), labels.numpy(), strict=True):
            np.testing.assert_array_equal(y, replay(module, {}, x))
    _, labels = mqar.generate(2, seq_len, seed=0)
    assert (labels != IGNORE).sum(dim=1).tolist() == [seq_len - 2 * (seq_len // 8) - 1] * 2


def test_palindrome_scores_exactly_the_reversed_half() -> None:
    inputs, labels = palindrome.generate(5, 9, seed=0, vocab_size=7)  # n = 4, no pad
    x, y = inputs.numpy(), labels.numpy()
    np.testing.assert_array_equal(x[:, 4], palindrome.SEP)
    np.testing.assert_array_equal(x[:, 5:], x[:, 3::-1])
    np.testing.assert_array_equal(y[:, 4:8], x[:, 5:9])  # output at t predicts inputs[t + 1]
    assert (y[:, :4] == IGNORE).all() and (y[:, 8] == IGNORE).all()
    even = palindrome.generate(5, 10, seed=0, vocab_size=7)[0]
    assert (even[:, -1] == palindrome.PAD).all()


def test_mqar_keys_distinct_and_ranges_disjoint() -> None:
    vocab = 40  # 19 keys, 19 values; 9 pairs: the sparse redraw path
    inputs, _ = mqar.generate(2000, 64, seed=0, vocab_size=vocab, num_pairs=9)
    keys, values = inputs[:, 0:18:2].numpy(), inputs[:, 1:18:2].numpy()
    assert all(len(set(row)) == 9 for row in keys)
    first_value = mqar.FIRST_KEY + 19
    assert keys.min() >= mqar.FIRST_KEY and keys.max() < first_value
    assert values.min() >= first_value and values.max() < vocab


@pytest.mark.parametrize("vocab_size", [8, 14])  # 3 keys (dense path) and 6 keys (sparse path)
def test_mqar_distinct_keys_are_uniform_over_ordered_tuples(vocab_size: int) -> None:
    """The duplicate-redraw sampler must give every ordered tuple of distinct keys the same chance."""
    num_keys = (vocab_size - 2) // 2
    inputs, _ = mqar.generate(24000, 9, seed=1, vocab_size=vocab_size, num_pairs=3)
    counts = Counter(map(tuple, inputs[:, 0:6:2].tolist()))
    expected_tuples = num_keys * (num_keys - 1) * (num_keys - 2)
    assert len(counts) == expected_tuples
    mean = 24000 / expected_tuples
    chi2 = sum((c - mean) ** 2 / mean for c in counts.values())
    # chi-square with expected_tuples - 1 degrees of freedom: mean dof, sd sqrt(2 dof); 5 sd is a loose bound
    dof = expected_tuples - 1
    assert chi2 < dof + 5 * (2 * dof) ** 0.5, f"chi2={chi2:.1f} for {dof} degrees of freedom"


def test_mqar_zoology_queries_each_key_once_on_power_law_slots() -> None:
    n, seq_len = 8, 128
    slots = (seq_len - 2 * n) // 2
    skewed = mqar.generate(400, seq_len, seed=0, form="zoology", vocab_size=64, num_pairs=n)
    uniform = mqar.generate(400, seq_len, seed=0, form="zoology", vocab_size=64, num_pairs=n, power_a=1.0)
    for inputs, labels in (skewed, uniform):
        scored = (labels != IGNORE).numpy()
        assert (scored.sum(axis=1) == n).all()
        rows, cols = np.nonzero(scored)
        assert ((cols - 2 * n) % 2 == 0).all() and (cols >= 2 * n).all()  # first position of a slot
        queried = inputs.numpy()[rows, cols].reshape(-1, n)
        keys = inputs[:, 0 : 2 * n : 2].numpy()
        np.testing.assert_array_equal(np.sort(queried, axis=1), np.sort(keys, axis=1))
    mean_slot = [(np.nonzero((y != IGNORE).numpy())[1] - 2 * n).mean() / 2 for _, y in (skewed, uniform)]
    # power_a = 0.01 puts queries near the context; uniform choice averages about half the slots
    assert mean_slot[0] < 0.75 * mean_slot[1]
    assert abs(mean_slot[1] - (slots - 1) / 2) < 0.1 * slots


def test_mqar_zoology_slots_follow_successive_weighted_sampling() -> None:
    """Pair 1 takes slot i with p_i = w_i / W, then pair 2 slot j with w_j / (W - w_i); w_i = i ** (a - 1)."""
    a, n, slots = 0.5, 2, 3
    inputs, _ = mqar.generate(
        30000, 2 * n + 2 * slots, seed=0, form="zoology", vocab_size=12, num_pairs=n, power_a=a
    )
    x = inputs.numpy()
    slot_of = [np.argmax(x[:, 2 * n :: 2] == x[:, [2 * p]], axis=1) for p in range(n)]  # [N] per pair
    w = np.arange(1, slots + 1) ** (a - 1.0)
    for i in range(slots):
        for j in range(slots):
            if i == j:
                continue
            expected = w[i] / w.sum() * w[j] / (w.sum() - w[i])
            observed = np.mean((slot_of[0] == i) & (slot_of[1] == j))
            assert abs(observed - expected) < 0.01, (i, j, observed, expected)


def test_stack_push_prob_sets_the_share_of_pops() -> None:
    shares = []
    for push_prob in (0.3, 0.5, 0.8):
        inputs, _ = stack.generate(200, 300, seed=0, num_stacks=4, num_elements=8, push_prob=push_prob)
        shares.append(float((inputs[:, 0::3] == stack.POP).float().mean()))
    assert shares[0] > shares[1] > shares[2] > 0.05


def test_stack_contents_grow_past_the_initial_depth() -> None:
    """push_prob 0.95 on one stack makes it hundreds deep: exercises the growth of the store."""
    inputs, labels = stack.generate(16, 1500, seed=0, num_stacks=1, num_elements=5, push_prob=0.95)
    for x, y in zip(inputs.numpy(), labels.numpy(), strict=True):
        np.testing.assert_array_equal(y, replay_stack(x, 1))


def test_docstring_examples_follow_the_rules() -> None:
    """The worked examples in the module docstrings replay to the labels they show."""
    x = np.array([4, 2, 5, 1, 5, 2, 4, 0])
    np.testing.assert_array_equal(replay_palindrome(x), [IGNORE] * 3 + [5, 2, 4] + [IGNORE] * 2)
    x = np.array([3, 9, 6, 7, 1, 6, 3, 3, 6, 6])
    np.testing.assert_array_equal(replay_mqar(x, 12, "kimi", 2), [IGNORE] * 5 + [7, 9, 9, 7, 7])
    x = np.array([5, 8, 2, 10, 5, 0, 0, 0, 2, 0, 0, 0])
    expected = [IGNORE] * 4 + [8] + [IGNORE] * 3 + [10] + [IGNORE] * 3
    np.testing.assert_array_equal(replay_mqar(x, 12, "zoology", 2), expected)
    x = np.array([1, 3, 6, 1, 4, 5, 1, 3, 7, 2, 3, 7, 2, 3, 6, 2, 4, 5, 0, 0])
    expected = np.full(20, IGNORE)
    expected[[10, 13, 16]] = [7, 6, 5]
    np.testing.assert_array_equal(replay_stack(x, 2), expected)


@pytest.mark.parametrize(
    ("module", "seq_len", "params", "message"),
    [
        (palindrome, 2, {}, r"seq_len=2 is too short.*seq_len >= 3"),
        (palindrome, 16, {"vocab_size": 3}, r"vocab_size=3 .*pass vocab_size >= 4"),
        (mqar, 64, {"form": "both"}, r"unknown form='both'; pass one of \('kimi', 'zoology'\)"),
        (mqar, 64, {"vocab_size": 16}, r"num_pairs=8 needs 8 distinct keys but vocab_size=16 has only 7"),
        (mqar, 64, {"num_pairs": 40}, r"num_pairs=40 leaves no room for a query.*num_pairs <= 31"),
        (mqar, 64, {"num_pairs": 0}, r"num_pairs=0 must be >= 1"),
        (mqar, 64, {"num_queries": 100}, r"num_queries=100 must be in \[1, 47\]"),
        (mqar, 64, {"form": "zoology", "num_pairs": 17}, r"num_pairs=17 at seq_len=64 gives 15 slots.*<= 16"),
        (mqar, 64, {"power_a": 0.5}, r"power_a=0.5 only applies to form='zoology'"),
        (mqar, 64, {"noise": False}, r"noise=False only applies to form='zoology'"),
        (mqar, 64, {"form": "zoology", "num_queries": 3}, r"num_queries=3 only applies to form='kimi'"),
        (mqar, 64, {"form": "zoology", "power_a": 0.0}, r"power_a=0.0 must be > 0"),
        (mqar, 3, {}, r"seq_len=3 is too short"),
        (stack, 5, {}, r"seq_len=5 is too short.*seq_len >= 6"),
        (stack, 64, {"push_prob": 1.0}, r"push_prob=1.0 must lie strictly inside \(0, 1\)"),
        (stack, 64, {"push_prob": 0.0}, r"push_prob=0.0 must lie strictly inside"),
        (stack, 64, {"num_stacks": 0}, r"num_stacks=0 must be >= 1"),
        (stack, 64, {"num_elements": 1}, r"num_elements=1 .*num_elements >= 2"),
        # what a YAML config can hand over by mistake: a quoted number, a float, a string flag
        (mqar, 64, {"num_pairs": "20"}, r"num_pairs='20' must be an integer"),
        (palindrome, 64, {"vocab_size": 1e3}, r"vocab_size=1000.0 must be an integer"),
        (stack, 64.0, {}, r"seq_len=64.0 must be an integer"),
        (stack, 64, {"push_prob": "0.5"}, r"push_prob='0.5' must be a number"),
        (mqar, 64, {"form": "zoology", "noise": "yes"}, r"noise='yes' must be true, false or null"),
    ],
)
def test_bad_parameters_raise_a_value_error_naming_them(
    module: ModuleType, seq_len: int, params: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        module.generate(4, seq_len, seed=0, **params)


def test_num_tokens_validates_the_vocabulary_up_front() -> None:
    assert palindrome.num_tokens(vocab_size=10) == 10
    assert mqar.num_tokens() == 8192
    assert stack.num_tokens(num_stacks=64, num_elements=64) == 3 + 64 + 64
    with pytest.raises(ValueError, match="vocab_size=3"):
        palindrome.num_tokens(vocab_size=3)
    with pytest.raises(ValueError, match="num_pairs=10 exceeds the 4 keys of vocab_size=10"):
        mqar.num_tokens(vocab_size=10, num_pairs=10)
    with pytest.raises(ValueError, match="push_prob"):
        stack.num_tokens(push_prob=2.0)
    with pytest.raises(TypeError):
        stack.num_tokens(num_stack=4)  # a misspelt parameter is Python's TypeError


@pytest.mark.slow
# one worker draws them one after another: two sets of a few GB written at once on two cores take as long
# as four in a row
@pytest.mark.xdist_group("bulk_data")
@pytest.mark.parametrize(
    ("module", "params"),
    [(palindrome, {}), (mqar, {}), (mqar, {"form": "zoology"}), (stack, {})],
    ids=["palindrome", "mqar-kimi", "mqar-zoology", "stack"],
)
def test_100k_sequences_of_length_2048_take_seconds(module: ModuleType, params: dict) -> None:
    start = time.perf_counter()
    inputs, labels = module.generate(100_000, 2048, seed=0, **params)
    elapsed = time.perf_counter() - start
    print(f"{module.__name__} {params}: 100k x 2048 in {elapsed:.1f} s")
    assert inputs.shape == (100_000, 2048)
    # generous: a few seconds when the machine is free, shared 2-core CI may be several times slower
    assert elapsed < 90.0


@pytest.mark.parametrize(("seq_len", "form", "pairs", "queries"),
                         [(256, "kimi", None, None), (257, "kimi", 20, 7), (256, "zoology", None, None),
                          (100, "zoology", 9, None)])
def test_mqar_counts_are_the_pairs_and_queries_generate_writes(
        seq_len: int, form: str, pairs: int | None, queries: int | None) -> None:
    # the report's MQAR load reads counts(); each query is one labelled position of the data
    n, m = mqar.counts(seq_len, form, pairs, queries)
    _, labels = mqar.generate(3, seq_len, seed=0, vocab_size=512, form=form, num_pairs=pairs,
                              num_queries=queries)
    assert ((labels != -100).sum(1) == m).all()
    assert n == (pairs or seq_len // 8)
