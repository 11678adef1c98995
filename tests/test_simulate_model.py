"""The byte-level GPT workload (naig.model)."""

import math

import pytest
import torch

from naig.errors import UsageError
from naig.simulate.model import GPT, PRESETS, GPTConfig, get_preset, lm_loss

TINY = GPTConfig(layers=1, heads=2, d_model=16, context=8)


def _model(cfg: GPTConfig = TINY, seed: int = 0) -> GPT:
    return GPT(cfg, generator=torch.Generator().manual_seed(seed))


def test_logits_shape() -> None:
    x = torch.randint(0, 256, (3, 8), generator=torch.Generator().manual_seed(1))
    assert _model()(x).shape == (3, 8, 256)


def test_untrained_loss_is_about_ln_256() -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randint(0, 256, (8, 64), generator=gen)
    y = torch.randint(0, 256, (8, 64), generator=gen)
    with torch.no_grad():
        loss = float(lm_loss(_model(PRESETS["gpt-nano"])(x), y))
    assert abs(loss - math.log(256)) < 0.1


def test_causal_future_tokens_do_not_change_past_logits() -> None:
    model = _model()
    x = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(3))
    y = x.clone()
    y[0, 5:] = (y[0, 5:] + 1) % 256
    assert torch.allclose(model(x)[0, :5], model(y)[0, :5], atol=1e-6)
    assert not torch.allclose(model(x)[0, 5:], model(y)[0, 5:])


def test_tied_embeddings_and_gpt2_init() -> None:
    model = _model(PRESETS["gpt-nano"])
    names = [n for n, _ in model.named_parameters()]
    assert "wte.weight" in names and not any("head" in n for n in names)
    assert abs(float(model.wte.weight.detach().std()) - 0.02) < 0.002
    assert all(float(p.detach().abs().max()) == 0 for n, p in model.named_parameters()
               if n.endswith("bias"))


def test_seeded_init_is_reproducible() -> None:
    a, b, c = _model(seed=5), _model(seed=5), _model(seed=6)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.wte.weight, c.wte.weight)


def test_presets_and_gpt2_small_parameter_count() -> None:
    cfg = get_preset("gpt2-124m")
    assert (cfg.layers, cfg.heads, cfg.d_model, cfg.context) == (12, 12, 768, 1024)
    d = cfg.d_model
    per_layer = 4 * d * d + 4 * d + 2 * 4 * d * d + 4 * d + d + 4 * d  # attn, mlp, 2 LayerNorms
    expected = 256 * d + 1024 * d + 12 * per_layer + 2 * d
    with torch.device("meta"):
        model = GPT(cfg)
    assert sum(p.numel() for p in model.parameters()) == expected == 86_039_040


def test_unknown_preset_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="model='gpt-9': unknown preset.*gpt-nano"):
        get_preset("gpt-9")
