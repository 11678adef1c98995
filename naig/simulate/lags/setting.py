"""The fixed-lags setting: worker k's gradient is always τ_k server steps old (docs/design.md §8).

Example:
    >>> LagsSetting(lags=(0, 10)).workers
    2
    >>> LagsSetting(lags=(0, -1))
    Traceback (most recent call last):
    ...
    naig.errors.UsageError: lags=(0, -1): use non-negative ints, one per worker, e.g. 0,10,20,35
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from naig.choices import LOCAL_METHODS
from naig.simulate.checks import as_tuple, check, check_writable_dir, is_int
from naig.simulate.options import DEFAULT_LAGS, option

__all__ = ["LagsSetting", "MAX_LAG", "DEFAULT_LAGS", "grads_folder"]

MAX_LAG = 2**31 - 1  # any lag >= steps already means "always θ_0"; beyond this: a typo


@dataclass(frozen=True)
class LagsSetting:
    """Fixed lags: worker k's gradient is always τ_k server steps old (docs/design.md §8).

    Attributes:
        lags: τ_k of each worker, in server steps; K = their number.
        warmup_theta0: the old protocol: every worker from step 0, early gradients at θ_0.
        save_grads: directory for gradient files (None: save nothing).
        save_at: server steps t at which to save gradients (needs ``save_grads``).
    """

    NAME: ClassVar[str] = "lags"
    ENGINE: ClassVar[str] = "simulated"
    asynchronous: ClassVar[bool] = False
    lags: tuple[int, ...] = option("lags.lags")
    warmup_theta0: bool = option("lags.warmup_theta0")
    save_grads: str | None = option("lags.save_grads")
    save_at: tuple[int, ...] = option("lags.save_at")

    def __post_init__(self) -> None:
        object.__setattr__(self, "lags", as_tuple(self.lags, "lags", "0, 10, 20, 35"))
        object.__setattr__(self, "save_at", as_tuple(self.save_at, "save_at", "50, 100"))
        check(isinstance(self.warmup_theta0, bool), "warmup_theta0", self.warmup_theta0, "use true or false")
        check(len(self.lags) > 0 and all(is_int(t) and t >= 0 for t in self.lags), "lags", self.lags,
              "use non-negative ints, one per worker, e.g. 0,10,20,35")
        check(all(t <= MAX_LAG for t in self.lags), "lags", self.lags,
              f"a lag must be at most {MAX_LAG:,}; any lag >= `steps` already means the worker never joins "
              "(with `warmup_theta0`: every gradient it sends is taken at θ_0)")
        self._check_saving()

    @property
    def workers(self) -> int:
        """K, the number of lags."""
        return len(self.lags)

    @property
    def window(self) -> int:
        """Fixed lags combine the K joined workers of a step: no window (1)."""
        return 1

    def describe(self) -> str:
        """One phrase for headers and plot titles."""
        return f"lags {','.join(map(str, self.lags))}" + (" (warm-up at θ_0)" if self.warmup_theta0 else "")

    def check_rules(self, strategies: tuple[str, ...], steps: int) -> None:
        """No local-update method (they run on the arrivals clock); ``save_at`` in 0..steps−1; at least
        one worker joins within ``steps`` (else no update is ever made)."""
        check(self.warmup_theta0 or min(self.lags) < steps, "lags", self.lags,
              f"no worker joins within `steps` ({steps}): a lag-τ worker sends its first gradient at step τ; "
              "use smaller lags, more `steps`, or `warmup_theta0`")
        local = [n for n in strategies if n in LOCAL_METHODS]
        check(not local, "strategies", ",".join(local), "runs on the simulated clock and needs `arrivals` "
              "(compute seconds per inner step, e.g. exp:1,exp:1,exp:2,exp:4)")
        check(all(0 <= s < steps for s in self.save_at), "save_at", self.save_at,
              f"steps must lie in 0..{steps - 1} (`steps` is {steps})")

    def check_outputs(self, strategies: tuple[str, ...], seeds: int, lrs: tuple[float, ...]) -> None:
        """Refuse, before training, saving that would overwrite or mix gradient files: several ``lr``
        (the runs of one rule and seed would write the same folders) or a run's step folder that
        already holds files (a new run of fewer workers would leave an old ``worker7.safetensors``
        beside its own, and the audit would read it)."""
        if self.save_grads is None:
            return
        check(len(lrs) == 1, "save_grads", self.save_grads, "with several `lr` the runs of one rule and seed "
              "would write the same folders (RULE-seedK-stepT); give one `lr`")
        root = Path(self.save_grads)
        if not root.is_dir():
            return
        ours = {grads_folder(rule, 0, t): rule for rule in strategies for t in self.save_at}  # seed 0's
        for entry in root.iterdir():  # once (not a look-up per run: there may be millions)
            rule, _, rest = entry.name.partition("-seed")
            seed, _, step = rest.partition("-step")
            mine = seed.isdigit() and int(seed) < seeds and ours.get(f"{rule}-seed0-step{step}") == rule
            check(not mine or _empty_folder(entry), "save_grads", self.save_grads,
                  f"{entry.name} there holds files of an earlier run (or is a file or a link), which this "
                  "one would overwrite or leave beside its own; remove it or pass another folder")

    def _check_saving(self) -> None:
        if self.save_grads is None:
            check(not self.save_at, "save_at", self.save_at,
                  "needs `save_grads` (the directory to write the gradient files to)")
            return
        check(self.save_grads.strip() != "", "save_grads", self.save_grads,
              "give a directory to write gradient files to, e.g. runs/grads")
        check(bool(self.save_at), "save_grads", self.save_grads,
              "needs `save_at` (the server steps to save at, e.g. 50)")
        check_writable_dir(self.save_grads, "save_grads")

    def notes(self, steps: int) -> tuple[str, ...]:
        """One-line notes: a worker whose lag is at least ``steps`` never joins."""
        late = [w for w, t in enumerate(self.lags) if t >= steps and not self.warmup_theta0]
        if not late:
            return ()
        return (f"worker(s) {','.join(map(str, late))} never join: their `lags` reach `steps` ({steps}); "
                "a lag-τ "
                "worker sends its first gradient at step τ (`warmup_theta0` starts them at θ_0)",)


def _empty_folder(p: Path) -> bool:
    """A real folder (not a link to one) with nothing in it: the rename of a step's folder may replace it."""
    return p.is_dir() and not p.is_symlink() and not any(p.iterdir())


def grads_folder(rule: str, seed: int, step: int) -> str:
    """The folder (under ``save_grads``) of one run's gradient files at server step ``step``."""
    return f"{rule}-seed{seed}-step{step}"
