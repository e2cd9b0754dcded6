"""harness/caches.py: a compiled run turns the compile caches on and shares one directory per machine for
them, keeping what the user set in the environment; the summary says which directory and what the first
step found there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config

from harness import caches
from harness.caches import INDUCTOR_DIR, SWITCHES, TRITON_DIR, default_root, share_compile_caches
from harness.trainer import train
from tests.test_train import MakeCfg

MODULES = {"torch._inductor.config": inductor_config, "torch._functorch.config": functorch_config}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No cache variable set, the switches off, ~/.cache under tmp_path; all restored afterwards."""
    return _clean(monkeypatch, tmp_path)


def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for module_name, switch, variable in SWITCHES:
        monkeypatch.setattr(MODULES[module_name], switch, False)
        if variable:
            _unset(monkeypatch, variable)
    for variable in (INDUCTOR_DIR, TRITON_DIR):
        _unset(monkeypatch, variable)
    return monkeypatch


def _unset(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    # delenv of an absent variable records nothing, so what share_compile_caches sets would outlive the
    # test (the worker's later subprocesses compiling into a deleted tmp_path); setenv records its absence
    monkeypatch.setenv(variable, "")
    monkeypatch.delenv(variable)


def test_the_fixture_leaves_no_cache_variable_behind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for variable in (INDUCTOR_DIR, TRITON_DIR):
        monkeypatch.delenv(variable, raising=False)
    inner = _clean(pytest.MonkeyPatch(), tmp_path)
    share_compile_caches()
    assert os.environ.get(TRITON_DIR)
    inner.undo()
    assert INDUCTOR_DIR not in os.environ and TRITON_DIR not in os.environ


def test_the_caches_are_turned_on_in_one_directory_per_machine(clean_env: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    root = tmp_path / "xdg" / "kda_harness" / "compile"
    assert default_root() == root
    dirs = share_compile_caches()
    assert dirs == {"inductor": str(root / f"inductor-{caches.code_version()}"),
                    "triton": str(root / "triton")}
    assert (os.environ[INDUCTOR_DIR], os.environ[TRITON_DIR]) == (dirs["inductor"], dirs["triton"])
    for module_name, switch, _ in SWITCHES:
        assert getattr(MODULES[module_name], switch) is True, switch
    assert set(caches.cache_counts()) == {"fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass",
                                   "autograd_cache_hit", "autograd_cache_miss", "autograd_cache_bypass"}


def test_what_the_user_set_is_kept(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv(INDUCTOR_DIR, str(tmp_path / "mine"))
    clean_env.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    dirs = share_compile_caches()
    assert dirs["inductor"] == os.environ[INDUCTOR_DIR] == str(tmp_path / "mine")
    assert dirs["triton"] == str(default_root() / "triton")
    # the user's variable forces the FX graph cache: the switch is theirs; the others are turned on
    assert inductor_config.fx_graph_cache is False
    assert functorch_config.enable_autograd_cache is True


@pytest.mark.slow  # inductor compiles the step on the CPU: ~2 min on two cores
def test_a_compiled_run_uses_the_shared_caches_and_says_so(clean_env: pytest.MonkeyPatch, make_cfg: MakeCfg,
                                                           tmp_path: Path) -> None:
    # the partitioner's budget is process-wide: the run sets it, monkeypatch puts torch's back
    clean_env.setattr(functorch_config, "activation_memory_budget", functorch_config.activation_memory_budget)
    summary = train(make_cfg("trainer.compile=true", "trainer.max_steps=1", "trainer.eval_every=1",
                             "trainer.compile_memory_budget=0.5"), tmp_path / "run", mixer_name="attention")
    root = default_root()
    assert summary["compile"] is True and summary["compile_memory_budget"] == 0.5
    assert functorch_config.activation_memory_budget == 0.5
    assert "| compiled, memory budget 0.5 |" in (tmp_path / "run" / "train.log").read_text()
    inductor = root / caches.inductor_name()
    assert summary["compile_cache"] == {"inductor": str(inductor), "triton": str(root / "triton")}
    # inductor wrote its compiled graphs there, and the first step compiled (a miss or a hit, each counted)
    assert any(inductor.iterdir())
    counts = summary["first_step_cache_counts"]
    assert counts["fxgraph_cache_miss"] + counts["fxgraph_cache_hit"] > 0, counts
    assert f"compile caches: inductor {inductor}" in (tmp_path / "run" / "train.log").read_text()


def test_an_eager_run_leaves_the_environment_alone(clean_env: pytest.MonkeyPatch, make_cfg: MakeCfg,
                                                   tmp_path: Path) -> None:
    summary = train(make_cfg("trainer.max_steps=1", "trainer.eval_every=1"), tmp_path, mixer_name="attention")
    assert summary["compile"] is False and "compile_cache" not in summary
    assert INDUCTOR_DIR not in os.environ and TRITON_DIR not in os.environ


def test_the_code_version_follows_every_source_file_under_kernels(tmp_path: Path) -> None:
    tree = tmp_path / "kernels"
    (tree / "triton").mkdir(parents=True)
    (tree / "triton" / "chunk.py").write_text("def saved_layout(): ...\n")
    (tree / "naive.py").write_text("x = 1\n")
    first = caches.code_version(tree)
    (tree / "notes.txt").write_text("not code")
    assert caches.code_version.__wrapped__(tree) == first
    (tree / "triton" / "chunk.py").write_text("def saved_layout(): return None\n")
    assert caches.code_version.__wrapped__(tree) != first
    assert caches.inductor_name("abc") == "inductor-abc"
    # the checkout's own: 12 hex digits, the name of inductor's directory
    assert len(caches.code_version()) == 12 and caches.inductor_name().endswith(caches.code_version())


def test_other_versions_directories_go_once_unused(tmp_path: Path) -> None:
    keep, recent, old, legacy = (tmp_path / name for name in
                                 ("inductor-new", "inductor-recent", "inductor-old", "inductor"))
    for path in (keep, recent, old, legacy):
        (path / "fxgraph").mkdir(parents=True)
    (tmp_path / "triton").mkdir()
    month_ago = os.path.getmtime(keep) - 30 * 86400
    for path in (keep, old, legacy):
        os.utime(path, (month_ago, month_ago))
    assert sorted(caches.prune(tmp_path, keep)) == sorted([old, legacy])
    assert keep.is_dir() and recent.is_dir() and (tmp_path / "triton").is_dir()


def test_a_graph_cached_under_other_kernels_is_not_reused(clean_env: pytest.MonkeyPatch) -> None:
    # the compile caches key a graph by its trace, not by our custom ops' source: a graph cached while the
    # chunk op kept other buffers (its plan's keep_decayed flipped, as another version of kernels/ may) is
    # reused and fails on their shapes where one directory serves both versions. One a version: compiles.
    import dataclasses

    os.environ.setdefault("TRITON_INTERPRET", "1")
    pytest.importorskip("triton")
    import torch

    from benchmarks.common import make_inputs
    from kernels.triton import plan, triton_chunk
    from kernels.triton.chunk import INTERPRET

    if not INTERPRET:
        pytest.skip("kernels.triton was imported without TRITON_INTERPRET=1 (CPU tensors)")
    clean_env.setenv(INDUCTOR_DIR, "")  # (restored afterwards; empty: share_compile_caches sets it)
    x = make_inputs("channel", True, 1, 21, 2, K=16, V=16, seed=0, with_state=False)

    def step() -> list[torch.Tensor]:
        torch._dynamo.reset()
        leaves = [x[n].clone().requires_grad_() for n in ("q", "k", "v", "g", "beta")]
        layer = torch.compile(lambda q, k, v, g, beta: triton_chunk(q, k, v, g * 1.0, beta)[0])
        layer(*leaves).square().sum().backward()
        return [t.grad for t in leaves]

    rule = plan.plan_forward
    used = {}
    for version, flipped in (("aaaa", True), ("bbbb", False)):
        clean_env.setattr(caches, "code_version", lambda version=version: version)
        clean_env.setattr(plan, "plan_forward",
                          (lambda p: dataclasses.replace(rule(p), keep_decayed=not rule(p).keep_decayed))
                          if flipped else rule)
        os.environ[INDUCTOR_DIR] = ""
        used[version] = Path(share_compile_caches()["inductor"])
        grads = step()
    assert used == {v: default_root() / f"inductor-{v}" for v in used}
    assert all(any(path.iterdir()) for path in used.values())
    torch._dynamo.reset()
    leaves = [x[n].clone().requires_grad_() for n in ("q", "k", "v", "g", "beta")]
    triton_chunk(*leaves)[0].square().sum().backward()
    for ours, eager in zip(grads, (t.grad for t in leaves), strict=True):
        torch.testing.assert_close(ours, eager)
