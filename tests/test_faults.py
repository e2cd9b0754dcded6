"""Faults and bad input: nothing lost, nothing mislabelled.

Each test here replays one way a careful user broke the harness (two processes in one run directory,
impossible optimiser values, a changed config on resume, `+key` typos, a zero decay, corrupt files, a
killed worker, SIGTERM) and checks that the run directory stays consistent, or that the launch is refused
with a message naming the value and the fix. tests/fault_injection.py replays them end to end (with a kill
storm on a small sweep); `test_fault_injection_fast` runs its fast form.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from helpers import CLI_TINY
from omegaconf import DictConfig
from test_analysis import write_run

import kernels
import kernels.ops
from analysis import collect, plot
from benchmarks.common import rel_rms
from harness.check import ConfigError
from harness.data import EpochSampler
from harness.rundir import FileUnreadable, ResumeRefused, RunDirBusy
from harness.step import lr_factor
from harness.trainer import train

ROOT = Path(__file__).resolve().parents[1]
MakeCfg = Callable[..., DictConfig]


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _files(run_dir: Path) -> dict[str, bytes]:
    """Every file under a run directory (the lock's, empty while nobody holds it, aside), with its bytes."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != ".lock"}


# ---- kernels: a zero decay, non-finite inputs, Triton without a GPU ----

SCALAR_AND_CHANNEL = [
    ("simple_gla", "scalar", False),
    ("gated_delta_rule", "scalar", True),
    ("gla", "channel", False),
    ("kda", "channel", True),
]


@pytest.mark.parametrize(("name", "decay", "delta"), SCALAR_AND_CHANNEL,
                         ids=[c[0] for c in SCALAR_AND_CHANNEL])
def test_zero_decay_matches_the_reference(name: str, decay: str, delta: bool) -> None:
    """g = -inf (exp(g) = 0: the state is forgotten) is legal; the chunked form must equal the token loop,
    in outputs, final state and every gradient, not turn NaN."""
    gen = torch.Generator().manual_seed(0)
    B, T, H, K, V = 1, 40, 2, 8, 8
    shape = (B, T, H) if decay == "scalar" else (B, T, H, K)
    g = F.logsigmoid(torch.randn(shape, generator=gen))
    g[:, [5, 17, 39]] = -math.inf  # a chunk start, the middle of a chunk, the last token
    inputs = {
        "q": torch.randn(B, T, H, K, generator=gen),
        "k": F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1),
        "v": torch.randn(B, T, H, V, generator=gen),
        "g": g,
    }
    if delta:
        inputs["beta"] = torch.rand(B, T, H, generator=gen)
    initial = torch.randn(B, H, K, V, generator=gen)
    op = getattr(kernels, f"chunk_{name}")
    results = {}
    for backend in ("naive", "torch"):
        leaves = {key: value.clone().requires_grad_() for key, value in inputs.items()}
        state = initial.clone().requires_grad_()
        o, final = op(**leaves, initial_state=state, output_final_state=True, backend=backend, chunk_size=16)
        (o.square().sum() + final.square().sum()).backward()
        results[backend] = [o, final, state.grad] + [leaves[key].grad for key in inputs]
    for ref, out in zip(results["naive"], results["torch"], strict=True):
        assert torch.isfinite(out).all()
        assert rel_rms(ref, out) < 1e-5


@pytest.mark.parametrize("bad", ["q", "k", "v", "beta", "initial_state"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_inputs_are_named(bad: str, value: float, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(0)
    B, T, H, K, V = 1, 8, 2, 8, 8
    args = {
        "q": torch.randn(B, T, H, K, generator=gen),
        "k": torch.randn(B, T, H, K, generator=gen),
        "v": torch.randn(B, T, H, V, generator=gen),
        "g": -torch.rand(B, T, H, K, generator=gen),
        "beta": torch.rand(B, T, H, generator=gen),
        "initial_state": torch.zeros(B, H, K, V),
    }
    args[bad].view(-1)[3] = value
    with pytest.raises(ValueError, match=rf"chunk_kda: {bad} hold\(s\) NaN or infinite"):
        kernels.chunk_kda(**args, backend="torch")
    # the check is one of the value checks: the gate the training loop turns off between its log steps
    monkeypatch.setattr(kernels.ops, "_values_checked", lambda t: False)
    kernels.chunk_kda(**args, backend="torch")


def test_triton_without_gpu_or_interpreter_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = torch.randn(1, 4, 1, 8)
    with pytest.raises(ValueError, match=r"backend='triton' got tensors on cpu.*TRITON_INTERPRET=1"):
        kernels.chunk_linear_attn(q, q, q, backend="triton")
    with pytest.raises(ValueError, match=r"TRITON_INTERPRET=1"):
        kernels.linear_attn_step(q[:, 0], q[:, 0], q[:, 0], torch.zeros(1, 1, 8, 8), backend="triton")


# ---- the run directory: one writer, consistent files, clear refusals ----

SHORT = ["trainer.max_steps=20", "trainer.eval_every=10", "trainer.log_every=2", "trainer.checkpoint_every=5"]


def _interrupted_run(
    make_cfg: MakeCfg, run_dir: Path, monkeypatch: pytest.MonkeyPatch, *overrides: str
) -> None:
    """A run stopped by Ctrl-C as step 13 starts: checkpoint of step 12, summary `incomplete`."""
    indices = EpochSampler.indices

    def stop_at_13(self: EpochSampler, step: int) -> torch.Tensor:
        if step == 12:
            raise KeyboardInterrupt
        return indices(self, step)

    with monkeypatch.context() as patch:
        patch.setattr(EpochSampler, "indices", stop_at_13)
        with pytest.raises(KeyboardInterrupt):
            train(make_cfg(*SHORT, *overrides), run_dir, mixer_name="attention")
    assert _summary(run_dir)["status"] == "incomplete"


def _hold_lock(run_dir: Path) -> subprocess.Popen[str]:
    """Another process that holds the run directory's lock until killed."""
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r}); from harness.rundir import RunDir\n"
            f"with RunDir({str(run_dir)!r}).lock():\n    print('held', flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_writer_is_refused_and_a_killed_one_holds_no_lock(make_cfg: MakeCfg, tmp_path: Path) -> None:
    holder = _hold_lock(tmp_path)
    try:
        with pytest.raises(RunDirBusy, match=rf"in use by pid {holder.pid} .*wait for that run to end"):
            train(make_cfg(*SHORT), tmp_path, mixer_name="attention")
        # refused before it touched anything
        assert not (tmp_path / "summary.json").exists() and not (tmp_path / "metrics.jsonl").exists()
    finally:
        holder.kill()  # SIGKILL: no chance to release anything
        holder.wait()
    assert train(make_cfg(*SHORT), tmp_path, mixer_name="attention")["status"] == "completed"


def test_a_refused_command_line_run_writes_nothing_into_the_directory(tmp_path: Path) -> None:
    # Hydra saves .hydra/ before train.py runs: the run-dir lock is taken before that (hydra.callbacks)
    run_dir = tmp_path / "run"
    holder = _hold_lock(run_dir)
    try:
        command = [sys.executable, "train.py", "trainer.max_steps=1", f"hydra.run.dir={run_dir}"]
        refused = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    finally:
        holder.kill()
        holder.wait()
    assert refused.returncode == 1 and f"in use by pid {holder.pid}" in refused.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("optim.grad_clip=-1", "optim.grad_clip=-1.0: must be > 0, or null"),
        ("optim.grad_clip=0", "optim.grad_clip=0.0: must be > 0, or null"),
        ("optim.weight_decay=-1", "optim.weight_decay=-1.0: must be >= 0"),
        ("trainer.acc_threshold=2", r"trainer.acc_threshold=2.0: must be in \[0, 1\]"),
        ("trainer.cpu_threads=0", r"trainer.cpu_threads=0: must be >= 1 \(or null\)"),
        ("optim.lr=inf", "optim.lr=inf is not a finite number"),
        ("+trainer.max_stepz=10", "unknown key trainer.max_stepz .did you mean trainer.max_steps"),
        ("+optim.lrr=1e-2", "unknown key optim.lrr .did you mean optim.lr"),
        ("+task.seq_lenn=64", "unknown key task.seq_lenn"),
        ("+sed=1", "unknown key sed .did you mean seed"),
        ("+model.d_modle=64", "unknown key model.d_modle .did you mean model.d_model"),
        # a batch larger than the train set was accepted and then filled memory with repeats
        ("trainer.batch_size=999", r"trainer.batch_size=999 > task.num_train=64: .*lower trainer.batch_"),
        ("+mixer.head_dimm=8", r"unknown parameter\(s\) \['head_dimm'\]"),
        # a sequence too short for the task's pairs, found by drawing one sequence
        ("+task.params.num_pairs=20", r"num_pairs=20 leaves no room for a query at seq_len=32"),
    ],
)
def test_impossible_values_and_added_keys_are_refused(
    make_cfg: MakeCfg, tmp_path: Path, override: str, named: str
) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=named):
        mqar = ("task=mqar", "task.seq_len=32", "task.num_train=64", "task.num_eval=16",
                "task.params.vocab_size=64")
        train(make_cfg(*SHORT, override, *mqar), run_dir, mixer_name="attention")
    # found before anything is written: not even the directory
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("mixer", "override", "named"),
    [
        ("kda", "mixer.head_dim=96", r"mixer 'kda': head_dim=96: the Triton kernels, which run this "
                                     r"layer on cuda:0, take 16, 32, 64, 128, 256; choose one, or "
                                     r"mixer.backend=torch"),
        ("gdn", "mixer.value_dim=48", r"mixer 'gdn': value_dim=48: .* take 16, 32, 64, 128, 256"),
        ("kda", "mixer.chunk_size=128", r"mixer 'kda': chunk_size=128: .* take 16, 32, 64; choose one"),
    ],
)
def test_sizes_the_gpu_kernels_cannot_run_are_refused_before_the_first_step(
    make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mixer: str, override: str, named: str
) -> None:
    """On a GPU (auto runs the Triton kernels there) a head size or chunk size they do not take is a config
    error, found before anything is written; the torch backend, or the CPU, takes any size."""
    monkeypatch.setattr("harness.check.resolve_device", lambda spec, job_num=None: torch.device("cuda", 0))
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=named):
        train(make_cfg(*SHORT, f"mixer={mixer}", override), run_dir, mixer_name=mixer)
    assert not run_dir.exists()
    from harness.check import preflight

    for fine in ((override, "mixer.backend=torch"), ("mixer.head_dim=64", "mixer.chunk_size=32")):
        preflight(make_cfg(*SHORT, f"mixer={mixer}", *fine), mixer_name=mixer)
    monkeypatch.undo()
    preflight(make_cfg(*SHORT, f"mixer={mixer}", override), mixer_name=mixer)


@pytest.mark.parametrize(("mixer", "override"), [
    ("kda", "mixer.gate_low_rank_dim=0"),
    ("kda", "mixer.output_gate_low_rank_dim=0"),
    ("gla", "mixer.gate_low_rank_dim=0"),
])
def test_a_low_rank_dim_of_zero_is_refused_not_read_as_its_default(
    make_cfg: MakeCfg, mixer: str, override: str
) -> None:
    """0 read as null (`x or default`): the run built the full-rank layer nobody asked for, or a
    zero-width one (GLA)."""
    from harness.check import preflight

    key = override.split(".", 1)[1].split("=")[0]
    extra = ("mixer.output_gate_rank=low",) if "output" in key else ()
    with pytest.raises(ConfigError, match=rf"mixer '{mixer}': {key}=0; it must be a positive integer"):
        preflight(make_cfg(*SHORT, f"mixer={mixer}", override, *extra), mixer_name=mixer)


def test_the_triton_backend_on_the_cpu_without_its_interpreter_is_refused_up_front(
    make_cfg: MakeCfg, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.check import preflight

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ConfigError, match=r"mixer 'kda': backend=triton on cpu: the Triton kernels need a "):
        preflight(make_cfg(*SHORT, "mixer=kda", "mixer.backend=triton"), mixer_name="kda")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    preflight(make_cfg(*SHORT, "mixer=kda", "mixer.backend=triton"), mixer_name="kda")


def test_a_constructor_check_is_one_short_line_not_the_whole_mixer_config(make_cfg: MakeCfg) -> None:
    from harness.check import preflight

    with pytest.raises(ConfigError) as caught:
        preflight(make_cfg(*SHORT, "mixer=kda", "mixer.chunk_size=10"), mixer_name="kda")
    assert str(caught.value) == "mixer 'kda': chunk_size=10; it must be a power of two >= 16 (e.g. 64)"


def test_resume_with_a_changed_config_is_refused_or_recorded(
    make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _interrupted_run(make_cfg, tmp_path, monkeypatch)
    before = _files(tmp_path)
    # the checkpoint's optimizer and schedule hold lr 1e-3: resuming at 1e-2 would record a value not used
    with pytest.raises(ResumeRefused, match=r"checkpoint.pt \(step 12\) holds the checkpoint of a run of "
                                            r"another config \(optim.lr=0.001 -> 0.01\). .*Launch with its"):
        train(make_cfg(*SHORT, "optim.lr=1e-2"), tmp_path, mixer_name="attention")
    # refused before anything was written: every file as it was, train.log included
    assert _files(tmp_path) == before
    # where it runs may change; the summary records the change and the step it took effect at
    summary = train(make_cfg(*SHORT, "trainer.checkpoint_every=4"), tmp_path, mixer_name="attention")
    assert summary["status"] == "completed" and summary["steps"] == 20
    assert summary["config_changes"] == [{"step": 12, "key": "trainer.checkpoint_every", "old": 5, "new": 4}]


def test_a_corrupt_summary_is_rebuilt_from_the_checkpoint(make_cfg: MakeCfg, tmp_path: Path) -> None:
    first = train(make_cfg(*SHORT), tmp_path, mixer_name="attention")
    (tmp_path / "summary.json").write_text('{"status": "compl')
    again = train(make_cfg(*SHORT), tmp_path, mixer_name="attention")
    log = (tmp_path / "train.log").read_text()
    assert "summary.json: not valid JSON" in log and "resumes from checkpoint.pt" in log
    assert (tmp_path / "summary.json.corrupt").read_text() == '{"status": "compl'
    for key in ("status", "steps", "final_eval_acc", "best_eval_acc", "steps_to_threshold", "n_params"):
        assert again[key] == first[key]


def test_a_corrupt_checkpoint_is_named_with_the_fix(
    make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _interrupted_run(make_cfg, tmp_path, monkeypatch)
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[: checkpoint.stat().st_size // 2])
    with pytest.raises(FileUnreadable, match=r"checkpoint.pt: cannot be read .*delete it to train the run"):
        train(make_cfg(*SHORT), tmp_path, mixer_name="attention")
    summary = _summary(tmp_path)
    assert summary["status"] == "failed" and "checkpoint.pt" in summary["error"]


def test_gaps_and_cut_lines_in_metrics_are_reported(
    make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _interrupted_run(make_cfg, tmp_path, monkeypatch)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines]
    assert steps == [1, 2, 4, 6, 8, 10, 12]
    # steps 4 and 6 lost, and a line cut mid-write in the middle
    kept = [lines[0], lines[1], lines[4][:20], *lines[4:]]
    (tmp_path / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    summary = train(make_cfg(*SHORT), tmp_path, mixer_name="attention")
    log = (tmp_path / "train.log").read_text()
    assert "metrics.jsonl line 3 is not JSON" in log
    assert "has no record of step(s) 4, 6, before the checkpoint's step 12" in log
    assert summary["status"] == "completed"
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        1, 2, 8, 10, 12, 14, 16, 18, 20
    ]


def test_a_normal_resume_warns_about_nothing(
    make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metrics check knows the logging schedule: an ordinary resume has no gap to report."""
    schedule = ("trainer.log_every=3", "trainer.eval_every=7")
    _interrupted_run(make_cfg, tmp_path, monkeypatch, *schedule)
    train(make_cfg(*SHORT, *schedule), tmp_path, mixer_name="attention")
    log = (tmp_path / "train.log").read_text()
    assert "resumed from" in log and "train.rundir" not in log


def test_a_diverged_run_lists_only_the_files_it_wrote(make_cfg: MakeCfg, tmp_path: Path) -> None:
    cfg = make_cfg("optim.lr=1e30", "optim.warmup_steps=0", "trainer.max_steps=20")
    assert train(cfg, tmp_path, mixer_name="attention")["status"] == "diverged"
    assert not (tmp_path / "checkpoint.pt").exists()
    last = (tmp_path / "train.log").read_text().strip().splitlines()[-1]
    assert "outputs:" in last and "summary.json" in last and "checkpoint.pt" not in last




def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_sigterm_checkpoints_like_ctrl_c(tmp_path: Path) -> None:
    """SIGTERM (what SLURM, schedulers and `kill` send first) stops the run as Ctrl-C does: at a step
    boundary it checkpoints the last finished step (the only checkpoint here), summary `incomplete`, exit
    143. Inside a step's update, like Ctrl-C, it keeps the last checkpoint instead."""
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "train.py", *CLI_TINY, "trainer.max_steps=100000", "trainer.log_every=10",
         "trainer.checkpoint_every=100000", f"hydra.run.dir={run_dir}"],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )
    metrics = run_dir / "metrics.jsonl"
    try:
        started = lambda: metrics.exists() and metrics.stat().st_size > 400 or process.poll() is not None
        _wait_for(started, 120, "training to start")
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    summary = _summary(run_dir)
    assert summary["status"] == "incomplete" and summary["error"] == "Terminated: SIGTERM"
    log = (run_dir / "train.log").read_text()
    if "interrupted (Terminated) after step" in log:
        assert "checkpoint saved" in log
        checkpointed = torch.load(run_dir / "checkpoint.pt", weights_only=True)["progress"]["step"]
        assert checkpointed == summary["steps"] >= json.loads(metrics.read_text().splitlines()[-1])["step"]
    else:
        assert "interrupted (Terminated) inside step" in log and not (run_dir / "checkpoint.pt").exists()


@pytest.fixture
def python_ctrl_c() -> Iterator[None]:
    """Ctrl-C as a Python process has it (KeyboardInterrupt): a test process's own disposition of SIGINT
    may differ (a pytest-xdist worker's once ignored it, and the run trained on to its end)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.usefixtures("python_ctrl_c")
def test_an_interrupt_just_after_a_checkpoint_is_written_records_that_checkpoints_step(
        make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int) -> None:
    """The signal lands between checkpoint.pt's rename and the trainer noting its step (the window a
    campaign's `stop` hit once): the summary must name the step the file holds, which the resume takes."""
    import harness.trainer as trainer

    real, calls = trainer.save_checkpoint, []

    def save_then_signal(*args: object) -> None:
        real(*args)
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signum)

    monkeypatch.setattr(trainer, "save_checkpoint", save_then_signal)
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        cfg = make_cfg("trainer.max_steps=20", "trainer.checkpoint_every=4")
        train(cfg, tmp_path, mixer_name="attention")
    on_disk = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["progress"]["step"]
    summary = _summary(tmp_path)
    assert on_disk == 8 and summary["status"] == "incomplete"
    assert summary["checkpoint_step"] == on_disk, (summary["checkpoint_step"], on_disk)


@pytest.mark.usefixtures("python_ctrl_c")
def test_a_second_ctrl_c_during_the_interrupts_checkpoint_keeps_it_and_its_step(
        make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.trainer as trainer

    real, calls = trainer.save_checkpoint, []

    def save_with_a_second_ctrl_c(*args: object) -> None:
        calls.append(1)
        if len(calls) == 2:  # the interrupt's own checkpoint (the first is step 4's)
            signal.raise_signal(signal.SIGINT)
        real(*args)

    def interrupted_at_step_6(self: object, step: int, *args: object) -> None:
        if step == 6:
            raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "save_checkpoint", save_with_a_second_ctrl_c)
    monkeypatch.setattr(trainer.ProgressLog, "after_step", interrupted_at_step_6)
    cfg = make_cfg("trainer.max_steps=20", "trainer.checkpoint_every=4")
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path, mixer_name="attention")
    on_disk = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["progress"]["step"]
    assert on_disk == 6 and _summary(tmp_path)["checkpoint_step"] == 6


# ---- analysis: one bad file never stops a table or a figure ----


def _small_sweep(root: Path) -> list[Path]:
    dirs = []
    for mixer in ("kda", "gdn"):
        for seed in (0, 1):
            run_dir = root / f"mixer={mixer}/seed={seed}"
            write_run(run_dir, task="mqar", mixer=mixer, seq_len=64, lr=1e-3, seed=seed)
            dirs.append(run_dir)
    return dirs


def test_collect_reports_unreadable_files_and_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep = tmp_path / "sweep"
    runs = _small_sweep(sweep)
    (runs[0] / "summary.json").write_text('{"status": "compl')
    (runs[1] / ".hydra" / "config.yaml").write_text("task: [unclosed\n")
    assert collect.main([str(sweep), "--out", str(tmp_path / "table.csv")]) == 0
    table = collect.read_table(tmp_path / "table.csv").set_index("run")
    bad_summary, bad_config = table.loc["mixer=kda/seed=0"], table.loc["mixer=kda/seed=1"]
    assert bad_summary["status"] == "failed"
    assert "summary.json cannot be read (JSONDecodeError" in bad_summary["reason"]
    assert "re-launch the run" in bad_summary["reason"] and bad_summary["task"] == "mqar"
    assert bad_config["status"] == "failed" and "config.yaml cannot be read" in bad_config["reason"]
    assert (table.loc[["mixer=gdn/seed=0", "mixer=gdn/seed=1"], "status"] == "completed").all()
    printed = capsys.readouterr().out
    assert "runs left out (2" in printed
    assert str(runs[0] / "summary.json") in printed and str(runs[1] / ".hydra" / "config.yaml") in printed


def test_collect_takes_the_config_the_run_used(tmp_path: Path) -> None:
    """Every launch into a directory rewrites .hydra/config.yaml, also one that was refused or found the
    run finished: the row's config is what train.py recorded in summary.json."""
    run_dir = tmp_path / "sweep" / "run"
    write_run(run_dir, task="mqar", mixer="kda", seq_len=64, lr=1e-3, seed=0)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["config"] = {"optim.lr": 1e-3, "task.seq_len": 64, "logger.wandb.tags": ["task:mqar"]}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    hydra_config = run_dir / ".hydra" / "config.yaml"
    hydra_config.write_text(hydra_config.read_text().replace("lr: 0.001", "lr: 0.01"))
    row = collect.collect_dirs([tmp_path / "sweep"]).iloc[0]
    assert row["optim.lr"] == 1e-3 and row["lr"] == 1e-3 and row["logger.wandb.tags"] == '["task:mqar"]'


def test_plot_leaves_out_a_cut_metrics_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    sweep = tmp_path / "sweep"
    runs = _small_sweep(sweep)
    metrics = runs[2] / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([*lines[:3], lines[3][:15], *lines[4:]]) + "\n")
    assert plot.main([str(sweep), "--out", str(tmp_path / "figs")]) == 0
    summary = (tmp_path / "figs" / "summary.md").read_text()
    assert "## Runs left out" in summary and f"{metrics}: metrics.jsonl line 4 is not JSON" in summary
    assert "left out of accuracy vs steps: mixer=gdn/seed=0" in capsys.readouterr().err
    curves = pd.read_csv(tmp_path / "figs" / "acc_vs_steps_len64.csv")
    # gdn's curve is its other seed alone
    assert set(curves[curves["mixer"] == "gdn"]["n_seeds"]) == {1}
    assert set(curves[curves["mixer"] == "kda"]["n_seeds"]) == {2}


# ---- end to end: the fault-injection script's fast form ----


@pytest.mark.slow
def test_fault_injection_fast(tmp_path: Path) -> None:
    """A kill storm on a small sweep (a job SIGKILLed as by the OOM killer: the sweep records it failed,
    finishes the other job and exits 1; a job SIGTERMed; the sweep's own process SIGKILLed), a corrupt
    summary in the sweep, and relaunches of it (reordered, max_steps raised, precision changed on resume):
    nothing lost, nothing mislabelled. (Two writers and bad files in analysis: the tests above.)"""
    result = subprocess.run([sys.executable, str(ROOT / "tests" / "fault_injection.py"), "--fast", "--out",
                             str(tmp_path / "faults")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    report = result.stdout
    assert result.returncode == 0, report + result.stderr[-3000:]
    for case in ("kill storm", "corrupt summary in a sweep", "relaunch"):
        assert f"{case}: nothing lost, nothing mislabelled" in report, report
    assert "kill storm: nothing lost, nothing mislabelled (3 kills" in report


def test_a_sweep_job_whose_run_dir_is_in_use_changes_nothing(tmp_path: Path) -> None:
    """A re-launched sweep while a job of an old one still trains in a run directory (orphaned workers of
    a killed sweep): the local launcher takes the directory's lock before Hydra writes into it, so the job
    is refused without touching the directory, and the sweep names it and exits 1."""
    sweep_dir = tmp_path / "sweep"
    run_dir = sweep_dir / "mixer=attention" / "optim.lr=0.01" / "trainer.max_steps=5"
    holder = _hold_lock(run_dir)
    try:
        result = subprocess.run(
            [sys.executable, "train.py", "-m", "experiment=smoke", "mixer=attention", "optim.lr=0.01",
             "trainer.max_steps=5", "hydra/launcher=local", f"hydra.sweep.dir={sweep_dir}"],
            cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    finally:
        holder.kill()
        holder.wait()
    said = result.stdout + result.stderr
    # refused, not failed: the process in the directory records its run (the same sweep launched twice)
    assert result.returncode == 0, said[-3000:]
    assert re.search(rf"job 0 refused: RunDirBusy: run directory \S+ is in use by pid {holder.pid} ", said)
    assert re.search(rf"refused +1: {run_dir.relative_to(sweep_dir)} \(RunDirBusy: run directory", said), said
    assert "failed" not in said and "another process is training them" in said
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # no .hydra/, no train.log


# ---- relaunch: a run directory holds what its files say ----


def test_a_finished_run_is_compared_with_the_relaunch_not_skipped(make_cfg: MakeCfg, tmp_path: Path) -> None:
    """A finished run relaunched with another config is refused with the keys old -> new (precision
    included) and its files stay as they were; a change of where and how fast it runs leaves it alone;
    trainer.max_steps raised extends it from its checkpoint under the schedule of the new max_steps."""
    first = train(make_cfg(*SHORT), tmp_path, mixer_name="attention")
    before = _files(tmp_path)
    for override, listed in (("optim.lr=1e-2", "optim.lr=0.001 -> 0.01"),
                             ("trainer.precision=bf16", "trainer.precision='fp32' -> 'bf16'"),
                             ("trainer.max_steps=10", "trainer.max_steps=20 -> 10")):
        refused = rf"holds a completed run of another config \({re.escape(listed)}\)"
        with pytest.raises(ResumeRefused, match=refused):
            train(make_cfg(*SHORT, override), tmp_path, mixer_name="attention")
        assert _files(tmp_path) == before, override
    again = train(make_cfg(*SHORT, "trainer.eval_batch_size=7", "trainer.checkpoint_every=3"), tmp_path,
                        mixer_name="attention")
    assert again == first and _files(tmp_path) == before

    extended = train(make_cfg(*SHORT, "trainer.max_steps=30"), tmp_path, mixer_name="attention")
    assert extended["status"] == "completed" and extended["steps"] == 30
    assert {"step": 20, "key": "trainer.max_steps", "old": 20, "new": 30} in extended["config_changes"]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, *range(2, 31, 2)]
    assert extended["final_eval_acc"] == records[-1]["eval/acc"]
    # from step 20 on, the cosine of 30 steps (not the old schedule's floor of 0.1 x lr)
    lr_22 = next(r["lr"] for r in records if r["step"] == 22)
    assert lr_22 == pytest.approx(1e-3 * lr_factor(21, 5, 30, 0.1)) and lr_22 > 2e-4
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["progress"]["step"] == 30


def test_refused_and_bad_launches_from_the_command_line_write_nothing(tmp_path: Path) -> None:
    """A relaunch refused for another config leaves .hydra/ and every other file as they were; a config
    error (here a negative lr) prints one line and leaves no directory behind."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "train.py", *CLI_TINY, "trainer.max_steps=4", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    first = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-2000:]
    before = _files(run_dir)
    assert ".hydra/config.yaml" in before
    refused = subprocess.run([*command, "optim.lr=0.01"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [refused.stderr.strip()]  # one line
    assert "ResumeRefused: relaunch refused" in refused.stderr and "optim.lr=0.001 -> 0.01" in refused.stderr
    assert _files(run_dir) == before

    bad = subprocess.run([*command[:-1], f"hydra.run.dir={tmp_path / 'new'}", "optim.lr=-1"], cwd=ROOT,
                         env=env, capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.strip() == "config error: optim.lr=-1.0: must be > 0"
    assert not (tmp_path / "new").exists()


def test_sweep_subdirectories_are_named_by_what_the_run_computes() -> None:
    """One level per override, sorted (a reordered grid lands in the same directories), where-it-runs keys
    left out; `..` and `/` cannot climb out or make two values share a directory; a name past 255 bytes is
    shortened with a hash of the whole."""
    from harness.config import override_path

    assert override_path(["optim.lr=0.01", "mixer=kda"]) == override_path(["mixer=kda", "optim.lr=0.01"]) \
        == "mixer=kda/optim.lr=0.01"
    where = ["trainer.device=cuda:1", "logger.wandb.group=g", "trainer.compile=true",
             "trainer.eval_batch_size=8"]
    assert override_path(["mixer=kda", *where]) == "mixer=kda"
    assert override_path(["trainer.precision=bf16"]) == "trainer.precision=bf16"
    assert override_path(["experiment=x"], ["experiment"]) == "default"
    climbing = ["task.name=../../x", "logger.wandb.name=../x", "task.params.a=b/../c", "task.params.a=c"]
    paths = {override_path([line]) for line in climbing}
    assert len(paths) == len(climbing) and "default" in paths  # logger.* is left out
    for path in paths:
        assert all(part not in ("", ".", "..") for part in Path(path).parts) and len(Path(path).parts) == 1
    long = override_path([f"optim.lr=0.{'0' * 300}1"])
    assert len(long.encode()) <= 255 and long != override_path([f"optim.lr=0.{'0' * 301}1"])


def test_results_directories_keep_their_names() -> None:
    """Every committed run directory of results/ is where its own overrides name it, so relaunching the
    command that made it finds it again."""
    import yaml

    from harness.config import override_path

    root = ROOT / "results" / "kimi_fig4_h200_pilot"
    runs = sorted(p.parent.parent for p in root.rglob(".hydra/overrides.yaml"))
    assert len(runs) >= 10
    for run_dir in runs:
        overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
        settings = yaml.safe_load((run_dir / ".hydra" / "hydra.yaml").read_text())["hydra"]["job"]["config"]
        exclude = settings["override_dirname"]["exclude_keys"]
        assert override_path(overrides, exclude) == str(run_dir.relative_to(root)), run_dir


def test_a_full_disk_leaves_no_partial_checkpoint(
    make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint cut by a full disk is removed: its partial file would hold the space the `failed`
    summary needs."""
    real_save = torch.save

    def disk_full(state: dict, handle: object) -> None:
        real_save({"model": state["model"]}, handle)  # part of it written, then no space left
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        train(make_cfg(*SHORT), tmp_path, mixer_name="attention")
    assert not (tmp_path / "checkpoint.pt.tmp").exists() and not (tmp_path / "checkpoint.pt").exists()
    summary = _summary(tmp_path)
    assert summary["status"] == "failed" and "No space left" in summary["error"] and summary["steps"] == 5


def test_a_metrics_line_cut_before_its_newline_does_not_fuse_with_the_next(
    make_cfg: MakeCfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _interrupted_run(make_cfg, tmp_path, monkeypatch)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes().rstrip(b"\n"))
    assert train(make_cfg(*SHORT), tmp_path, mixer_name="attention")["status"] == "completed"
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == [1, *range(2, 21, 2)]


def _job(tmp_path: Path, status: object, value: object, name: str = "mixer=kda") -> object:
    from hydra.core.utils import JobReturn
    from omegaconf import OmegaConf

    hydra_cfg = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(tmp_path / name)},
                                            "job": {"override_dirname": name, "num": 0}}})
    return JobReturn(overrides=[], hydra_cfg=hydra_cfg, status=status, _return_value=value)


def test_the_sweep_report_tells_refused_from_failed(tmp_path: Path) -> None:
    """A job refused because another process trains its run (the same sweep launched twice) is `refused`
    and fails nothing; one refused because its directory holds another config's run makes the sweep exit
    1; a file name too long for the file system is reported, not a crash."""
    from hydra.core.utils import JobStatus

    from hydra_plugins.kda_harness.sweeper import report

    busy = _job(tmp_path, JobStatus.FAILED, RunDirBusy("run directory x is in use by pid 1"))
    lines, unfinished = report([busy], "sweep")
    assert unfinished == 0 and re.match(r"  refused +1: mixer=kda \(RunDirBusy: run directory x", lines[1])
    other = _job(tmp_path, JobStatus.FAILED, ResumeRefused("relaunch refused: ..."))
    assert report([busy, other], "sweep")[1] == 1
    too_long = _job(tmp_path, JobStatus.COMPLETED, 0.5, name="x" * 300)
    lines, unfinished = report([too_long], "sweep")
    assert unfinished == 1 and "failed" in lines[1] and "File name too long" in lines[1]


def test_a_local_job_that_exits_without_a_result_is_failed(tmp_path: Path) -> None:
    from hydra.core.utils import JobStatus
    from omegaconf import OmegaConf

    from hydra_plugins.kda_harness.launcher import LocalLauncher, WorkerDied

    sweep_config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path), "subdir": "a"},
                                               "job": {"num": 3, "override_dirname": "a"}, "runtime": {}}})
    result = LocalLauncher()._result(sweep_config, ["a=1"], 1, None)
    assert result.status == JobStatus.FAILED and isinstance(result._return_value, WorkerDied)
    assert "exited with status 1" in str(result._return_value)


def test_a_sweep_worker_stops_when_its_sweep_dies(tmp_path: Path) -> None:
    """joblib's workers (and the local launcher's) get SIGTERM when the sweep's process dies, so a
    SIGTERMed sweep leaves no worker training on or idling."""
    armed = tmp_path / "armed"
    code = f"""
import multiprocessing, os, sys, time
sys.path.insert(0, {str(ROOT)!r})
os.environ["KDA_HARNESS_SWEEP_PID"] = str(os.getpid())
def worker():
    from harness.signals import die_with_sweep
    die_with_sweep()
    open({str(armed)!r}, "w").close()
    time.sleep(120)
child = multiprocessing.get_context("fork").Process(target=worker)
child.start()
print(child.pid, flush=True)
while not os.path.exists({str(armed)!r}) and child.is_alive():
    time.sleep(0.1)
os._exit(0)  # the sweep dies as by SIGTERM: no cleanup of its workers
"""
    sweep = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert sweep.stdout is not None
    worker = int(sweep.stdout.readline())
    sweep.wait(120)

    def gone() -> bool:
        try:
            return Path(f"/proc/{worker}/stat").read_text().split()[2] == "Z"
        except OSError:
            return True

    try:
        assert armed.exists(), "the worker died before its sweep did"
        _wait_for(gone, 30, "the worker to stop")
    finally:
        if not gone():
            os.kill(worker, signal.SIGKILL)


def test_collect_treats_run_files_as_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's config.yaml is somebody else's file: its `${oc.env:...}` is kept as text, never resolved
    (it would copy an environment variable, a key or a token, into the table)."""
    monkeypatch.setenv("KDA_TEST_SECRET", "s3cret")
    run_dir = tmp_path / "sweep" / "run"
    write_run(run_dir, task="mqar", mixer="kda", seq_len=64, lr=1e-3, seed=0)
    config = run_dir / ".hydra" / "config.yaml"
    config.write_text(config.read_text() + "extra: ${oc.env:KDA_TEST_SECRET}\n")
    (run_dir / "summary.json").unlink()
    row = collect.collect_dirs([tmp_path / "sweep"]).iloc[0]
    assert row["extra"] == "${oc.env:KDA_TEST_SECRET}"


def test_a_summary_without_the_metric_is_no_seed(tmp_path: Path) -> None:
    """A completed run whose summary lacks best_eval_acc (written by hand, or by another version) does not
    count as a seed: the cell is its measured seed alone, not "n=2, ± 0"."""
    runs = _small_sweep(tmp_path / "sweep")
    summary = _summary(runs[0])
    del summary["best_eval_acc"]
    (runs[0] / "summary.json").write_text(json.dumps(summary))
    table = collect.collect_dirs([tmp_path / "sweep"])
    cells = plot.cells(plot.scored_runs(table))
    kda = cells[cells["series"] == "kda"].iloc[0]
    assert kda["n_seeds"] == 1 and kda["acc_mean"] == pytest.approx(100 * _summary(runs[1])["best_eval_acc"])
    assert math.isclose(kda["acc_std"], 0.0) and kda["acc_min"] == kda["acc_max"]


# ---- bad input that only the machine or the model's sizes show: one line, found before anything is written

@pytest.mark.parametrize(
    ("override", "named"),
    [
        # a width of 0 built blocks without an MLP, and the run trained on
        ("model.mlp_ratio=0.001",
         r"^model.mlp_ratio=0.001: the swiglu MLP's hidden width at model.d_model=32 comes to 0; raise "
         r"model.mlp_ratio"),
        # more threads than cores: a run many times slower
        (f"trainer.cpu_threads={len(os.sched_getaffinity(0)) + 1}",
         rf"^trainer.cpu_threads={len(os.sched_getaffinity(0)) + 1}: this machine gives the run "
         rf"{len(os.sched_getaffinity(0))} CPU core\(s\).*give trainer.cpu_threads<="),
        # a data set larger than the machine's memory: killed while generating it, after the directory
        ("task.num_train=10000000000",
         r"^task.num_train=10000000000, task.num_eval=.* GiB .*, more than this machine's "
         r".*lower task.num_train"),
        # the batch order's generator overflowed at the first step, after the directory was taken
        ("seed=100000000000000000", r"^seed=100000000000000000: must be < 2\*\*32 = 4294967296 .*give a "
                                    r"smaller seed"),
    ],
)
def test_a_config_this_machine_cannot_train_is_refused_before_anything_is_written(
    make_cfg: MakeCfg, tmp_path: Path, override: str, named: str
) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=named):
        train(make_cfg(*SHORT, override), run_dir, mixer_name="attention")
    assert not run_dir.exists()


def test_wandb_without_its_package_is_a_config_error(make_cfg: MakeCfg, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(ConfigError, match=r"^logger.wandb.mode=offline: the wandb package is not installed; "
                                          r"pip install wandb, or logger=default"):
        train(make_cfg(*SHORT, "logger.wandb.mode=offline"), tmp_path / "run", mixer_name="attention")
    assert not (tmp_path / "run").exists()


def test_wandb_online_without_a_login_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    """No WANDB_API_KEY, no ~/.netrc, no terminal to prompt on: wandb.init failed the run after its directory
    was taken, with wandb's traceback on the console."""
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k not in ("NETRC",
                                                                                           "HYDRA_FULL_ERROR")}
    env.update(HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "train.py", *CLI_TINY, "trainer.max_steps=2", "logger=wandb",
                             f"hydra.run.dir={run_dir}"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("config error: logger.wandb.mode=online: no W&B login (")
    assert "run `wandb login` or set WANDB_API_KEY" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not run_dir.exists()


def test_a_run_directory_that_cannot_be_made_is_one_line(make_cfg: MakeCfg, tmp_path: Path) -> None:
    """hydra.run.dir naming a file (or a path through one): Hydra's warning and a traceback before."""
    taken = tmp_path / "results.txt"
    taken.write_text("kept\n")
    from harness.rundir import RunDirError

    with pytest.raises(RunDirError, match=r"results.txt/run cannot be made: Not a directory"):
        train(make_cfg(*SHORT), taken / "run", mixer_name="attention")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    result = subprocess.run([sys.executable, "train.py", *CLI_TINY, "trainer.max_steps=2",
                             f"hydra.run.dir={taken}"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == (f"RunDirError: run directory {taken} cannot be made: File exists "
                                     f"({taken}); give hydra.run.dir (a sweep: hydra.sweep.dir) a directory "
                                     "you can write")
    assert taken.read_text() == "kept\n"


def test_an_experiment_without_m_is_refused_unless_the_command_picks_its_cell(tmp_path: Path) -> None:
    """`python train.py experiment=smoke` (the -m forgotten) trained one run at the yaml's mixer and lr, a
    point of the grid that nothing on the command line chose; naming every swept key picks a cell."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    command = [sys.executable, "train.py", "experiment=smoke", "trainer.max_steps=2", "trainer.cpu_threads=1"]
    forgot = subprocess.run([*command, f"hydra.run.dir={tmp_path / 'forgot'}"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert forgot.returncode == 1 and forgot.stdout == ""
    assert forgot.stderr.strip() == (
        "config error: experiment=smoke sweeps mixer, optim.lr (its hydra.sweeper.params), but this is a "
        "single run: without -m it trains one run at the yaml's values of them; add -m to run the grid, or "
        "give mixer=... optim.lr=... to train one cell")
    assert not (tmp_path / "forgot").exists()
    cell = subprocess.run([*command, "mixer=gdn", "optim.lr=3e-3", f"hydra.run.dir={tmp_path / 'cell'}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert cell.returncode == 0, cell.stderr[-2000:]
    assert _summary(tmp_path / "cell")["status"] == "completed"


def test_a_jobs_checks_do_not_carry_the_previous_jobs_name(make_cfg: MakeCfg, tmp_path: Path) -> None:
    """A one-process sweep runs its jobs in turn: the checks of the next job logged under the name of the
    one before (a warning of job 2 in job 1's name, first in job 2's train.log)."""
    from harness.log import _RunNamePrefix, log, name_log_lines

    name_log_lines("mqar/kda/previous")
    try:
        with pytest.raises(ConfigError):
            train(make_cfg(*SHORT, "optim.lr=-1"), tmp_path / "run")
        assert not [f for f in log.filters if isinstance(f, _RunNamePrefix)]
    finally:
        name_log_lines(None)
