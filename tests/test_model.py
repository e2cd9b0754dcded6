"""The backbone (mixers/model.py) and the softmax-attention mixer (mixers/attention.py).

The linear mixers have their own contract tests (tests/test_mixers.py); here every mixer yaml is only
checked to build inside the backbone from its config.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from mixers.attention import Attention
from mixers.model import LanguageModel, build_mixer

CONF = Path(__file__).resolve().parents[1] / "conf"
ATTENTION = {"_target_": "mixers.attention.Attention", "num_heads": 2, "head_dim": 16}


def _model(mixer: dict | None = None, **kwargs: object) -> LanguageModel:
    torch.manual_seed(0)
    return LanguageModel(11, mixer or ATTENTION, d_model=32, **kwargs).double()


@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("value_dim", [None, 8])
@pytest.mark.parametrize("use_short_conv", [False, True])
def test_attention_shapes_causality_and_step(rope: bool, value_dim: int | None, use_short_conv: bool) -> None:
    torch.manual_seed(0)
    mixer = Attention(
        24,
        num_heads=3,
        head_dim=8,
        value_dim=value_dim,
        rope=rope,
        use_short_conv=use_short_conv,
        conv_size=3,
    ).double()
    x = torch.randn(2, 13, 24, dtype=torch.float64)
    y = mixer(x)
    assert y.shape == x.shape
    # Causality: changing the input at t leaves every output before t unchanged, and changes t.
    t = 7
    x2 = x.clone()
    x2[:, t] += 1.0
    y2 = mixer(x2)
    torch.testing.assert_close(y2[:, :t], y[:, :t], rtol=0, atol=1e-12)
    assert (y2[:, t] - y[:, t]).abs().max() > 1e-3
    # Step decoding through the KV cache equals the full forward.
    cache = mixer.init_cache(2, device="cpu", dtype=torch.float64)
    steps = torch.stack([mixer.step(x[:, i], cache) for i in range(x.shape[1])], dim=1)
    torch.testing.assert_close(steps, y, rtol=1e-10, atol=1e-10)
    # state_size counts exactly what the cache holds after seq_len tokens.
    held = sum(tensor[0].numel() for tensor in cache.values())
    convs = 2 * 3 * (2 * 8 + (value_dim or 8)) if use_short_conv else 0  # 2 past inputs per conv channel
    assert mixer.state_size(13) == held == 3 * (8 + (value_dim or 8)) * 13 + convs


def test_rope_makes_attention_position_aware() -> None:
    """Without RoPE a token's output ignores where earlier tokens sit; with RoPE it does not."""
    torch.manual_seed(0)
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    swapped = x[:, [1, 0, 2, 3, 4, 5]]
    for rope, should_change in [(False, False), (True, True)]:
        mixer = Attention(16, num_heads=2, head_dim=8, rope=rope).double()
        changed = (mixer(x)[:, -1] - mixer(swapped)[:, -1]).abs().max() > 1e-9
        assert bool(changed) == should_change


def test_attention_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="head_dim=7"):
        Attention(16, num_heads=2, head_dim=7)
    with pytest.raises(ValueError, match="seq_len"):
        Attention(16, num_heads=2, head_dim=8).state_size()
    with pytest.raises(ValueError, match="conv_size=1"):
        Attention(16, num_heads=2, head_dim=8, use_short_conv=True, conv_size=1)


@pytest.mark.parametrize("mlp", ["swiglu", "gelu"])
def test_model_forward_causal_and_step_decoding(mlp: str) -> None:
    model = _model(mlp=mlp, num_layers=3)
    tokens = torch.randint(0, 11, (3, 12))
    logits = model(tokens)
    assert logits.shape == (3, 12, 11)
    changed = tokens.clone()
    changed[:, 5] = (changed[:, 5] + 1) % 11
    torch.testing.assert_close(model(changed)[:, :5], logits[:, :5], rtol=0, atol=1e-12)
    caches = model.init_cache(3, device="cpu", dtype=torch.float64)
    stepped = torch.stack([model.step(tokens[:, t], caches) for t in range(12)], dim=1)
    torch.testing.assert_close(stepped, logits, rtol=1e-10, atol=1e-10)
    assert model.state_size(12) == 3 * 2 * 2 * 16 * 12  # layers * (K and V) * heads * head_dim * length


def test_model_tied_embeddings_share_one_matrix() -> None:
    model = _model(tie_embeddings=True)
    assert model.lm_head.weight is model.embedding.weight
    untied = _model()
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in model.parameters()) == 11 * 32


def test_unknown_mixer_kwarg_names_key_mixer_and_accepted_parameters() -> None:
    with pytest.raises(ValueError) as error:
        build_mixer({**ATTENTION, "num_head": 4}, d_model=32, layer_idx=0, name="attention")
    message = str(error.value)
    assert "num_head" in message and "attention" in message and "num_heads" in message
    with pytest.raises(ValueError, match="_target_"):
        build_mixer({"num_heads": 2}, d_model=32, layer_idx=0, name="attention")
    # An error the constructor raises itself still says which mixer it came from.
    with pytest.raises(ValueError, match="attention.*head_dim=7"):
        build_mixer({**ATTENTION, "head_dim": 7}, d_model=32, layer_idx=0, name="attention")


def test_model_rejects_unknown_mlp() -> None:
    with pytest.raises(ValueError, match="relu"):
        _model(mlp="relu")


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF / "mixer").glob("*.yaml")))
def test_every_mixer_yaml_builds_in_the_backbone(name: str) -> None:
    """Each conf/mixer/<name>.yaml composes with the trunk config and its model runs forward."""
    import harness.config  # noqa: F401  (registers the structured schema)

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "config", overrides=["task=stand_in", f"mixer={name}", "model.d_model=32", "mixer.head_dim=16"]
        )
    torch.manual_seed(0)
    model = LanguageModel(16, cfg.mixer, d_model=cfg.model.d_model, num_layers=2, mixer_name=name)
    tokens = torch.randint(0, 16, (2, 10))
    logits = model(tokens)
    assert logits.shape == (2, 10, 16) and torch.isfinite(logits).all()
    assert model.state_size(10) > 0
