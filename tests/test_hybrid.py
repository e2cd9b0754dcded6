"""Hybrid stacks (`model.pattern`, mixers/pattern.py): the mixer contract on a KDA + attention model, the
one-mixer pattern equal to today's model bit for bit, per-kind switches through Hydra, errors, training,
resume, W&B tags, analysis grouping, and experiment=kimi_hybrid (its grid; its CPU smoke version, `slow`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from analysis import collect, grid, plot
from analysis.colours import MIXER_COLOURS, PATTERN_COLOURS, mixer_colour, mixer_order
from harness.config import validate
from harness.rundir import ResumeRefused
from harness.trainer import train
from mixers.attention import Attention
from mixers.kda import KDA
from mixers.model import LanguageModel
from mixers.pattern import (
    check_pattern,
    expand,
    mixer_configs,
    mixer_names,
    mixer_yaml,
    pattern_name,
    ratio,
    short_form,
)

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
MakeCfg = Callable[..., DictConfig]
SMALL = {"num_heads": 2, "head_dim": 16, "chunk_size": 16}
D, T, VOCAB = 32, 21, 11  # T odd and past a chunk of 16: a partial last chunk
HYBRIDS = [["kda", "kda", "kda", "attention"], ["attention", "gdn"]]


def _mixer_node(primary: str, pattern: list[str]) -> DictConfig:
    """The `mixer` node as Hydra composes it: the primary's yaml, plus a small section per other kind."""
    node = mixer_yaml(primary)
    for key, value in SMALL.items():
        if key in node:
            node[key] = value
    for kind in dict.fromkeys(pattern):
        if kind != primary:
            yaml_keys = mixer_yaml(kind)
            node[kind] = {k: v for k, v in SMALL.items() if k in yaml_keys}
    return node


def _hybrid(pattern: list[str], seed: int = 0, **kwargs: Any) -> LanguageModel:
    torch.manual_seed(seed)
    return LanguageModel(VOCAB, _mixer_node(pattern[0], pattern), d_model=D, num_layers=len(pattern),
                         pattern=pattern, mlp_ratio=2.0, **kwargs)


def _tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(seed))


def _numel(cache: Any) -> int:
    if isinstance(cache, torch.Tensor):
        return cache.numel()
    if isinstance(cache, dict):
        return sum(_numel(v) for v in cache.values())
    if isinstance(cache, (list, tuple)):
        return sum(_numel(v) for v in cache)
    return 0


# --- the mixer contract, on a hybrid stack ---------------------------------------------------------------


@pytest.mark.parametrize("pattern", HYBRIDS, ids=lambda p: ",".join(p))
def test_hybrid_is_causal_and_decodes_step_by_step_as_its_forward(pattern: list[str]) -> None:
    model = _hybrid(pattern)
    assert [type(m).__name__ for m in model.mixers] == [
        {"kda": "KDA", "attention": "Attention", "gdn": "GatedDeltaNet"}[name] for name in pattern]
    tokens = _tokens()
    logits = model(tokens)
    changed = tokens.clone()
    changed[:, 12] = (changed[:, 12] + 1) % VOCAB
    perturbed = model(changed)
    torch.testing.assert_close(perturbed[:, :12], logits[:, :12], rtol=0, atol=1e-6)
    assert (perturbed[:, 12] - logits[:, 12]).abs().amax() > 1e-4  # the change reaches position 12
    caches = model.init_cache(2, device="cpu", dtype=torch.float32)
    stepped = torch.stack([model.step(tokens[:, t], caches) for t in range(T)], dim=1)
    torch.testing.assert_close(stepped, logits, rtol=1e-4, atol=1e-5)
    # state_size counts what decoding holds: the recurrent states and the attention layers' KV cache
    assert model.state_size(T) * 2 == _numel(caches)


def test_hybrid_state_size_counts_the_kv_cache_of_its_attention_layers() -> None:
    model = _hybrid(["kda", "kda", "kda", "attention"])
    kda_layer = model.mixers[0].state_size()  # H K V + the conv caches: independent of the length
    assert kda_layer == 2 * 16 * 16 + 3 * (2 * 2 * 16 + 2 * 16)
    for length in (64, 2048):
        assert model.state_size(length) == 3 * kda_layer + 2 * 2 * 16 * length  # K and V, 2 heads x 16


def test_hybrid_rejects_an_unknown_switch_of_any_kind() -> None:
    for kind, node in (("kda", {"not_a_switch": 1}), ("attention", {"attention": {"not_a_switch": 1}})):
        mixer = OmegaConf.merge(_mixer_node("kda", ["kda", "attention"]), node)
        with pytest.raises(ValueError, match=rf"mixer '{kind}'.*unknown parameter\(s\) \['not_a_switch'\]"):
            LanguageModel(VOCAB, mixer, d_model=D, num_layers=2, pattern=["kda", "attention"])


def test_a_pattern_of_one_mixer_is_the_single_mixer_model_bit_for_bit() -> None:
    node = _mixer_node("kda", ["kda"])
    models = []
    for pattern in (None, ["kda", "kda", "kda"], ["kda*3"]):
        torch.manual_seed(0)
        models.append(LanguageModel(VOCAB, node, d_model=D, num_layers=3, pattern=pattern))
    tokens = _tokens()
    reference = models[0].state_dict()
    for model in models[1:]:
        assert model.state_dict().keys() == reference.keys()
        assert all(torch.equal(value, reference[key]) for key, value in model.state_dict().items())
        assert torch.equal(model(tokens), models[0](tokens))


def test_lean_backward_reaches_the_layers_that_have_it_and_gives_the_plain_gradients() -> None:
    pattern = ["kda", "attention"]
    plain, lean = _hybrid(pattern).double(), _hybrid(pattern, lean_backward=True).double()
    assert [getattr(m, "lean_backward", None) for m in lean.mixers] == [True, None]
    assert [b.mlp.fused for b in lean.blocks] == [True, True]
    tokens = _tokens()
    grads = []
    for model in (plain, lean):
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.roll(-1, 1).flatten())
        grads.append(torch.autograd.grad(loss, list(model.parameters())))
    for ref, ours in zip(*grads, strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-10)


@pytest.mark.slow
def test_compiled_hybrid_body_matches_eager() -> None:
    # Dynamo and AOT autograd over the mixed stack (the graph train.py compiles): ~10 s of tracing the
    # torch chunk form on the CPU; inductor's codegen of the ops is tests/test_compile.py's (slow too)
    model = _hybrid(["kda", "attention"])
    tokens = _tokens()
    positions, targets = torch.arange(1, 2 * T, 3), torch.randint(0, VOCAB, (len(range(1, 2 * T, 3)),))
    results = []
    for features in (model.features, torch.compile(model.features, backend="aot_eager")):
        loss, _ = model.scored_loss(features(tokens), positions, targets)
        results.append((loss, torch.autograd.grad(loss, list(model.parameters()))))
    (eager, eager_grads), (compiled, grads) = results
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    for ref, ours in zip(eager_grads, grads, strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-6)


# --- names and errors ------------------------------------------------------------------------------------


def test_pattern_names_ratios_and_short_forms() -> None:
    assert expand(["kda*3", "attention"]) == ["kda", "kda", "kda", "attention"]
    cases = {
        ("kda", "kda"): ("kda", "kda*2"),
        ("kda", "kda", "kda", "attention"): ("kda:attention 3:1", "kda*3,attention"),
        ("kda", "attention", "kda", "attention"): ("kda:attention 1:1", "kda,attention,kda,attention"),
        ("kda*7", "attention"): ("kda:attention 7:1", "kda*7,attention"),
        ("kda*3", "attention", "kda*3", "attention"): ("kda:attention 3:1",
                                                       "kda*3,attention,kda*3,attention"),
        # not the regular interleaving: named by its layers, so that it is not grouped with 3:1
        ("attention", "kda", "kda", "kda"): ("attention:kda 1:3", "attention,kda*3"),
        ("kda", "attention", "kda", "kda"): ("kda,attention,kda*2", "kda,attention,kda*2"),
    }
    for pattern, (name, short) in cases.items():
        assert (pattern_name(list(pattern)), short_form(list(pattern))) == (name, short), pattern
        assert expand([short_form(list(pattern))][0].split(",")) == expand(list(pattern))
    assert ratio(["gdn", "gdn", "attention", "mamba2"]) == "2:1:1" and pattern_name(None) is None


@pytest.mark.parametrize(("pattern", "num_layers", "says"), [
    (["kda", "atention"], 2, "'atention' is not a mixer; choose from attention, deltanet"),
    (["kda", "kda", "kda", "attention"], 3, "has 4 layers but model.num_layers=3: give one mixer per layer"),
    (["kda*0", "attention"], 1, "'kda*0' repeats a mixer 0 times; give a count >= 1"),
    ([], 2, "names no layer: give one mixer per layer (2 for model.num_layers=2), or model.pattern=null"),
])
def test_a_bad_pattern_is_one_line_naming_the_value_and_the_fix(pattern: list[str], num_layers: int,
                                                               says: str) -> None:
    with pytest.raises(ValueError) as error:
        check_pattern(pattern, num_layers)
    message = str(error.value)
    assert says in message and message.startswith(f"model.pattern=[{','.join(pattern)}]")
    assert "\n" not in message
    if "choose from" in says:
        assert message.endswith(", ".join(mixer_names()) + " (conf/mixer/<name>.yaml)")


def test_the_mixer_node_is_unused_with_a_warning_or_ambiguous_with_an_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = _mixer_node("kda", ["kda"])  # changed from kda.yaml: head_dim, chunk_size
    with caplog.at_level("WARNING", logger="train"):
        configs = mixer_configs(node, ["attention", "attention"])
    assert configs["attention"] == OmegaConf.load(CONF / "mixer" / "attention.yaml")
    assert "has no kda layer, so mixer.chunk_size, mixer.head_dim (the mixer=kda settings) configure " \
           "nothing" in caplog.text
    # two yamls of the node's class in one pattern: which one it configures cannot be told
    mixers = tmp_path / "mixer"
    mixers.mkdir()
    (tmp_path / "linear_mixer.yaml").write_text((CONF / "linear_mixer.yaml").read_text())
    for name in ("kda", "attention"):
        (mixers / f"{name}.yaml").write_text((CONF / "mixer" / f"{name}.yaml").read_text())
    (mixers / "kda_small.yaml").write_text((CONF / "mixer" / "kda.yaml").read_text())
    with pytest.raises(ValueError, match=r"kda, kda_small all build mixers.kda.KDA, the `mixer` node"):
        mixer_configs(node, ["kda", "kda_small"], conf_dir=mixers)


# --- through Hydra and train.py --------------------------------------------------------------------------


def _compose(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=["model.d_model=32", *overrides])


def test_switches_per_kind_through_hydra_keep_the_single_mixer_overrides() -> None:
    cfg = _compose("model.num_layers=4", "model.pattern=[kda,kda,kda,attention]", "mixer.head_dim=16",
                   "mixer.use_short_conv=false", "mixer.kda.gate=softplus", "mixer.attention.head_dim=16",
                   "mixer.attention.use_short_conv=true")
    validate(cfg)
    model = LanguageModel(VOCAB, cfg.mixer, **OmegaConf.to_container(cfg.model, enum_to_str=True))
    kda, attention = model.mixers[0], model.mixers[3]
    assert isinstance(kda, KDA) and isinstance(attention, Attention)
    # mixer.* (the mixer=kda choice) and mixer.kda.* reach the KDA layers, mixer.attention.* the attention one
    assert [(m.gate, m.use_short_conv, m.head_dim) for m in model.mixers[:3]] == [("softplus", False, 16)] * 3
    assert (attention.use_short_conv, attention.head_dim) == (True, 16)
    # without a pattern, mixer.kda.* is the model's own mixer; another kind's section is an error
    single = _compose("mixer.head_dim=16", "mixer.kda.gate=softplus")
    assert LanguageModel(VOCAB, single.mixer, d_model=32).mixers[0].gate == "softplus"
    stray = _compose("mixer.head_dim=16", "mixer.attention.rope=false")
    with pytest.raises(ValueError, match=r"mixer.attention.\* configures attention layers, but this model "
                                         r"has none .*set model.pattern to include attention"):
        LanguageModel(VOCAB, stray.mixer, d_model=32)
    with pytest.raises(ValueError, match=r"model.pattern=\[kda,gdnn\]: 'gdnn' is not a mixer"):
        validate(_compose("model.pattern=[kda,gdnn]"))


def test_one_mixer_pattern_trains_as_the_single_mixer_run(make_cfg: MakeCfg, tmp_path: Path) -> None:
    """Same init with the same seed, the same loss at every step, the same summary but its paths."""
    steps = ["trainer.max_steps=6", "trainer.eval_every=3", "trainer.log_every=1"]
    runs = {}
    for name, extra in (("single", ()), ("pattern", ("model.pattern=[attention,attention]",))):
        summary = train(make_cfg(*steps, *extra), tmp_path / name, mixer_name="attention")
        metrics = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        runs[name] = summary, [{k: v for k, v in m.items() if k != "time_s"} for m in metrics]
    (single, single_metrics), (pattern, pattern_metrics) = runs["single"], runs["pattern"]
    assert single_metrics == pattern_metrics and len(single_metrics) == 6
    same = ("mixer", "state_size", "n_params", "best_eval_acc", "final_eval_acc", "best_train_acc")
    assert {k: single[k] for k in same} == {k: pattern[k] for k in same}


def test_hybrid_run_resumes_exactly_and_tags_its_pattern(make_cfg: MakeCfg, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    hybrid = ["model.pattern=[attention,kda]", "mixer.kda.head_dim=16", "mixer.kda.chunk_size=16"]
    cfg = make_cfg(*hybrid, "trainer.max_steps=8", "trainer.eval_every=4", "trainer.log_every=1",
                   "trainer.checkpoint_every=4", "logger.wandb.mode=offline")
    seen: dict[str, Any] = {}

    class FakeRun:
        id, summary = "fake", {}

        def log(self, *args: object, **kwargs: object) -> None: ...

        def finish(self, exit_code: int = 0) -> None: ...

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(
        init=lambda **kwargs: seen.update(kwargs) or FakeRun()))
    summary = train(cfg, tmp_path / "whole", mixer_name="attention")
    assert summary["mixer"] == "attention:kda 1:1" and summary["status"] == "completed"
    assert {"attention:kda 1:1", "pattern:attention,kda", "ratio:1:1"} <= set(seen["tags"])
    kda_layer = 2 * 16 * 16 + 3 * (2 * 2 * 16 + 2 * 16)
    assert summary["state_size"] == 2 * 2 * 16 * 16 + kda_layer  # the attention KV cache at L=16, + KDA's

    adamw_step, calls = torch.optim.AdamW.step, []

    def interrupt_after_update_6(self: torch.optim.AdamW, *args: object, **kwargs: object) -> object:
        result = adamw_step(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return result

    with monkeypatch.context() as patch:
        patch.setattr(torch.optim.AdamW, "step", interrupt_after_update_6)
        with pytest.raises(KeyboardInterrupt):
            train(cfg, tmp_path / "parts", mixer_name="attention")
    resumed = train(cfg, tmp_path / "parts", mixer_name="attention")

    def losses(run: str) -> list[tuple[int, float]]:
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [(m["step"], m["train/loss"]) for m in map(json.loads, lines)]

    assert losses("parts") == losses("whole") and resumed["final_eval_acc"] == summary["final_eval_acc"]
    # another pattern is another model: its checkpoint is not resumed
    other = make_cfg("model.pattern=[kda,attention]", *hybrid[1:], "trainer.max_steps=8",
                     "trainer.checkpoint_every=4")
    (tmp_path / "parts" / "summary.json").unlink()
    with pytest.raises(ResumeRefused, match=r"model.pattern=\['attention', 'kda'\] -> \['kda', 'att"):
        train(other, tmp_path / "parts", mixer_name="attention")


def test_a_relaunch_spelling_the_same_pattern_otherwise_is_the_same_run() -> None:
    """`kda*3` and `kda,kda,kda` build one model: a relaunch written the other way was refused as another
    config; another order of the layers is another model."""
    from harness.config import compare

    def flat(*pattern: str) -> dict[str, object]:
        return {"model.pattern": list(pattern), "model.num_layers": 4}

    assert compare(flat("kda*3", "attention"), flat("kda", "kda", "kda", "attention")).computed == []
    reordered = compare(flat("kda*3", "attention"), flat("kda", "attention", "kda*2"))
    assert reordered.computed == ["model.pattern"]


# --- analysis --------------------------------------------------------------------------------------------


def test_collect_names_a_hybrid_run_by_its_pattern(tmp_path: Path) -> None:
    """A run that died before its summary: its row's mixer still comes from model.pattern, not the
    mixer= choice, and the ratio's group choice is not a variant."""
    run = tmp_path / "sweep" / "kda3_attn1" / "task=mqar"
    (run / ".hydra").mkdir(parents=True)
    config = {"task": {"name": "mqar", "seq_len": 64}, "mixer": {"_target_": "mixers.kda.KDA"},
              "model": {"num_layers": 4, "pattern": ["kda", "kda", "kda", "attention"]},
              "optim": {"lr": 1e-3}, "seed": 0}
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(
        ["experiment/hybrid=kda3_attn1", "task=mqar", "mixer=kda", "model.pattern=[kda*3,attention]"]))
    (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"runtime": {"choices": {
        "mixer": "kda"}}}}))
    (row,) = collect.collect_dirs([tmp_path / "sweep"]).to_dict("records")
    assert (row["mixer"], row["variant"], row["status"]) == ("kda:attention 3:1", "", "incomplete")
    # the same from W&B: a crashed run has no summary to name it, its config does
    crashed = types.SimpleNamespace(id="a", name="a", group="kimi_hybrid", state="crashed",
                                    tags=["task:mqar", "hybrid:kda3_attn1", "pattern:kda*3,attention"],
                                    config=config, summary=types.SimpleNamespace(_json_dict={}))
    api = types.SimpleNamespace(runs=lambda path, filters=None: [crashed])
    (row,) = collect.collect_wandb("team/proj", api=api).to_dict("records")
    assert (row["mixer"], row["status"]) == ("kda:attention 3:1", "failed")


def test_each_kimi_ratio_has_its_own_colour_and_legend_place() -> None:
    colours = [mixer_colour(name) for name in [*MIXER_COLOURS, *PATTERN_COLOURS]]
    assert len(set(colours)) == len(colours)
    assert mixer_colour("gdn:attention 3:1") not in colours  # an unlisted pattern: a fallback colour
    names = {"attention", "kda:attention 1:1", "kda", "kda:attention 3:1", "gdn", "kda:attention 7:1"}
    assert mixer_order(names) == ["kda", "kda:attention 7:1", "kda:attention 3:1", "kda:attention 1:1", "gdn",
                                  "attention"]


def test_plot_grid_names_a_hybrid_cell_by_its_pattern_as_collect_names_its_run(tmp_path: Path) -> None:
    """`analysis.plot --grid kimi_hybrid`: the ratio is the series (the experiment/hybrid choice or a swept
    model.pattern), so a hybrid run fills its cell and a ratio not yet run is marked as such."""
    cells = grid.grid_cells(["kimi_hybrid"])
    ratios = {"kda", "kda:attention 7:1", "kda:attention 3:1", "kda:attention 1:1", "attention"}
    assert len(cells) == 5 * 2 * 3 and set(cells["series"]) == ratios and set(cells["variant"]) == {""}
    table = collect.pd.DataFrame([{"task": "mqar", "mixer": "kda:attention 3:1", "variant": "",
                                   "seq_len": 512, "status": "completed"}])
    pending = grid.not_run(cells, table)
    assert ("mqar", "kda:attention 3:1", 512) not in set(zip(pending["task"], pending["series"],
                                                             pending["seq_len"], strict=True))
    assert grid.fill_note(cells, pending) == "1 of 30 cells run"
    # a grid that sweeps model.pattern itself
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "experiment" / "patterns.yaml").write_text(
        "# @package _global_\nmodel:\n  num_layers: 4\nhydra:\n  sweeper:\n    params:\n      task: mqar\n"
        "      task.seq_len: 64\n      mixer: kda\n"
        "      model.pattern: '[kda*3,attention],[kda,attention,kda,attention]'\n")
    swept = grid.grid_cells(["patterns"], conf_dir=conf)
    assert list(swept["series"]) == ["kda:attention 1:1", "kda:attention 3:1"]


# --- experiment=kimi_hybrid ------------------------------------------------------------------------------


def test_kimi_hybrid_grid_composes_with_every_ratio() -> None:
    ratios = {p.stem for p in (CONF / "experiment" / "hybrid").glob("*.yaml")}
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=kimi_hybrid"], return_hydra_config=True)
        grid = {k: str(v).split(",") for k, v in cfg.hydra.sweeper.params.items()}
        assert set(grid["experiment/hybrid"]) == ratios
        assert set(grid["task"]) == {"mqar", "palindrome"}
        assert set(grid["task.seq_len"]) == {"512", "1024", "2048"}
        assert cfg.hydra.sweep.dir == "runs/sweeps/kimi_hybrid" and cfg.trainer.max_steps == 20000
        names = {}
        for choice in sorted(ratios):
            one = compose("config", overrides=["experiment=kimi_hybrid", f"experiment/hybrid={choice}"])
            validate(one)
            names[pattern_name(one.model.pattern)] = one.model.num_layers
    assert names == {"kda": 4, "kda:attention 7:1": 8, "kda:attention 3:1": 4, "kda:attention 1:1": 4,
                     "attention": 4}


def test_kimi_hybrid_h200_is_the_hybrid_grid_at_mqar_2048_with_the_fig4_h200_budget() -> None:
    ratios = {p.stem for p in (CONF / "experiment" / "hybrid").glob("*.yaml")}
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        h200 = compose("config", overrides=["experiment=kimi_hybrid_h200"], return_hydra_config=True)
        fig4 = compose("config", overrides=["experiment=kimi_fig4_h200"], return_hydra_config=True)
        hybrid = compose("config", overrides=["experiment=kimi_hybrid"])
    grid = {k: str(v).split(",") for k, v in h200.hydra.sweeper.params.items()}
    assert set(grid["experiment/hybrid"]) == ratios
    assert grid["task"] == ["mqar"] and grid["task.seq_len"] == ["2048"] and grid["seed"] == ["0"]
    assert grid["optim.lr"] == ["0.001"]
    assert h200.trainer == fig4.trainer and h200.task.eval_seq_lens == fig4.task.eval_seq_lens
    assert h200.hydra.sweep.dir == "results/kimi_hybrid_h200"
    # the model and the rest of the task are kimi_hybrid's own
    assert h200.model == hybrid.model and h200.task.params == hybrid.task.params


@pytest.mark.slow
def test_kimi_hybrid_smoke_sweep_trains_every_ratio_and_plots_them(tmp_path: Path) -> None:
    """experiment=kimi_hybrid_smoke end to end on the CPU (~30 s on two cores): every ratio completes, the
    state size grows with the length by the attention layers' KV cache, the figures group by pattern."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "1"}
    sweep = tmp_path / "kimi_hybrid_smoke"
    result = subprocess.run([sys.executable, "train.py", "-m", "experiment=kimi_hybrid_smoke",
                             f"hydra.sweep.dir={sweep}"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = collect.collect_dirs([sweep])
    assert (table["status"] == "completed").all() and len(table) == 10
    assert set(table["variant"]) == {""}
    state = {(r.mixer, int(r.seq_len)): int(r.state_size) for r in table.itertuples()}
    kv_per_token = 2 * 2 * 16  # K and V of 2 heads x 16, per attention layer
    attention_layers = {"kda": 0, "kda:attention 7:1": 1, "kda:attention 3:1": 1, "kda:attention 1:1": 2,
                        "attention": 4}
    for mixer, layers in attention_layers.items():
        assert state[mixer, 32] - state[mixer, 16] == layers * kv_per_token * 16, mixer
    written = plot.plot_all(table, tmp_path / "figures")
    assert {p.name for p in written} >= {"acc_vs_length.png", "acc_vs_state_size.png", "summary.md"}
    for figure in ("acc_vs_length", "acc_vs_state_size"):
        data = plot.pd.read_csv(tmp_path / "figures" / f"{figure}.csv", keep_default_na=False)
        assert set(data["series"]) == set(attention_layers)
