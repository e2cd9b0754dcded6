"""The training step's pieces (harness/step.py) on the CPU: a non-finite gradient skips the fused update on
the device, and a finite one does not."""

from __future__ import annotations

import torch

from harness import step


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=0.1, fused=True)
    return model, params, optimizer


def _step(model, params, optimizer, poison: bool) -> torch.Tensor:
    loss = model(torch.randn(5, 4)).square().mean()
    optimizer.zero_grad()
    loss.backward()
    if poison:
        params[0].grad[0, 0] = float("nan")
    _, finite = step.clip_and_guard(params, 1.0, loss.detach(), optimizer)
    optimizer.step()
    return finite


def test_non_finite_update_is_skipped_and_not_counted() -> None:
    model, params, optimizer = _model_and_optimizer()
    _step(model, params, optimizer, poison=False)
    before = [p.detach().clone() for p in params]
    steps = [optimizer.state[p]["step"].clone() for p in params]
    finite = _step(model, params, optimizer, poison=True)
    assert not bool(finite)
    assert all(torch.equal(a, p) for a, p in zip(before, params, strict=True))
    assert all(torch.equal(s, optimizer.state[p]["step"]) for s, p in zip(steps, params, strict=True))
    finite = _step(model, params, optimizer, poison=False)
    assert bool(finite) and not torch.equal(before[0], params[0])


def test_make_batch_finds_the_scored_positions() -> None:
    labels = torch.tensor([[-100, 3, -100, 5], [-100, -100, -100, -100], [1, 2, -100, 4]])
    inputs = torch.arange(12).view(3, 4)
    batch = step.make_batch(inputs, labels, torch.device("cpu"))
    assert batch.positions.tolist() == [1, 3, 8, 9, 11]
    assert batch.targets.tolist() == [3, 5, 1, 2, 4]
    assert batch.sequence.tolist() == [0, 0, 2, 2, 2]
    assert batch.per_sequence.tolist() == [2, 0, 3]
    assert (batch.num_scored, batch.num_sequences_scored) == (5, 2)


def test_evaluate_equals_the_full_logits_computation() -> None:
    from contextlib import nullcontext

    import torch.nn.functional as F
    from omegaconf import OmegaConf

    from mixers.model import LanguageModel

    torch.manual_seed(0)
    mixer = OmegaConf.create({"_target_": "mixers.attention.Attention", "num_heads": 2, "head_dim": 8})
    model = LanguageModel(11, mixer, d_model=16, num_layers=1, mlp_ratio=2.0)
    inputs = torch.randint(0, 11, (7, 9))
    labels = torch.randint(0, 11, (7, 9))
    labels[torch.rand(7, 9) < 0.5] = -100
    labels[3] = -100  # a sequence with nothing to score counts in neither sum
    result = step.evaluate(model, inputs, labels, 3, torch.device("cpu"), nullcontext)
    with torch.no_grad():
        logits = model(inputs)
    mask = labels != -100
    hits = (logits.argmax(-1) == labels) & mask
    scored = mask.any(-1)
    perfect = ((hits.sum(-1) == mask.sum(-1)) & scored).sum()
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum") / mask.sum()
    assert abs(result["loss"] - float(loss)) < 1e-5
    assert result["acc"] == int(hits.sum()) / int(mask.sum())
    assert result["seq_acc"] == int(perfect) / int(scored.sum())


def test_an_eval_batch_at_a_longer_length_holds_no_more_tokens_and_scores_the_same() -> None:
    from contextlib import nullcontext

    from omegaconf import OmegaConf

    from mixers.model import LanguageModel

    torch.manual_seed(0)
    mixer = OmegaConf.create({"_target_": "mixers.attention.Attention", "num_heads": 2, "head_dim": 8})
    model = LanguageModel(11, mixer, d_model=16, num_layers=1, mlp_ratio=2.0)
    eval_sets = {}
    for length in (8, 16, 24):
        labels = torch.randint(0, 11, (10, length))
        labels[torch.rand(10, length) < 0.5] = -100
        eval_sets[length] = (torch.randint(0, 11, (10, length)), labels)
    shapes: list[tuple[int, int]] = []
    hook = model.embedding.register_forward_pre_hook(lambda _m, args: shapes.append(tuple(args[0].shape)))
    evals = step.evaluate_lengths(model, eval_sets, 16, 4, torch.device("cpu"), nullcontext)
    hook.remove()
    # 4 sequences of 16 tokens: at 8 the same 4 (no longer batch), at 24 two (64 // 24)
    assert shapes == [(4, 8), (4, 8), (2, 8), (4, 16), (4, 16), (2, 16), *[(2, 24)] * 5]
    assert [step.eval_batch_size_at(512, 1024, n) for n in (512, 1024, 2048, 4096, 10**6)] == [512, 512, 256,
                                                                                           128, 1]
    for length, (inputs, labels) in eval_sets.items():
        whole = step.evaluate(model, inputs, labels, 10, torch.device("cpu"), nullcontext)
        assert evals[f"eval/acc@{length}"] == whole["acc"]
        assert evals[f"eval/seq_acc@{length}"] == whole["seq_acc"]


def test_enum_keys_are_validated_by_hydra_with_the_choices_named() -> None:
    from pathlib import Path

    import pytest
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    import harness.config  # noqa: F401  (registers the structured schema `base_config`)

    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("config", overrides=["trainer.precision=bf16", "model.mlp=gelu"])
        assert cfg.trainer.precision == "bf16" and cfg.model.mlp == "gelu"
        for override, choices in (("trainer.precision=bf17", "auto, bf16, fp32"),
                                  ("model.mlp=relu", "swiglu, gelu"),
                                  ("logger.wandb.mode=on", "disabled, offline, online")):
            with pytest.raises(ConfigCompositionException) as error:
                compose("config", overrides=[override])
            assert choices in str(error.value.__cause__)
