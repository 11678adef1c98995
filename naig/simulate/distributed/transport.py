"""The parameter server's messages, on one process group per server–worker pair (docs/design.md §14).

Every message is a fixed-size tensor sent with ``torch.distributed.send`` / ``recv`` on
the pair's own group, so both sides always know what comes next:

    server → worker   command (4 float64): [code, version, seed, run]
                      then, for ``PARAMS``, θ (n float32)
    worker → server   head (4 float64): [pulled version, minibatch loss, compute seconds, run]
                      then [sketch (14 float32, 56 B) | gradient (n float32)] in one message,
                      or, sketch-first, the sketch alone and the gradient after a ``FETCH``

Codes: ``PARAMS`` (compute a gradient on this θ), ``FETCH`` (send the gradient of the
sketch just sent), ``STOP`` (exit), ``PING`` (the server is busy, e.g. evaluating; keep
waiting; sent so that an idle worker's receive never reaches its timeout).

Example:
    >>> Command.decode(Command(CODE_PARAMS, version=7, seed=1, run=2).encode())
    Command(code=0, version=7, seed=1, run=2)
    >>> HEAD_BYTES, COMMAND_BYTES
    (32, 32)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from naig.sketch.core import SKETCH_DIM

__all__ = ["CODE_PARAMS", "CODE_FETCH", "CODE_STOP", "CODE_PING", "COMMAND_BYTES", "HEAD_BYTES",
           "SKETCH_WIRE_BYTES", "Command", "Head", "Link", "pair_groups"]

CODE_PARAMS, CODE_FETCH, CODE_STOP, CODE_PING = 0, 1, 2, 3
_FIELDS = 4
COMMAND_BYTES = HEAD_BYTES = _FIELDS * 8  # four float64
SKETCH_WIRE_BYTES = SKETCH_DIM * 4  # the 14-float sketch in float32: 56 B


@dataclass(frozen=True)
class Command:
    """A server → worker command (a version, seed and run id are exact in float64 below 2^53)."""

    code: int
    version: int = 0
    seed: int = 0
    run: int = 0

    def encode(self) -> Tensor:
        """(4,) float64."""
        return torch.tensor([self.code, self.version, self.seed, self.run], dtype=torch.float64)

    @classmethod
    def decode(cls, t: Tensor) -> Command:
        """From the (4,) float64 message."""
        code, version, seed, run = (int(v) for v in t.tolist())
        return cls(code, version, seed, run)


@dataclass(frozen=True)
class Head:
    """The first part of a worker's push: what the gradient was computed on, and how."""

    version: int  # the parameter version pulled
    loss: float  # minibatch loss at that version
    compute: float  # seconds the job took (slowdown included)
    run: int  # run id the job belongs to

    def encode(self) -> Tensor:
        """(4,) float64."""
        return torch.tensor([self.version, self.loss, self.compute, self.run], dtype=torch.float64)

    @classmethod
    def decode(cls, t: Tensor) -> Head:
        """From the (4,) float64 message."""
        version, loss, compute, run = t.tolist()
        return cls(int(version), loss, compute, int(run))


class Link:
    """The server–worker pair's process group, with the payload bytes it carried.

    Args:
        group: the pair's process group (its own gloo context: a dead peer breaks only it).
        peer: the other side's global rank.

    Attributes:
        sent, received: payload bytes (tensor bytes; transport framing not counted).
    """

    def __init__(self, group: dist.ProcessGroup, peer: int) -> None:
        self.group, self.peer = group, peer
        self.sent = self.received = 0

    def send(self, t: Tensor) -> None:
        """Blocking send of ``t`` to the peer (raises on a broken link or at the group timeout)."""
        dist.send(t, dst=self.peer, group=self.group)
        self.sent += t.numel() * t.element_size()

    def recv(self, t: Tensor) -> None:
        """Blocking receive into ``t`` from the peer (raises on a broken link or at the timeout)."""
        dist.recv(t, src=self.peer, group=self.group)
        self.received += t.numel() * t.element_size()


def pair_groups(rank: int, world: int, timeout: float) -> dict[int, dist.ProcessGroup]:
    """One process group {0, k} per worker rank k; this rank's groups by worker rank.

    Every rank creates every group, in the same order (torch requires it); a rank keeps
    the groups it belongs to: the server all of them, worker k its own.
    """
    groups = {}
    for k in range(1, world):
        group = dist.new_group([0, k], timeout=timedelta(seconds=timeout))
        if rank in (0, k):
            groups[k] = group
    return groups
