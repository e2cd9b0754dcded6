"""benchmarks.step and benchmarks.memory on the CPU at a tiny size: rows, the profile split and the report
are real."""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from benchmarks import memory, step


@pytest.mark.slow
def test_bench_train_smoke(tmp_path: Path) -> None:
    code = step.main(["--out", str(tmp_path), "--device", "cpu", "--batch", "2", "--lengths", "32",
                             "--d-model", "32", "--mixers", "kda", "attention", "--impls", "ours", "--lean",
                             "--warmup", "1", "--steps", "1", "--tasks", "palindrome"])
    assert code == 0
    rows = list(csv.DictReader(open(tmp_path / "bench_train.csv")))
    assert [(r["mixer"], r["impl"]) for r in rows] == [("kda", "ours"), ("kda", "ours+lean"),
                                                       ("attention", "ours"), ("attention", "ours+lean")]
    # the lean KDA layer keeps less for its backward than the plain one (attention has no lean path)
    assert float(rows[1]["saved mixer GiB"]) < float(rows[0]["saved mixer GiB"])
    assert float(rows[3]["saved mixer GiB"]) == float(rows[2]["saved mixer GiB"])
    for row in rows:
        assert float(row["step_ms"]) > 0 and float(row["first_step_s"]) > 0
        # the loss and the mixer op are found by their profiler ranges, not left in "rest"
        assert float(row["lm head+loss ms"]) > 0
    kda = rows[0]
    assert float(kda["mixer op ms"]) > 0 and float(kda["short conv ms"]) > 0
    # saved for the backward, by module: each SwiGLU keeps at least its up projection's output, fp32 here
    # ([B*T, 2 * hidden], hidden = 4 * d_model), and 2 layers of it
    up_output = 2 * 32 * (2 * 4 * 32) * 4 / 2**30
    for row in rows:
        assert float(row["saved mlp GiB"]) >= 2 * up_output
        assert float(row["saved mixer GiB"]) > 0 and float(row["saved norms GiB"]) > 0
    # each category's kernel listing sums to its column of the row (rounding apart) and names real ops
    listing = list(csv.DictReader(open(tmp_path / "bench_train_kernels.csv")))
    for row in rows:
        mine = [r for r in listing if (r["mixer"], r["impl"]) == (row["mixer"], row["impl"])]
        assert mine and all(r["op"] and int(r["launches"]) > 0 for r in mine)
        for category in step.CATEGORIES:
            listed = sum(float(r["ms"]) for r in mine if r["category"] == category)
            assert listed == pytest.approx(float(row[f"{category} ms"]), abs=0.01), category
    # KDA's short convolutions are found (the custom op's own kernels under interpretation are CPU ops here)
    assert any(r["category"] == "short conv" for r in listing if r["mixer"] == "kda")
    report = (tmp_path / "bench_train.md").read_text()
    assert "| palindrome | kda | 32 | ours (default) |" in report and "commit" in report


def _fla_layers_installed() -> bool:
    try:
        import fla.layers  # noqa: F401
    except ImportError:
        return False
    return True


def test_fla_core_alone_is_refused_for_fla_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """fla-core (the dev extra: FLA's reference loops) has `fla` but not `fla.layers`: no FLA row can be
    built, so --impls fla is refused up front, not recorded as one error row per mixer."""
    pytest.importorskip("fla")
    if _fla_layers_installed():
        pytest.skip("flash-linear-attention is installed: the FLA rows are real")
    with pytest.raises(SystemExit):
        step.main(["--out", str(tmp_path / "out"), "--device", "cpu", "--impls", "fla"])
    assert "--impls fla: flash-linear-attention is not installed" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_fla_layer_that_will_not_build_is_recorded_not_raised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = step.importlib.util.find_spec
    monkeypatch.setattr(step.importlib.util, "find_spec",
                        lambda name, *args: object() if name.startswith("fla") else find_spec(name, *args))
    monkeypatch.setitem(step.FLA_LAYERS, "gdn", "no_such_module.NoSuchLayer")
    code = step.main(["--out", str(tmp_path), "--device", "cpu", "--batch", "1", "--lengths", "16",
                      "--d-model", "32", "--mixers", "gdn", "--impls", "fla", "--warmup", "0",
                      "--steps", "1", "--tasks", "palindrome", "--no-profile"])
    assert code == 0
    (row,) = list(csv.DictReader(open(tmp_path / "bench_train.csv")))
    # here fla.layers itself (where flash-linear-attention is not installed) or the layer's module
    needs = "RuntimeError: FLA layers need flash-linear-attention 0.6 (No module named"
    assert row["error"].startswith(needs)


def _without_fla(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = step.importlib.util.find_spec
    monkeypatch.setattr(step.importlib.util, "find_spec",
                        lambda name, *args: None if name == "fla" else find_spec(name, *args))


def test_without_fla_the_default_times_ours_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    _without_fla(monkeypatch)
    assert step.main(["--out", str(tmp_path), "--device", "cpu", "--batch", "1", "--lengths", "16",
                      "--d-model", "32", "--mixers", "gdn", "--variants", "eager", "--warmup", "0",
                      "--steps", "1", "--tasks", "palindrome", "--no-profile"]) == 0
    assert "no FLA rows: flash-linear-attention is not installed" in capsys.readouterr().out
    assert [r["impl"] for r in csv.DictReader(open(tmp_path / "bench_train.csv"))] == ["ours"]


def test_impls_fla_without_fla_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _without_fla(monkeypatch)
    with pytest.raises(SystemExit):
        step.main(["--out", str(tmp_path / "out"), "--device", "cpu", "--impls", "ours", "fla"])
    assert "--impls fla: flash-linear-attention is not installed" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_error_row_names_the_innermost_cause_in_full() -> None:
    # wrapped as Hydra's instantiate wraps a layer's error: the row names the layer's own error
    try:
        try:
            raise RuntimeError("FLA layers need flash-linear-attention 0.6 (No module named 'fla')")
        except RuntimeError as inner:
            raise ValueError("Error in call to target 'benchmarks.step.FlaMixer':\n" + "x" * 300) from inner
    except ValueError as error:
        line = step._error_line(error)
    assert line == "RuntimeError: FLA layers need flash-linear-attention 0.6 (No module named 'fla')"
    long = step._error_line(ValueError("y" * 500))
    assert long.endswith("…") and len(long) < 230


def test_saved_tensors_lists_less_for_the_lean_layers(capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--device", "cpu", "--batch", "3", "--seq-len", "32", "--d-model", "64", "--mixers", "kda",
              "--backend", "torch"]
    lean = memory.main(common)["kda"]
    plain = memory.main([*common, "--plain"])["kda"]
    assert 0 < lean["mixer"] < plain["mixer"]
    assert lean["mlp"] == plain["mlp"] > 0
    printed = capsys.readouterr().out
    assert "## kda: saved GiB" in printed and "## kda (plain): saved GiB" in printed


def test_saved_storages_counts_what_the_backward_holds_under_the_module_that_saved_it() -> None:
    class Temporary(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            torch.sigmoid(x * 2.0).sum()  # a graph dropped at once: its saved sigmoid output is freed
            return x

    class Keeps(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(x * 3.0)  # saves its output for the backward

    model = nn.Sequential(Temporary(), Keeps())
    x = torch.randn(64, 64, requires_grad=True)
    with memory.saved_storages(model) as live:
        model(x).sum().backward()
        # freed by the backward, but counted as they were when it started
        assert [(r["module"], r["shape"], r["bytes"]) for r in live] == [("1", (64, 64), 64 * 64 * 4)]
    with memory.saved_storages(model) as live:
        loss = model(x).sum()  # no backward: counted at the context's exit, while the graph is held
    assert [r["module"] for r in live] == ["1"] and loss.grad_fn is not None


def test_a_row_labelled_compiled_ran_compiled_or_is_an_error(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    common = ["--device", "cpu", "--batch", "2", "--lengths", "16", "--d-model", "32", "--mixers",
              "attention", "--impls", "ours", "--warmup", "1", "--steps", "1", "--no-profile",
              "--backend", "eager", "--variants", "default", "compile"]
    # two models compiled in one process: each row's compile starts clean, so the second is compiled too
    assert step.main(["--out", str(tmp_path / "ok"), *common, "--tasks", "palindrome", "mqar"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "ok" / "bench_train.csv")))
    assert [(r["task"], r["impl"], r["default"]) for r in rows] == [
        ("palindrome", "ours", "True"), ("palindrome", "ours+compile", "False"),
        ("mqar", "ours", "True"), ("mqar", "ours+compile", "False")]
    assert all(int(r["graphs"]) >= 1 for r in rows if r["impl"] == "ours+compile")
    assert "| ours (default) |" in (tmp_path / "ok" / "bench_train.md").read_text()
    # a compiler that silently runs eager gives an error row, not eager figures under a compiled label
    monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)
    assert step.main(["--out", str(tmp_path / "eager"), *common, "--tasks", "palindrome"]) == 0
    eager, compiled = list(csv.DictReader(open(tmp_path / "eager" / "bench_train.csv")))
    assert float(eager["step_ms"]) > 0 and not compiled["step_ms"]
    assert "RanEager" in compiled["error"] and "eager under a compiled label" in compiled["error"]


def test_default_is_the_form_train_py_takes_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """(compiled, lean, CUDA graphs, is_default): `default` follows the configs' own defaults as the
    trainer resolves them, CUDA graphs included, so that a default switched in a yaml moves the rows."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert step.variants(["default", "eager"], cpu) == [(False, False, False, True)]
    assert step.variants(["default", "eager"], cuda) == [(True, False, True, True),
                                                         (False, False, False, False)]
    assert step.variants(["eager", "lean+compile"], cuda) == [(False, False, False, False),
                                                              (True, True, False, False)]
    assert step.variants(["default", "compile"], cuda) == [(True, False, True, True),
                                                           (True, False, False, False)]
    load = step.OmegaConf.load

    def graphs_off(path: Path) -> Any:
        conf = load(path)
        if Path(path).name == "default.yaml" and "cuda_graphs" in conf:
            conf.cuda_graphs = False
        return conf

    monkeypatch.setattr(step.OmegaConf, "load", graphs_off)
    assert step.variants(["default", "compile"], cuda) == [(True, False, False, True)]
    assert step.variants(["default"], cpu) == [(False, False, False, True)]



def test_a_kept_default_row_of_an_older_default_names_its_commit(tmp_path: Path) -> None:
    """--resume keeps rows measured when the default was another form: the table marks only the form
    train.py takes now as the default, the older one with the commit it was the default at."""
    compiled, lean, graphs = step.default_form(torch.device("cuda", 0))
    now = step._label("ours", lean, compiled, graphs=graphs)
    older = step._label("ours", False, True)
    assert now != older
    common = {"default": True, "task": "mqar", "mixer": "kda", "layers": 2, "T": 1024, "B": 256,
              "step_ms": 40.0, "tokens_per_s_M": 6.5, "first_step_s": 20.0, "device": "NVIDIA H100 80GB HBM3"}
    # `measured` is "DATE COMMIT"
    rows = [{**common, "impl": older, "measured": "then aaa1111"},
            {**common, "impl": now, "measured": "now bbb2222"},
            {**common, "impl": "ours", "device": "AMD EPYC (2 cores)", "measured": "now bbb2222"}]
    step.write(rows, tmp_path, "header", echo=False)
    table = (tmp_path / "bench_train.md").read_text()
    assert f"| {older} (default at aaa1111) |" in table and f"| {now} (default) |" in table
    assert "| ours (default) |" in table

@pytest.mark.slow
def test_bench_train_times_a_hybrid_pattern(tmp_path: Path) -> None:
    code = step.main(["--out", str(tmp_path), "--device", "cpu", "--batch", "2", "--lengths", "32",
                             "--d-model", "32", "--mixers", "--patterns", "kda,attention", "--impls", "ours",
                             "--lean", "--warmup", "1", "--steps", "1", "--tasks", "mqar", "--no-profile"])
    assert code == 0
    rows = list(csv.DictReader(open(tmp_path / "bench_train.csv")))
    assert [(r["mixer"], r["layers"], r["impl"]) for r in rows] == [("kda:attention 1:1", "2", "ours"),
                                                                    ("kda:attention 1:1", "2", "ours+lean")]
    assert all(float(r["step_ms"]) > 0 for r in rows)
    # lean reaches the pattern's KDA layer: its mixers keep less for the backward
    assert float(rows[1]["saved mixer GiB"]) < float(rows[0]["saved mixer GiB"])


def test_bench_train_rejects_a_bad_pattern(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        step.main(["--out", str(tmp_path), "--mixers", "--patterns", "kda*3,atention"])
    assert "--patterns kda*3,atention: model.pattern=[kda,kda,kda,atention]: 'atention' is not a mixer" in (
        capsys.readouterr().err)


def test_resume_keeps_the_measured_rows_and_measures_the_missing(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    common = ["--out", str(tmp_path), "--device", "cpu", "--batch", "2", "--d-model", "32", "--mixers",
              "attention", "--impls", "ours", "--warmup", "0", "--steps", "1", "--tasks", "palindrome",
              "--no-profile"]
    assert step.main([*common, "--lengths", "16"]) == 0
    (first,) = list(csv.DictReader(open(tmp_path / "bench_train.csv")))
    measured = []
    original = step.measure

    def counting(impl, task, mixer, T, *args, **kwargs):
        measured.append(T)
        return original(impl, task, mixer, T, *args, **kwargs)

    monkeypatch.setattr(step, "measure", counting)
    assert step.main([*common, "--lengths", "16", "32", "--resume"]) == 0
    assert measured == [32]  # the row at 16 is kept, not measured again
    rows = list(csv.DictReader(open(tmp_path / "bench_train.csv")))
    assert [int(r["T"]) for r in rows] == [16, 32]
    assert rows[0]["step_ms"] == first["step_ms"] and rows[0]["measured"] == first["measured"] != ""
    assert "rows kept from earlier runs (--resume): 1," in (tmp_path / "bench_train.md").read_text()
    # without --resume the table starts afresh
    assert step.main([*common, "--lengths", "32"]) == 0
    assert [int(r["T"]) for r in csv.DictReader(open(tmp_path / "bench_train.csv"))] == [32]


def test_resume_refuses_a_table_of_another_device_before_writing(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--out", str(tmp_path), "--device", "cpu", "--batch", "2", "--d-model", "32", "--mixers",
              "attention", "--impls", "ours", "--warmup", "0", "--steps", "1", "--tasks", "palindrome",
              "--no-profile", "--lengths", "16"]
    assert step.main(common) == 0
    (row,) = list(csv.DictReader(open(tmp_path / "bench_train.csv")))
    assert row["device"] == step.device_name("cpu")
    # a row of another device, and rows written before the column, which take the header's device
    for text, name in [(open(tmp_path / "bench_train.csv").read().replace(row["device"], "NVIDIA H200"),
                        "NVIDIA H200"), (None, "NVIDIA H100 80GB HBM3")]:
        if text is None:
            rows = list(csv.DictReader(open(tmp_path / "bench_train.csv")))
            for r in rows:
                del r["device"]
            step.write_csv(tmp_path / "bench_train.csv", rows, [k for k in rows[0]])
            md = (tmp_path / "bench_train.md").read_text()
            (tmp_path / "bench_train.md").write_text(md.replace(row["device"], name, 1))
        else:
            (tmp_path / "bench_train.csv").write_text(text)
        before = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
        with pytest.raises(SystemExit) as exit_:
            step.main([*common, "--lengths", "32", "--resume"])
        assert exit_.value.code == 2
        assert f"holds rows measured on {name}, and this run is on {step.device_name('cpu')}" in (
            capsys.readouterr().err)
        assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == before


def _node_with_stack(path: str) -> torch.fx.Node:
    graph = torch.fx.Graph()
    node = graph.placeholder("x")
    node.meta["nn_module_stack"] = {"a": ("L['self']", object), "b": (path, object)}
    return node


def test_module_path_reads_the_trace_as_named_modules_writes_it() -> None:
    for path in ("L['self'].blocks[0].mixer.q_proj", "L['self'].blocks.0.mixer.q_proj",
                 "self.blocks.0.mixer.q_proj", "L['fn'].blocks['0'].mixer.q_proj"):
        assert memory._module_path(_node_with_stack(path)) == "blocks.0.mixer.q_proj", path
    assert memory._module_path(_node_with_stack("L['self'].norm")) == "norm"
    assert memory._module_path(torch.fx.Graph().placeholder("y")) == ""


@pytest.mark.slow  # inductor compiles the step once on the CPU (~35 s on two cores)
def test_the_compiled_graph_itemised_is_what_its_backward_holds() -> None:
    """compiled_rows traces and partitions the body without running it; a real compiled step's backward
    node must then hold exactly those bytes, and the graph keeps less under a memory budget."""
    from harness import step as train

    batch, _, vocab = step.task_batch("mqar", 2, 64, torch.device("cpu"))
    torch.manual_seed(0)
    model = step.build("ours", "kda", vocab, 32, backend="triton")
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    rows = memory.compiled_rows(model.features, (batch.inputs,), autocast)
    parts = {p: sum(r["bytes"] for r in rows if r["part"] == p) for p in memory.SAVED}
    assert parts["mixer"] > 0 and parts["mlp"] > 0
    # the chunk op's saved buffers (its custom op's outputs) are the mixer's, the SwiGLU's up projection
    # ([B*T, its output width]) the MLP's
    assert any(r["module"] == "blocks.0.mixer" and r["op"] == "chunk_fwd: Saved.h" for r in rows)
    up = model.blocks[1].mlp.up.weight.shape[0]
    assert any(r["module"] == "blocks.1.mlp.up" and r["shape"] == (2 * 64, up) for r in rows)
    with torch._functorch.config.patch(activation_memory_budget=0.5):
        less = memory.compiled_rows(model.features, (batch.inputs,), autocast)
    assert 0 < sum(r["bytes"] for r in less) < sum(parts.values())

    features = torch.compile(model.features)
    try:
        outside = memory.outside_graph(model, features, batch, autocast)
        with memory.saved_storages(model) as live, autocast():
            loss, _ = train.batch_loss(model, features, batch)
            nodes = memory.node_names(loss)
    finally:
        torch._dynamo.reset()
    inputs = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), batch.inputs]}
    held = [r for r in live if r["ptr"] not in inputs
            and any(name.startswith("CompiledFunction") for name in nodes.get(r["ptr"], ()))]
    assert held and sum(r["bytes"] for r in held) == sum(parts.values())
    # outside the graph: the head + loss's gradients, computed in its forward (the weight's: [vocab, D]),
    # the storages of the same step that the compiled node does not hold (two forwards: compared by shape)
    assert any(r["shape"] == (vocab, 32) for r in outside)
    rest = [r for r in live
            if not any(name.startswith("CompiledFunction") for name in nodes.get(r["ptr"], ()))]
    assert sorted((r["shape"], r["dtype"]) for r in outside) == sorted((r["shape"], r["dtype"]) for r in rest)


def test_memory_budgets_add_labelled_compiled_rows(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--device", "cpu", "--batch", "2", "--lengths", "16", "--d-model", "32", "--mixers",
              "attention", "--impls", "ours", "--warmup", "1", "--steps", "1", "--no-profile",
              "--backend", "eager", "--tasks", "palindrome", "--variants", "eager", "compile"]
    assert step.main(["--out", str(tmp_path), *common, "--memory-budgets", "0.5"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "bench_train.csv")))
    assert [r["impl"] for r in rows] == ["ours", "ours+compile", "ours+compile+mem0.5"]
    assert all(float(r["step_ms"]) > 0 for r in rows)
    with pytest.raises(SystemExit):
        step.main(["--out", str(tmp_path / "bad"), *common, "--memory-budgets", "1.5"])
    assert "--memory-budgets [1.5]: each must be in (0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow  # inductor compiles the attention step on the CPU (~20 s, then from its cache)
def test_a_compiled_row_splits_what_its_graph_keeps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--device", "cpu", "--batch", "2", "--lengths", "16", "--d-model", "32", "--mixers", "attention",
            "--impls", "ours", "--variants", "compile", "--warmup", "1", "--steps", "1", "--no-profile",
            "--tasks", "palindrome"]
    assert step.main(["--out", str(tmp_path), *args]) == 0
    (row,) = list(csv.DictReader(open(tmp_path / "bench_train.csv")))
    assert row["impl"] == "ours+compile" and int(row["graphs"]) >= 1
    # each SwiGLU keeps at least its up projection's output (fp32 on the CPU: [B*T, its width]), 2 layers;
    # the head + loss, outside the graph, keep its gradients ([vocab, D] among them) in "rest"
    model = step.build("ours", "attention", 64, 32)
    up_output = 2 * 16 * model.blocks[0].mlp.up.weight.shape[0] * 4 / 2**30
    assert float(row["saved mlp GiB"]) >= 2 * up_output
    assert float(row["saved mixer GiB"]) > 0 and float(row["saved rest GiB"]) > 0
    # an itemisation that fails (another torch's inductor) costs the split, never the row's timing

    def fails(*_: object) -> None:
        raise RuntimeError("traced otherwise")

    monkeypatch.setattr(step, "compiled_rows", fails)
    assert step.main(["--out", str(tmp_path / "failed"), *args]) == 0
    (row,) = list(csv.DictReader(open(tmp_path / "failed" / "bench_train.csv")))
    assert float(row["step_ms"]) > 0 and not row.get("error")
    assert row["saved error"] == "RuntimeError: traced otherwise" and "saved mixer GiB" not in row


def test_the_kernel_listing_survives_a_resume_and_reads_the_older_rest_file(tmp_path: Path) -> None:
    row = {"impl": "ours+compile", "default": True, "task": "mqar", "mixer": "kda", "layers": 2, "T": 1024,
           "B": 256, "step_ms": 43.5, "tokens_per_s_M": 6.03, "peak_gib": 12.8, "first_step_s": 18.1,
           "measured": "commit abc1234"}
    kernels = [("short conv", 0.9, 6, "kda_harness::short_conv_bwd", "_short_conv_bwd_kernel"),
               ("rest", 1.4, 2, "CompiledFunction", "triton_poi_fused_mul_silu_3")]
    step.write([{**row, "_kernels": kernels}], tmp_path, "header", echo=False)
    (back,) = step.load(tmp_path)
    assert back["_kernels"] == kernels and back["default"] is True
    # a directory from before: its bench_train_rest.csv lists the "rest" alone, keyed without the form
    (tmp_path / "bench_train_kernels.csv").unlink()
    with open(tmp_path / "bench_train_rest.csv", "w", newline="") as f:
        f.write("impl,task,mixer,T,ms,launches,op,kernel\n"
                "ours+compile,mqar,kda,1024,1.4000,2,CompiledFunction,triton_poi_fused_mul_silu_3\n")
    (back,) = step.load(tmp_path)
    assert back["_kernels"] == [kernels[1]]


def test_a_fused_cast_is_not_a_convolution() -> None:
    assert step._category(["CompiledFunction"], "triton_poi_fused_convert_element_type_mul_7") == "rest"
    assert step._category(["CompiledFunction"], "causal_conv1d_fwd_kernel") == "short conv"
    assert step._category(["kda_harness::short_conv_bwd"], "reduce_kernel<128, 4>") == "short conv"


def test_a_conv_backward_other_than_the_default_labels_its_rows(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--conv-bwd names the short conv's backward in every row of ours it times (never `default`), FLA's
    rows untouched; on the CPU, where the models take the torch reference conv, it is refused before
    anything is written."""
    assert step._label("ours", False, True, None, "two_pass") == "ours+compile+conv-two_pass"
    assert step._label("ours", False, True) == "ours+compile"
    assert step._label("fla", False, False, None, "two_pass") == "fla"
    with pytest.raises(SystemExit):
        step.main(["--out", str(tmp_path / "out"), "--device", "cpu", "--conv-bwd", "two_pass"])
    err = capsys.readouterr().err
    assert "--conv-bwd two_pass: the models take the Triton short conv on CUDA only" in err
    assert not (tmp_path / "out").exists()
    # the shifted taps (kernels/conv.py CUDA_IMPL) are labelled the same way, and refused on the CPU too
    assert step._label("ours", False, True, None, "shifted") == "ours+compile+conv-shifted"
    with pytest.raises(SystemExit):
        step.main(["--out", str(tmp_path / "out"), "--device", "cpu", "--conv-impl", "shifted"])
    assert "--conv-impl shifted: the models take it on CUDA only" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_host_split_charges_each_op_its_own_time_by_what_it_ran_inside() -> None:
    """host_split: an op's own CPU time (not its children's) to the category of the ops and ranges around
    it: a launch inside the mixer op's range is the mixer op's, a matmul's is the matmuls', the loss's
    range takes what runs in it, and the rest is rest; nothing counted twice."""
    from types import SimpleNamespace

    def event(name: str, own_us: float, parent: Any = None) -> SimpleNamespace:
        return SimpleNamespace(name=name, self_cpu_time_total=own_us, cpu_parent=parent)

    mixer = event("bench::mixer_op", 300.0)
    loss = event("bench::loss", 100.0)
    matmul = event("aten::mm", 50.0)
    events = [mixer, event("cudaLaunchKernel", 20.0, mixer), loss, event("aten::mm", 40.0, loss), matmul,
              event("cudaLaunchKernel", 5.0, matmul), event("aten::add_", 7.0), event("Optimizer.step", 3.0)]
    split = step.host_split(events)
    assert split == pytest.approx({"mixer op": 0.32, "lm head+loss": 0.14, "short conv": 0.0,
                                   "matmuls": 0.055, "rest": 0.01})


def test_recompute_labels_our_plain_compiled_rows_and_none_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """--recompute changes the plain model's compiled graph only: those rows say what it recomputes, eager,
    lean and FLA's rows are what they were, no compiled row it measured is `default`, and only the plain
    compiled model is built recomputing."""
    both = ("qk_norm", "swiglu")
    assert step._label("ours", False, True, recompute=both) == "ours+compile+recompute-qk_norm,swiglu"
    assert step._label("ours", True, True, recompute=both) == "ours+lean+compile"
    assert step._label("ours", False, False, recompute=both) == "ours"
    assert step._label("fla", False, True, recompute=both) == "fla+compile"
    built, rows = [], []

    def build(impl, mixer, vocab, d_model, lean=False, pattern=None, backend=None,  # noqa: ANN001, ANN202
              recompute=()):
        built.append((lean, recompute))
        raise RuntimeError("built; nothing to time here")

    monkeypatch.setattr(step, "build", build)
    monkeypatch.setattr(step, "write", lambda measured, *a, **k: rows.extend(measured))
    step.main(["--out", "unused", "--device", "cpu", "--mixers", "kda", "--lengths", "32", "--tasks", "mqar",
               "--impls", "ours", "--variants", "default", "compile", "lean+compile",
               "--recompute", "swiglu"])
    assert built == [(False, ()), (False, ("swiglu",)), (True, ())]
    labels = list(dict.fromkeys((r["impl"], r["default"]) for r in rows))
    assert labels == [("ours", True), ("ours+compile+recompute-swiglu", False), ("ours+lean+compile", False)]


def test_cuda_graph_rows_are_labelled_and_refused_off_cuda(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--cuda-graphs labels our compiled rows +cudagraphs (eager and FLA's rows as they were); on the CPU,
    which has no CUDA graphs, it is refused before anything is written; a row whose graphs inductor
    skipped is an error, not a row under that label: the count it reads is the one inductor bumps when it
    skips them (here for a CPU tensor)."""
    assert step._label("ours", False, True, graphs=True) == "ours+compile+cudagraphs"
    assert step._label("ours", True, True, 0.8, "looped", True) == \
        "ours+lean+compile+cudagraphs+mem0.8+conv-looped"
    assert step._label("ours", False, False, graphs=True) == "ours"
    assert step._label("fla", False, False, graphs=True) == "fla"
    with pytest.raises(SystemExit):
        step.main(["--out", str(tmp_path / "out"), "--device", "cpu", "--cuda-graphs"])
    err = capsys.readouterr().err
    assert "--cuda-graphs: CUDA graphs need a CUDA device" in err
    assert not (tmp_path / "out").exists()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    assert step._graph_skips() == 0
    body = torch.compile(lambda x: x * 2 + 1, mode="reduce-overhead")
    for _ in range(3):
        body(torch.ones(8))
    assert step._graph_skips() >= 1
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


def test_a_graph_compiled_while_timed_is_timed_again_or_an_error() -> None:
    """A guard that fails inside the timed steps would count a compilation as step time: the steps are
    timed once more on the cached graphs; a guard that fails at every step is an error, not a row."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    scale = {"value": 1}
    compiled = torch.compile(lambda x, s: x * s, backend="eager", dynamic=False)
    x = torch.ones(4)
    calls = []

    def run() -> None:
        calls.append(None)
        compiled(x, scale["value"])  # an int argument: dynamo specialises on its value

    cpu = torch.device("cpu")
    run()  # the warm-up's compile
    assert step._graph_count() == 1

    # a timed step sees a new value: one graph made there, and the second round times cached graphs
    def once() -> None:
        scale["value"] = 2 if len(calls) >= 1 else 1
        run()
    calls.clear()
    ms, peak, made = step.timed_compiled(once, 3, cpu, compiled=True)
    assert (made, peak, len(calls)) == (1, None, 6) and ms > 0
    assert step.timed_compiled(once, 3, cpu, compiled=True)[2] == 0  # both values' graphs cached now

    # a new value at every step: each round compiles
    def always() -> None:
        scale["value"] += 1
        run()
    with pytest.raises(step.RecompiledWhileTimed, match="a guard fails at every step"):
        step.timed_compiled(always, 2, cpu, compiled=True)
    torch._dynamo.reset()


def test_a_row_of_another_gpu_is_not_compared_with_the_h200_anchors(tmp_path: Path) -> None:
    row = {"impl": "ours+compile", "default": True, "task": "mqar", "mixer": "kda", "layers": 2, "T": 1024,
           "B": 256, "step_ms": 48.5, "tokens_per_s_M": 5.4, "peak_gib": 12.8, "first_step_s": 25.5,
           "measured": "commit abc1234"}
    assert ("ours+compile", "mqar", "kda", 1024) in step._last() and step.ANCHOR_GPU in "NVIDIA H200"
    for device, compared in (("NVIDIA H200", True), (None, True), ("NVIDIA H100 80GB HBM3", False)):
        step.write([{**row, **({"device": device} if device else {})}], tmp_path, "header", echo=False)
        text = (tmp_path / "bench_train.md").read_text()
        (line,) = [ln for ln in text.splitlines() if ln.startswith("| mqar | kda |")]
        assert ("x of " in line) is compared, (device, line)
        assert ("a359d38" in text) is compared, device


def _fla_plan(impls: list[str]) -> list[step.Planned]:
    args = argparse.Namespace(tasks=["mqar", "palindrome"], lengths=[256, 512, 1024], impls=impls,
                              memory_budgets=[], conv_label="", recompute=[], batch=4)
    return step.planned(args, [("kda", None), ("attention", None)], [(True, False, False, True)])


def test_each_fla_model_is_warmed_once_at_its_shortest_missing_length() -> None:
    """FLA's autotuners key on heads and widths, not the length: one warming process per FLA model (task,
    mixer) with rows still to measure, at the shortest of them; none for ours or a mixer FLA lacks."""
    plan = _fla_plan(["ours", "fla"])
    assert len(plan) == 2 * 3 * (2 + 1)  # attention has no FLA row
    done = {p.key for p in plan if p.impl == "fla" and p.task == "mqar" and p.T == 256}
    todo = [p for p in plan if p.key not in done]
    assert step.fla_layers_to_warm(todo) == [("mqar", "kda", 512), ("palindrome", "kda", 256)]
    assert step.fla_layers_to_warm([p for p in todo if p.impl == "ours"]) == []
    assert step.fla_layers_to_warm(_fla_plan(["ours"])) == []


def test_the_warming_processes_run_side_by_side_keep_no_choice_and_stop_at_the_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Each model's compile runs in its own process at once, with FLA_CACHE_RESULTS=0 (an untimed choice
    must not become the autotuner's result), and one that outlasts --warm-timeout is killed and said so,
    the rest reported by their last line."""
    quick = "import os, time; time.sleep(3); print('compiled, cache', os.environ['FLA_CACHE_RESULTS'])"
    commands = {"kda": [sys.executable, "-c", quick], "gla": [sys.executable, "-c", quick],
                "deltanet": [sys.executable, "-c", "import time; time.sleep(60)"]}
    monkeypatch.setattr(step, "warm_command", lambda args, task, mixer, T: commands[mixer])
    args = argparse.Namespace(warm_timeout=6.0, out=tmp_path)
    todo = [p for p in _fla_plan(["fla"]) if p.task == "mqar"]
    todo += [p._replace(mixer=m) for p in todo for m in ("gla", "deltanet")]
    t0 = time.perf_counter()
    models = step.warm_fla(todo, args)
    elapsed = time.perf_counter() - t0
    out = capsys.readouterr().out
    assert "compiling FLA's configs for 3 model(s) side by side" in out
    assert models == [("mqar", "kda", 256), ("mqar", "gla", 256), ("mqar", "deltanet", 256)]
    assert "fla kda mqar: compiled, cache 0" in out and "fla gla mqar: compiled, cache 0" in out
    assert "fla deltanet mqar: cut off at --warm-timeout 6 s" in out
    # side by side: one after the other, the two 3 s compiles would not both end within the 6 s, and the
    # slow one is stopped near the timeout
    assert elapsed < 20
    # each child's whole output kept beside the table
    assert (tmp_path / "warm" / "mqar_kda.log").read_text().strip() == "compiled, cache 0"


def test_warm_only_off_cuda_is_refused_before_anything_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        step.main(["--out", str(tmp_path / "out"), "--device", "cpu", "--impls", "ours", "--warm-only"])
    assert "--warm-only compiles FLA's Triton configs on CUDA" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _as_if_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() on a GPU that is not there: FLA's layers found, nothing touching CUDA itself."""
    find_spec = step.importlib.util.find_spec
    monkeypatch.setattr(step.importlib.util, "find_spec",
                        lambda name, *args: object() if name.startswith("fla") else find_spec(name, *args))
    monkeypatch.setattr(step, "indexed_device", lambda name: torch.device("cuda", 0))
    monkeypatch.setattr(step.torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(step, "provenance", lambda device: "a GPU")
    monkeypatch.setattr(step, "device_name", lambda device: "a GPU")


def test_warm_only_compiles_the_missing_fla_rows_and_times_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--warm-only (beside a run training on the GPU) warms FLA's models of the rows --resume would
    measure, then exits: no row timed, no table written, the kept rows untouched."""
    _as_if_on_a_gpu(monkeypatch)
    warmed: list[list[step.Planned]] = []

    def warm(todo: list[step.Planned], args: argparse.Namespace) -> list[tuple[str, str, int]]:
        warmed.append(todo)
        return step.fla_layers_to_warm(todo)

    monkeypatch.setattr(step, "warm_fla", warm)

    def no_timing(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("--warm-only timed a row")

    monkeypatch.setattr(step, "measure", no_timing)
    kept = {"impl": "fla", "default": False, "task": "mqar", "mixer": "kda", "layers": 2, "T": 256, "B": 4,
            "step_ms": 1.0, "tokens_per_s_M": 1.0, "first_step_s": 1.0, "device": "a GPU"}
    step.write([kept], tmp_path, "header", echo=False)
    before = (tmp_path / "bench_train.csv").read_text()
    args = ["--out", str(tmp_path), "--resume", "--batch", "4", "--mixers", "kda", "attention",
            "--tasks", "mqar", "--lengths", "256", "512", "--variants", "default", "--warm-only"]
    assert step.main(args) == 0
    (todo,) = warmed
    assert step.fla_layers_to_warm(todo) == [("mqar", "kda", 512)]
    assert "no FLA row left to measure" not in capsys.readouterr().out
    assert (tmp_path / "bench_train.csv").read_text() == before
    # every FLA row measured: nothing to warm, and it says so
    kept_512 = {**kept, "T": 512}
    step.write([kept, kept_512], tmp_path, "header", echo=False)
    assert step.main(args) == 0
    assert "no FLA row left to measure" in capsys.readouterr().out


def test_warm_only_with_no_warm_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    _as_if_on_a_gpu(monkeypatch)
    with pytest.raises(SystemExit):
        step.main(["--out", str(tmp_path / "out"), "--impls", "fla", "--warm-only", "--no-warm"])
    assert "without --no-warm" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
