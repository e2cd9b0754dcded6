"""Every mixer of conf/mixer/*.yaml against the contract of mixers/base.py (docs/design.md §4).

Mixers are discovered from their yaml, so a new `conf/mixer/<name>.yaml` is tested with no edit here. Each
is built by `hydra.utils.instantiate` at a small size (the keys of SMALL that its yaml has). A mixer's
defaults live in its class; its yaml (composed as Hydra composes it) and mixers/README.md are checked
against the class's signature.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import hydra
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

import kernels
from mixers.kda import KDA
from mixers.linear_base import LinearMixer
from mixers.longhorn import Longhorn
from mixers.pattern import mixer_yaml

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf" / "mixer"
YAMLS = sorted(CONF.glob("*.yaml"))
NAMES = [p.stem for p in YAMLS]
D = 32
T = 37  # odd and not a multiple of the chunk size: exercises a partial last chunk
SMALL = {"num_heads": 2, "head_dim": 16, "chunk_size": 16}

# Switch settings worth a forward/backward each, applied to every yaml that has all their keys (and differs
# there). Boolean keys of a yaml that no case covers are flipped as well, so a new switch is exercised too.
CASES: list[dict[str, Any]] = [
    {"use_short_conv": False},
    {"use_short_conv": True},
    {"qk_norm": False},
    {"qk_norm": True},
    {"output_norm": False},
    {"output_gate": "none"},
    {"output_gate": "sigmoid", "output_gate_rank": "low"},
    {"output_gate": "sigmoid", "output_gate_rank": "full"},
    {"output_gate": "swish", "output_gate_rank": "low", "output_gate_low_rank_dim": 4},
    {"output_gate": "swish", "output_gate_rank": "full"},
    {"feature_map": "identity"},
    {"feature_map": "elu+1"},
    {"feature_map": "relu"},
    {"gate": "softplus"},
    {"gate": "bounded"},
    {"gate": "bounded", "g_min": -1.0},
    {"allow_neg_eigval": True},
    {"num_heads": 1},
    {"num_heads": 3, "head_dim": 8},
    {"value_dim": 24},
    {"chunk_size": 32},
]


def load(name: str) -> Any:
    return mixer_yaml(name, CONF)


def build(name: str, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    cfg = load(name)
    small = {k: v for k, v in SMALL.items() if k in cfg}
    with torch.random.fork_rng():
        # module init draws from torch's global RNG; fork it so tests do not touch each other's state
        torch.manual_seed(seed)
        return hydra.utils.instantiate(cfg, d_model=D, layer_idx=0, **{**small, **overrides})


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def cache_numel(cache: Any) -> int:
    """Numbers in a cache (nested dicts/lists of tensors)."""
    if isinstance(cache, torch.Tensor):
        return cache.numel()
    if isinstance(cache, dict):
        return sum(cache_numel(v) for v in cache.values())
    if isinstance(cache, (list, tuple)):
        return sum(cache_numel(v) for v in cache)
    return 0


def switch_cases() -> list[Any]:
    params = []
    for name in NAMES:
        cfg = load(name)
        covered = {key for case in CASES for key in case}
        cases = [{}] + [
            c for c in CASES if all(k in cfg for k in c) and any(cfg[k] != v for k, v in c.items())
        ]
        cases += [{k: not v} for k, v in cfg.items() if isinstance(v, bool) and k not in covered]
        for case in cases:
            label = ",".join(f"{k}={v}" for k, v in case.items()) or "yaml"
            params.append(pytest.param(name, case, id=f"{name}-{label}"))
    return params


def test_every_yaml_is_found() -> None:
    # the seven mixers of the issue and Longhorn, the worked example of docs/adding_a_mixer.md
    expected = {"attention", "linear_attn", "mamba2", "gla", "deltanet", "gdn", "kda", "longhorn"}
    assert expected <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_causal(name: str) -> None:
    m = build(name)
    x = randn(2, T, D)
    x2 = x.clone()
    x2[:, 20] += randn(2, D, seed=1)
    y, y2 = m(x), m(x2)
    torch.testing.assert_close(y2[:, :20], y[:, :20], rtol=0, atol=1e-6)
    # the perturbation must reach position 20, else the check above proves nothing
    assert (y2[:, 20] - y[:, 20]).abs().amax(dim=-1).min() > 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_step_decoding_equals_forward(name: str) -> None:
    m = build(name)
    x = randn(2, T, D)
    y = m(x)
    cache = m.init_cache(2, device="cpu", dtype=torch.float32)
    y_step = torch.stack([m.step(x[:, t], cache) for t in range(T)], dim=1)
    torch.testing.assert_close(y_step, y, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_prefill_then_step_equals_forward(name: str) -> None:
    m = build(name)
    if "cache" not in inspect.signature(m.forward).parameters:
        pytest.skip(f"{name}: forward takes no cache (no prefill)")
    x = randn(2, T, D)
    y = m(x)
    cache = m.init_cache(2, device="cpu", dtype=torch.float32)
    head = m(x[:, :20], cache=cache)
    tail = torch.stack([m.step(x[:, t], cache) for t in range(20, T)], dim=1)
    torch.testing.assert_close(torch.cat([head, tail], dim=1), y, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("name", "case"), switch_cases())
def test_switch_builds_and_trains(name: str, case: dict[str, Any]) -> None:
    m = build(name, **case)
    x = randn(2, T, D).requires_grad_()
    y = m(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    (y.pow(2).mean()).backward()
    assert torch.isfinite(x.grad).all()
    for pname, p in m.named_parameters():
        assert p.grad is not None, f"{name} {case}: parameter {pname} gets no gradient (unused?)"
        assert torch.isfinite(p.grad).all(), f"{name} {case}: gradient of {pname} is not finite"


@pytest.mark.parametrize("name", NAMES)
def test_state_size_counts_the_cache(name: str) -> None:
    m = build(name)
    B, steps = 3, 5
    cache = m.init_cache(B, device="cpu", dtype=torch.float32)
    for t in range(steps):
        m.step(randn(B, D, seed=t), cache)
    assert m.state_size(steps) * B == cache_numel(cache)


@pytest.mark.parametrize("name", [n for n in NAMES if isinstance(build(n), LinearMixer)])
@pytest.mark.parametrize("use_short_conv", [True, False])
def test_linear_state_size_formula(name: str, use_short_conv: bool) -> None:
    m = build(name, use_short_conv=use_short_conv)
    H, K, V = m.num_heads, m.head_dim, m.value_dim
    conv = (m.conv_size - 1) * (2 * H * K + H * V) if use_short_conv else 0
    assert m.state_size() == m.state_size(10_000) == H * K * V + conv


@pytest.mark.parametrize("name", [n for n in NAMES if "backend" in load(n)])
def test_torch_and_naive_backends_agree(name: str) -> None:
    fast, slow = build(name, backend="torch"), build(name, backend="naive")
    slow.load_state_dict(fast.state_dict())
    x = randn(2, T, D)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    ys = [fast(xs[0]), slow(xs[1])]
    torch.testing.assert_close(ys[0], ys[1], rtol=1e-4, atol=1e-5)
    for y in ys:
        y.pow(2).sum().backward()
    torch.testing.assert_close(xs[0].grad, xs[1].grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_unknown_kwarg_raises(name: str) -> None:
    # The class itself, not hydra.utils.instantiate (which wraps every error): a misspelt switch must be a
    # TypeError naming it, not swallowed by a **kwargs.
    cfg = OmegaConf.to_container(load(name))
    cls = hydra.utils.get_class(cfg.pop("_target_"))
    kwargs = {**cfg, **{k: v for k, v in SMALL.items() if k in cfg}}
    cls(D, layer_idx=0, **kwargs)
    with pytest.raises(TypeError, match="unexpected keyword argument 'not_a_switch'"):
        cls(D, layer_idx=0, **kwargs, not_a_switch=1)


@pytest.mark.parametrize(
    "bad",
    [{"output_gate": "tanh"}, {"output_gate_rank": "mid"}, {"feature_map": "exp"}, {"backend": "cuda"},
     {"chunk_size": 48}, {"num_heads": 0}, {"gate": "tanh"}, {"g_min": 0.0}],
)  # fmt: skip
def test_bad_values_raise_value_error(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        KDA(D, **{"num_heads": 2, "head_dim": 16, **bad})


def test_kda_bounded_gate_stays_in_range() -> None:
    m = build("kda", gate="bounded", g_min=-5.0)
    with torch.no_grad():
        m.A_log.fill_(3.0)  # a steep sigmoid: logits far beyond both ends
    x = 100 * randn(4, T, D)
    g = m.log_decay(x)
    assert g.shape == (4, T, 2, 16)
    assert g.min() >= -5.0 and g.max() <= 0.0
    # both ends are reached, so the bound is what holds g in, not small inputs
    assert g.min() < -4.9 and g.max() > -0.1
    # the softplus gate on the same input is unbounded below: the check above can fail
    soft = build("kda", gate="softplus")
    assert soft.log_decay(x).min() < -5.0


def test_kda_passes_lower_bound_only_to_ops_that_take_it() -> None:
    m = build("kda", gate="bounded", g_min=-5.0)
    x = randn(2, T, D)
    y_plain = m(x)
    seen: dict[str, Any] = {}

    def op_with_lower_bound(*args: Any, lower_bound: float | None = None, **kwargs: Any) -> Any:
        seen["lower_bound"] = lower_bound
        return kernels.chunk_kda(*args, **kwargs)

    m.chunk_op = op_with_lower_bound
    torch.testing.assert_close(m(x), y_plain)
    assert seen["lower_bound"] == -5.0
    assert build("kda", gate="softplus")._op_kwargs(op_with_lower_bound) == {}


def test_the_lower_bound_check_is_a_constant_to_torch_compile() -> None:
    """Dynamo calls accepts_lower_bound at trace time instead of tracing its cache (which warned in every
    compiled run) and keeps one graph."""
    import warnings

    m = build("kda", gate="bounded", g_min=-5.0, backend="torch")
    x = randn(2, T, D)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = torch.compile(m, backend="eager", fullgraph=True)(x)
    assert not [w for w in caught if "lru_cache" in str(w.message)], [str(w.message) for w in caught]
    torch.testing.assert_close(y, m(x))


def test_kda_initial_decay_is_the_same_for_both_gates() -> None:
    # the two gates start from the same decay range, so the gate ablation compares the functions, not inits
    x = torch.zeros(1, 1, D)
    for gate in ("softplus", "bounded"):
        m = build("kda", gate=gate, head_dim=64)
        with torch.no_grad():
            m.A_log.zero_()
        g = m.log_decay(x)
        assert -0.1 - 1e-4 <= g.min() and g.max() <= -1e-3 + 1e-6, gate


@pytest.mark.parametrize("qk_norm", [False, True])
def test_longhorn_beta(qk_norm: bool) -> None:
    m = build("longhorn", qk_norm=qk_norm)
    assert isinstance(m, Longhorn)
    with torch.no_grad():
        m.beta_proj.weight.mul_(30)  # large raw beta: DeltaNet's update would overshoot, Longhorn's may not
    x = randn(2, T, D)
    q, k, v = m._qkv(x, None)
    _, g, beta_eff = m.gates(x, k, v)
    assert g is None
    beta = F.softplus(m.beta_proj(x))  # [B, T, H]
    k2 = k.pow(2).sum(-1)
    torch.testing.assert_close(beta_eff, beta / (1 + beta * k2))
    if qk_norm:
        torch.testing.assert_close(beta_eff, beta / (1 + beta))
    # the eigenvalue of I - beta' k k^T along k is 1 / (1 + beta |k|^2): in (0, 1] for any beta
    assert (beta_eff * k2 < 1).all() and (beta_eff > 0).all()
    # and the layer runs DeltaNet's recurrence with that beta'
    o, _ = kernels.naive_recurrent(q, k, v, beta=beta / (1 + beta * k2))
    torch.testing.assert_close(m(x), m._output(x, o), rtol=1e-4, atol=1e-5)


def _defaults(name: str) -> dict[str, Any]:
    """The class's default of every keyword its yaml may set: its signature, the paper defaults applied."""
    factory = hydra.utils.get_object(load(name)["_target_"])
    params = inspect.signature(factory).parameters
    return {k: p.default for k, p in params.items() if k not in ("d_model", "layer_idx")}


@pytest.mark.parametrize("name", NAMES)
def test_yaml_states_the_class_defaults(name: str) -> None:
    # the class holds the defaults; the yaml is the readable list of switches, with the class's values
    cfg = OmegaConf.to_container(load(name))
    cfg.pop("_target_")
    defaults = _defaults(name)
    assert {k: defaults.get(k, f"<not a parameter of {name}>") for k in cfg} == cfg


LINEAR = [n for n in NAMES if isinstance(build(n), LinearMixer)]
SHARED = OmegaConf.load(ROOT / "conf" / "linear_mixer.yaml")


@pytest.mark.parametrize("name", LINEAR)
def test_a_linear_yaml_states_its_switches_and_takes_the_rest_from_the_shared_file(name: str) -> None:
    # conf/linear_mixer.yaml holds the skeleton's values once; a linear mixer's yaml names it and states
    # only the keys left to each mixer (???) and its own
    raw = OmegaConf.load(CONF / f"{name}.yaml")
    assert list(raw.defaults) == ["/linear_mixer@_here_", "_self_"]
    left = {k for k in SHARED if OmegaConf.is_missing(SHARED, k)}
    assert left <= set(raw) and not (set(SHARED) - left) & set(raw)


def _readme_table(title: str) -> dict[str, list[str]]:
    """mixers/README.md's table after `title`: {mixer: its cells}."""
    text = (ROOT / "mixers" / "README.md").read_text()
    rows = text[text.index(title):].split("\n\n")[1].splitlines()[2:]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    return {row[0].strip("`"): row[1:] for row in cells}


def test_readme_states_each_mixers_paper_defaults_as_its_class_does() -> None:
    table = _readme_table("Paper defaults per mixer:")
    assert {"linear_attn", "mamba2", "gla", "deltanet", "gdn", "kda", "longhorn"} <= set(table) <= set(LINEAR)
    for name in table:
        d = _defaults(name)
        gate = "none" if d["output_gate"] == "none" else f"{d['output_gate']}, {d['output_gate_rank']}"
        on = {True: "on", False: "off"}
        expected = [on[d["use_short_conv"]], d["feature_map"], on[d["qk_norm"]], gate]
        assert table[name][:4] == expected, name
