"""A byte-level GPT, readable in one file (nanoGPT style), the default ``naig simulate`` workload.

Tokens are raw bytes (vocabulary 256). The model is token + learned position
embeddings, a stack of pre-LN ``torch.nn.TransformerEncoderLayer`` blocks
(GELU, dropout 0, causal mask), a final LayerNorm and an output projection tied
to the token embedding. GPT-2 initialisation (every weight matrix N(0, 0.02),
biases 0, LayerNorm weight 1) makes the logits nearly zero at step 0, so the
untrained loss is ≈ ln 256 ≈ 5.545 nats/byte.

Example:
    >>> import torch
    >>> cfg = PRESETS["gpt-nano"]
    >>> model = GPT(cfg, generator=torch.Generator().manual_seed(0))
    >>> x = torch.zeros(2, cfg.context, dtype=torch.long)
    >>> model(x).shape == (2, cfg.context, 256)
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from naig.errors import UsageError

__all__ = ["GPTConfig", "GPT", "PRESETS", "get_preset", "lm_loss"]


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a byte-level GPT."""

    layers: int = 2  # number of TransformerEncoderLayer blocks
    heads: int = 4  # attention heads per block (d_model % heads == 0)
    d_model: int = 64  # residual stream width
    context: int = 64  # maximum sequence length (learned positions)
    vocab: int = 256  # byte-level vocabulary
    mlp_ratio: int = 4  # feed-forward width = mlp_ratio * d_model
    init_std: float = 0.02  # GPT-2 initialisation N(0, init_std)


PRESETS: dict[str, GPTConfig] = {
    "gpt-nano": GPTConfig(layers=2, heads=4, d_model=64, context=64),
    "gpt-micro": GPTConfig(layers=4, heads=4, d_model=128, context=128),
    "gpt2-124m": GPTConfig(layers=12, heads=12, d_model=768, context=1024),
}
"""Named model shapes: ``gpt-nano`` (CPU, seconds), ``gpt-micro``, ``gpt2-124m`` (GPU)."""


def get_preset(name: str) -> GPTConfig:
    """The ``GPTConfig`` of a preset name.

    Raises:
        UsageError: for an unknown name (the message lists the presets).
    """
    if name not in PRESETS:
        raise UsageError(f"unknown preset; use one of {', '.join(PRESETS)}", field="model", value=name)
    return PRESETS[name]


class GPT(nn.Module):
    """Byte-level decoder-only transformer built from ``nn.TransformerEncoderLayer``.

    Args:
        config: the model shape.
        generator: seeded ``torch.Generator`` for the initialisation (on the CPU).
    """

    def __init__(self, config: GPTConfig, generator: torch.Generator | None = None) -> None:
        super().__init__()
        c = config
        self.config = c
        self.wte = nn.Embedding(c.vocab, c.d_model)  # (V, d), tied with the output head
        self.wpe = nn.Embedding(c.context, c.d_model)  # (T_max, d)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                c.d_model, c.heads, c.mlp_ratio * c.d_model, dropout=0.0,
                activation="gelu", batch_first=True, norm_first=True,
            )
            for _ in range(c.layers)
        )
        self.ln_f = nn.LayerNorm(c.d_model)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(c.context),
                             persistent=False)  # (T_max, T_max) additive causal mask
        self._init(generator)

    @torch.no_grad()
    def _init(self, generator: torch.Generator | None) -> None:
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=generator) * self.config.init_std)
            elif name.endswith("weight"):
                p.fill_(1.0)  # LayerNorm gains
            else:
                p.zero_()  # biases

    def forward(self, idx: Tensor) -> Tensor:
        """Logits for a batch of byte sequences.

        Args:
            idx: (B, T) int64 bytes, T ≤ context.

        Returns:
            (B, T, 256) float logits.
        """
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe.weight[:t]  # (B, T, d)
        mask = self.mask[:t, :t]
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return F.linear(self.ln_f(x), self.wte.weight)  # (B, T, V), tied head


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-byte cross-entropy in nats/byte; logits (B, T, V), targets (B, T) → scalar."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
