"""Shared fixtures: a tiny stand-in task and Hydra's compose API on the project's real config tree.

The stand-in task lives here, not in tasks/, so the training tests check train.py against the task
contract without depending on any particular generator.
"""

from __future__ import annotations

import os

# Triton reads TRITON_INTERPRET once, when it is first imported, and the Triton tests run its CPU interpreter.
# Set here, before any test module imports triton, so that no test depends on which file is collected first.
# On a GPU: `TRITON_INTERPRET=0 python -m pytest -m gpu tests/gpu` runs the compiled kernels instead.
os.environ.setdefault("TRITON_INTERPRET", "1")

# The compiling tests' graphs in a cache directory of this version of kernels/ (inductor's default, /tmp,
# outlives a checkout's edits): a graph cached under another version of our custom ops fails on their
# buffers' shapes (harness/caches.py)
if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
    import tempfile

    from harness.caches import inductor_name

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), "kda_harness_tests",
                                                         inductor_name())

# Under `pytest -n N` each worker gets its share of the cores for torch's OpenMP threads (and the processes
# its tests start): N workers with a thread per core each oversubscribe the machine, and OpenMP's spinning
# threads then make the small ops of these tests several times slower.
# Inductor's pool of compile workers likewise: a process per core, each importing torch, is pure startup
# cost when the other workers already keep the cores busy; at one thread inductor compiles in-process.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    share = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    os.environ.setdefault("OMP_NUM_THREADS", share)
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", share)

import sys  # noqa: E402
import types  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.config_store import ConfigStore  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

# tests/test_triton.py runs the Triton kernels in the interpreter, seconds a test on two cores. The edit-test
# loop (`-m "not slow"`) keeps each op's default path once: forward and every gradient against the token loop
# at T=100 (two chunks, the second partial) from an initial state, the bounded gate's fast path and its
# causality, the decode step, and the argument checks. The rest of the file (other lengths, and the matrix of
# launch alternatives and launch rules) is `slow`; a test added there is slow until it is named here.
TRITON_FAST: dict[str, Callable[[dict], bool]] = {
    "test_chunk_matches_naive": lambda p: p["T"] == 100 and p["with_state"],
    "test_kda_bounded_gate_matches_naive": lambda p: p["T"] == 100 and p["with_state"],
    "test_kda_is_causal": lambda p: p["T"] == 100 and p["lower_bound"] is not None,
    "test_recurrent_step_matches_naive": lambda p: True,
    "test_bad_arguments_raise": lambda p: True,
    "test_too_loose_lower_bound_takes_the_general_path": lambda p: True,
    "test_out_of_gpu_resources_names_the_call_and_the_fix": lambda p: True,
    "test_overrides_apply_inside_their_block_and_name_bad_ones": lambda p: True,
}


# The longest single tests (tens of seconds each on CI's two cores). pytest-xdist hands out the groups first,
# then single tests in collection order: these go first, so that the workers end together rather than one
# finishing a long test alone.
LONGEST = ("test_faults.py::test_fault_injection_fast", "test_campaign.py::test_a_deadline_runs",
           "test_campaign.py::test_a_campaign",
           "test_saved_memory.py::test_lean_backward_under_bf16", "test_hybrid.py::test_kimi_hybrid_smoke",
           "test_triton.py::test_bounded_no_grad_g16[100",
           "test_triton.py::test_bounded_intra_forward_unmasked",
           "test_occupancy.py::test_forward_kernels_wait",
           "test_triton.py::test_bounded_no_grad_log2[100",
           "test_compile.py::test_inductor_compiled_model_matches_eager", "test_campaign.py::test_stop",
           "test_caches.py::test_a_compiled_run")


def _cost_rank(item: pytest.Item) -> int:
    return next((i for i, prefix in enumerate(LONGEST) if prefix in item.nodeid), len(LONGEST))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_cost_rank)  # stable: the rest keep their order
    for item in items:
        if item.path.name != "test_triton.py":
            continue
        params = item.callspec.params if hasattr(item, "callspec") else {}
        fast = TRITON_FAST.get(item.originalname if hasattr(item, "originalname") else item.name)
        if fast is None or not fast(params):
            item.add_marker(pytest.mark.slow)

# A model small enough that a training test takes seconds on two CPU cores.
TINY = ["model.d_model=32", "mixer.num_heads=2", "mixer.head_dim=16", "model.mlp_ratio=2.0"]


def _previous_token(
    num_examples: int,
    seq_len: int,
    *,
    seed: int,
    vocab_size: int = 16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stand-in task: random tokens; the label at t is the token at t - 1 (none at t = 0).

    generate(1, 4, seed=0, vocab_size=16) -> inputs [a, b, c, d], labels [-100, a, b, c].
    """
    if vocab_size < 2:
        raise ValueError(f"previous_token: vocab_size={vocab_size} must be >= 2")
    inputs = np.random.default_rng(seed).integers(0, vocab_size, size=(num_examples, seq_len))
    labels = np.full_like(inputs, -100)
    labels[:, 1:] = inputs[:, :-1]
    return torch.from_numpy(inputs).long(), torch.from_numpy(labels).long()


def _num_tokens(*, vocab_size: int = 16) -> int:
    return vocab_size


@pytest.fixture(scope="session", autouse=True)
def stand_in_task() -> Iterator[str]:
    """Registers `tasks.stand_in` (module) and `task=stand_in` (config) for the whole session."""
    import tasks

    module = types.ModuleType("tasks.stand_in")
    module.generate = _previous_token
    module.num_tokens = _num_tokens
    sys.modules["tasks.stand_in"] = module
    tasks.stand_in = module
    ConfigStore.instance().store(
        group="task",
        name="stand_in",
        node={
            "name": "stand_in",
            "seq_len": 16,
            "eval_seq_lens": None,
            "num_train": 2048,
            "num_eval": 128,
            "params": {"vocab_size": 16},
        },
    )
    yield "stand_in"
    del sys.modules["tasks.stand_in"]
    del tasks.stand_in


@pytest.fixture
def make_cfg() -> Iterator[Callable[..., DictConfig]]:
    """Compose the real config (conf/config.yaml) with the stand-in task, the tiny model and overrides."""
    import harness.config  # noqa: F401  (registers the structured schema `base_config`)

    def make(*overrides: str, tiny: bool = True) -> DictConfig:
        # One CPU thread: tiny models on a busy 2-core machine run many times faster without OpenMP workers.
        base = [
            "task=stand_in",
            "mixer=attention",
            "trainer.device=cpu",
            "trainer.cpu_threads=1",
            "trainer.batch_size=16",
            "trainer.eval_batch_size=64",
            "optim.warmup_steps=5",
        ]
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("config", overrides=[*base, *(TINY if tiny else []), *overrides])

    threads = torch.get_num_threads()
    yield make
    torch.set_num_threads(threads)  # train() sets it process-wide; later tests get theirs back
