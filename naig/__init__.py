"""naig — audit gradient compatibility in asynchronous and distributed training.

Worker gradients (or checkpoints) are sketched into the 14-dimensional Lie
algebra g2, scored by the rank-4 Fano–Fisher metric Ψ against a reference, and
weighted by Gibbs weights π_k before a standard optimizer step.

The math core is numpy-only; torch is imported lazily by the modules that need
it (``naig.io``, ``naig.router``, ``naig.simulate``), so ``import naig`` is cheap.

Layout: the math (``octonion``, ``g2``, ``metric``, ``energy``, ``gibbs``, ``spectrum``;
numpy only), ``sketch`` (reference, numpy, C and torch bodies of one sketch),
``audit`` (streaming file audit), ``simulate`` (training with stale workers),
``router`` (routing in your own loop), ``io`` and ``errors``. docs/design.md states
the mathematics and the protocols, with their sources.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "fano_fisher_metric",
    "exact_charpoly",
    "energy",
    "relative_friction",
    "gibbs_weights",
    "resolve_beta",
    "effective_workers",
    "combine",
    "sketch_state_dict",
    "certify_spectrum",
    "Router",
]

_LAZY = {
    "fano_fisher_metric": "naig.metric",
    "exact_charpoly": "naig.metric",
    "energy": "naig.energy",
    "relative_friction": "naig.energy",
    "gibbs_weights": "naig.gibbs",
    "resolve_beta": "naig.gibbs",
    "effective_workers": "naig.gibbs",
    "combine": "naig.gibbs",
    "sketch_state_dict": "naig.sketch",
    "certify_spectrum": "naig.spectrum",
    "Router": "naig.router",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'naig' has no attribute {name!r}")
