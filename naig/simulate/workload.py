"""What every run of a simulation computes with: model, data, loss, gradients, evaluation (docs/design.md §8).

A ``Workload`` is built once per simulation (and once in every process of the distributed
engine, from the same config): the device, the text, the model's parameter layout and the
sketch. Parameters live in one flat vector (n,); a worker evaluates the model functionally
(``torch.func.functional_call``) at a view of any flat vector, so gradients land in
preallocated rows. All randomness comes from explicit ``torch.Generator`` seeds, one
function each (``stream_seed`` and the module constants): every engine gives worker k of
seed s the same minibatch stream.

A ``Workload`` is built from its own small config (``WorkloadConfig``: model, text, batch,
device, sketch seed, evaluation batches); ``SimulateConfig.workload`` is the simulation's, and
``naig detect`` builds one directly. It knows nothing of settings, rules or budgets.

Example:
    >>> w = Workload(WorkloadConfig(data_bytes=50_000, eval_batches=1))
    >>> theta = w.init_params(seed=0)
    >>> g = torch.empty_like(theta)
    >>> loss = w.worker_grad(theta, w.generator(stream_seed(0, worker=1)), g)
    >>> theta.shape == g.shape, bool(torch.isfinite(g).all())
    (True, True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.func import functional_call

from naig.choices import DEVICES
from naig.errors import UsageError
from naig.simulate.data import ByteData, load_bytes
from naig.simulate.model import GPT, get_preset, lm_loss
from naig.simulate.options import doc_of
from naig.sketch.torch_sketch import TorchSketch

if TYPE_CHECKING:
    from naig.simulate.config import SimulateConfig

__all__ = ["Workload", "WorkloadConfig", "resolve_device", "Batches", "OPTIMIZERS", "make_optimizer",
           "stream_seed", "fault_seed", "VAL_STREAM", "TEST_STREAM", "FAULT_STREAM"]

Batches = list[tuple[Tensor, Tensor]]
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {  # torch defaults besides what is passed
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
}
_SEED_STRIDE = 1_000_003  # seed s owns the stream seeds 1_000_003·s + offset
_WORKER_STRIDE = 7_919  # worker k's minibatch stream: offset 7_919·(k + 1)
VAL_STREAM = 99_991  # offset of the validation batches of a seed
TEST_STREAM = 104_729  # offset of the test batches (learning-rate tuning)
FAULT_STREAM = 31_337  # offset of the random draws of injected faults (noise, random)


def stream_seed(seed: int, worker: int) -> int:
    """The seed of worker ``worker``'s minibatch stream in run seed ``seed`` (every engine's).

    Example:
        >>> stream_seed(0, 0), stream_seed(1, 0)
        (7919, 1007922)
    """
    return _SEED_STRIDE * seed + _WORKER_STRIDE * (worker + 1)


def fault_seed(seed: int, worker: int | None = None) -> int:
    """The seed of the injected faults' random draws in run seed ``seed``: one stream for the
    server of a simulated engine (``worker`` None), one per worker process (distributed)."""
    own = 0 if worker is None else _WORKER_STRIDE * (worker + 1)
    return _SEED_STRIDE * seed + FAULT_STREAM + own


def make_optimizer(kind: str, params: Iterable[nn.Parameter], lr: float, **options: object
                   ) -> torch.optim.Optimizer:
    """``torch.optim`` SGD, Adam or AdamW over ``params`` at ``lr``; torch defaults otherwise.

    Args:
        kind: a key of ``OPTIMIZERS``.
        params: the parameters.
        lr: the learning rate.
        **options: passed on (e.g. ``momentum``, ``nesterov``, ``betas``).
    """
    return OPTIMIZERS[kind](list(params), lr=lr, **options)


def resolve_device(device: str) -> str:
    """``cpu``, ``cuda`` or ``auto`` (cuda when available) as the device name used.

    Raises:
        UsageError: for an unknown name or ``cuda`` without a GPU.
    """
    if device not in DEVICES:
        raise UsageError("use cpu, cuda or auto", field="device", value=device)
    if device == "cpu":
        return device
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        raise UsageError("no CUDA GPU is available; use cpu or auto", field="device", value=device)
    return device


@dataclass(frozen=True)
class WorkloadConfig:
    """What a ``Workload`` is built from (``SimulateConfig.workload``; checked there, or by the caller).

    Attributes:
        model: a preset of ``naig.simulate.model.PRESETS``.
        data: a text file (None: the standard library's ``.py`` files).
        data_bytes: the first this many bytes of the text.
        batch_size: B, sequences per worker minibatch (evaluation batches: 2B).
        device: ``cpu``, ``cuda`` or ``auto``.
        sketch_seed: the seed of the sketch (docs/design.md §5).
        eval_batches: evaluation batches per split and seed.
        test_split: hold out a test split (80/10/10) besides validation.
    """

    model: str = doc_of("model").default  # the defaults are the config tree's (naig.simulate.options)
    data: str | None = doc_of("data").default
    data_bytes: int = doc_of("data_bytes").default
    batch_size: int = doc_of("batch_size").default
    device: str = doc_of("device").default
    sketch_seed: int = doc_of("sketch_seed").default
    eval_batches: int = doc_of("eval_batches").default
    test_split: bool = False


class Workload:
    """What every run of a simulation shares, built once: device, data, model layout, sketch.

    Args:
        config: its ``WorkloadConfig`` (a ``SimulateConfig`` stands for its ``.workload``).

    Raises:
        UsageError: ``device`` cuda without a GPU.
        DataError: if the corpus is missing or too small.
    """

    def __init__(self, config: WorkloadConfig | SimulateConfig) -> None:
        config = config if isinstance(config, WorkloadConfig) else config.workload
        self.config = config
        self.device = torch.device(resolve_device(config.device))
        gcfg = get_preset(config.model)
        raw = load_bytes(config.data, config.data_bytes)
        self.data = ByteData.from_bytes(raw, self.device, test=config.test_split)
        self.data.check(gcfg.context)
        self.model = GPT(gcfg, generator=torch.Generator().manual_seed(0)).to(self.device)
        named = list(self.model.named_parameters())  # the layout only; values come per seed
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.sizes = [p.numel() for _, p in named]
        self.sketch = TorchSketch.build(list(zip(self.names, self.sizes, strict=True)),
                                        config.sketch_seed, self.device)

    @property
    def n_params(self) -> int:
        """n, the number of scalar parameters."""
        return sum(self.sizes)

    def batch_bytes(self) -> int:
        """Memory of the minibatches and the activations of one step, bytes (an estimate).

        The evaluation batches of a seed (``eval_batches`` × 2 of (2B, T) int64, twice with a test
        split), and one training step on B sequences of T tokens: per layer and token
        2h(34 + 5aT/h) bytes of float32 activations kept for the backward pass (Korthikanti et al.
        2022, "Reducing Activation Recomputation in Large Transformer Models", eq. 1, at 4-byte
        elements), plus 3 copies of the (B, T, vocab) logits.
        """
        c, g = self.config, self.model.config
        batches = self._eval_bytes()
        tokens = c.batch_size * g.context
        per_layer = 2 * g.d_model * (34 + 5 * g.heads * g.context / g.d_model)
        return int(batches + tokens * (g.layers * per_layer + 3 * 4 * g.vocab))

    def _eval_bytes(self) -> int:
        """Bytes of a seed's evaluation batches: ``eval_batches`` × 2 of (2B, T) int64 (× 2: a test split)."""
        c, g = self.config, self.model.config
        return c.eval_batches * 2 * (2 * c.batch_size * g.context) * 8 * (2 if c.test_split else 1)

    def check_memory(self, rows: int, option: str, value: object = None) -> None:
        """Refuse, before any run, what would not fit: ``rows`` parameter-sized buffers plus the batches.

        Args:
            rows: (n,)-sized float32 buffers the engine keeps (gradients, versions, replicas, states),
                on the workload's device (host memory, or the GPU's free memory).
            option: the option that sets ``rows`` (named when the buffers dominate).
            value: that option's value (named with it).

        Raises:
            UsageError: naming ``batch_size``, ``eval_batches`` or ``option`` (the largest part) and
                the GiB it would take (as ``naig staleness`` refuses a run that would not fit).
        """
        from naig.arrivals.engine import available_bytes

        buffers, batches = 4 * rows * self.n_params, self.batch_bytes()
        free = torch.cuda.mem_get_info(self.device)[0] if self.device.type == "cuda" else available_bytes()
        if free is None or buffers + batches <= free:
            return
        name = option if buffers > batches else "eval_batches" if 2 * self._eval_bytes() >= batches else \
            "batch_size"  # the largest part: the buffers, the evaluation batches, or a step's batch
        need = (buffers + batches) / 2**30
        raise UsageError(f"the run needs about {need:,.1f} GiB ({rows:,} parameter-sized buffers, "
                         f"{batches / 2**30:,.1f} GiB of batches and activations), more than the "
                         f"{free / 2**30:,.1f} GiB available; use a smaller `{name}`", field=name,
                         value=getattr(self.config, name) if name != option else value)

    def params(self, flat: Tensor) -> dict[str, Tensor]:
        """{name: view of ``flat``} in the model's parameter shapes."""
        views = flat.split(self.sizes)
        return {n: v.view(s) for n, v, s in zip(self.names, views, self.shapes, strict=True)}

    def loss(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """Next-byte loss of the model with parameters ``flat`` (n,) on one batch (B, T)."""
        return lm_loss(functional_call(self.model, self.params(flat), (x,)), y)

    def init_params(self, seed: int) -> Tensor:
        """θ_0 for a seed: GPT-2 init from a CPU generator seeded with ``seed``, flat (n,)."""
        model = GPT(self.model.config, generator=torch.Generator().manual_seed(seed))
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).to(self.device)

    def generator(self, seed: int) -> torch.Generator:
        """A generator on the workload's device seeded with ``seed``."""
        return torch.Generator(device=self.device).manual_seed(seed)

    def worker_streams(self, seed: int, workers: int) -> list[torch.Generator]:
        """The minibatch streams of workers 0..K−1 in run seed ``seed`` (``stream_seed``)."""
        return [self.generator(stream_seed(seed, w)) for w in range(workers)]

    def fault_generator(self, seed: int) -> torch.Generator:
        """The generator of the injected faults' random draws in run seed ``seed``."""
        return self.generator(fault_seed(seed))

    def val_batches(self, seed: int) -> Batches:
        """Fixed validation batches of a seed (shared by every rule)."""
        return self._batches("val", _SEED_STRIDE * seed + VAL_STREAM)

    def test_batches(self, seed: int) -> Batches:
        """Fixed test batches of a seed (only with a test split: learning-rate tuning)."""
        return self._batches("test", _SEED_STRIDE * seed + TEST_STREAM)

    def _batches(self, split: str, stream: int) -> Batches:
        gen, c, ctx = self.generator(stream), self.config, self.model.config.context
        return [self.data.batch(split, 2 * c.batch_size, ctx, gen) for _ in range(c.eval_batches)]

    @torch.no_grad()
    def evaluate(self, flat: Tensor, batches: Batches) -> float:
        """Mean loss (nats/byte) of parameters ``flat`` over ``batches``."""
        return float(torch.stack([self.loss(flat, x, y) for x, y in batches]).mean())

    def worker_grad(self, theta: Tensor, gen: torch.Generator, out: Tensor) -> Tensor:
        """Write ∇L(θ; next batch of the stream ``gen``) into ``out`` (n,).

        Returns:
            The minibatch loss L (a detached 0-d tensor on the device).
        """
        flat = theta.detach().clone().requires_grad_(True)
        x, y = self.data.batch("train", self.config.batch_size, self.model.config.context, gen)
        loss = self.loss(flat, x, y)
        (grad,) = torch.autograd.grad(loss, flat)
        out.copy_(grad)
        return loss.detach()
