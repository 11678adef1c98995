"""The simulated engines' session: one workload in this process, each rule's run on its engine."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from naig.simulate.engines.registry import buffer_rows, start
from naig.simulate.parallel import resolve_jobs
from naig.simulate.runs import RunContext, StepEvent, drive, make_context
from naig.simulate.workload import Workload

if TYPE_CHECKING:
    from naig.simulate.config import SimulateConfig
    from naig.simulate.results import RunResult

__all__ = ["SimulatedSession"]


class SimulatedSession:
    """The simulated engines in this process: one workload, each rule on its engine."""

    def __init__(self, config: SimulateConfig) -> None:
        self.config, self.workload = config, Workload(config.workload)
        rows, option = buffer_rows(config)
        self.jobs = resolve_jobs(config, config.seeds * len(config.strategies) * len(config.lr),
                                 self.workload.device.type)  # each process side by side holds its own
        value = getattr(config.setting, "compute" if option == "arrivals" else option, None)
        self.workload.check_memory(rows * self.jobs, option, value)  # before any run: refused, not attempted

    def run(self, rule: str, seed: int, lr: float, ctx: RunContext) -> RunResult:
        """Start the rule's run on its engine (``engines.select``) and drive it."""
        return drive(self.config, self.workload, start(self.config, self.workload, rule, seed, lr), ctx)

    def context(self, seed: int, progress: Callable[[StepEvent], None] | None) -> RunContext:
        """The seed's evaluation batches, θ_0's loss and callbacks (``runs.make_context``)."""
        return make_context(self.config, self.workload, seed, progress)

    def partial(self) -> RunResult | None:
        """A simulated run interrupted mid-way is not kept."""
        return None

    def block(self) -> dict[str, Any] | None:
        """Nothing beyond the runs."""
        return None

    def __enter__(self) -> SimulatedSession:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
