"""Audit worker gradients or checkpoints against a reference (docs/design.md §6, §7).

For a reference x_R and workers x_1..x_K (safetensors files with the same
tensors), each file is streamed once, chunk by chunk, through the sketch S
(docs/design.md §5) and exact float64 inner products. Per worker:

    d_k = S x_k − S x_R,   E_k = d_kᵀ Ψ_ℓ d_k,   ρ_k = E_k / ((8/3)‖d_k‖²)
    cos_k = ⟨x_k, x_R⟩ / (‖x_k‖ ‖x_R‖),   ‖Δ_k‖ = ‖x_k − x_R‖
    π_k = exp(−β E_k) / Σ_j exp(−β E_j)

and a verdict: ``non-finite`` (NaN/Inf anywhere; π_k = 0), ``frozen``
(π_k < 0.01/K) or ``integrated``.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from naig.audit.correlation import lag_correlation
from naig.audit.inputs import INDEX_SUFFIX, expand_inputs, find_index, inspect_input
from naig.audit.stream import (
    FileInfo,
    Piece,
    RawReader,
    TensorData,
    TensorInfo,
    batches,
    locate,
    plan_tensors,
)
from naig.energy import energy, energy_spread, relative_friction
from naig.errors import DataError, UsageError
from naig.gibbs import effective_workers, frozen_mask, gibbs_weights, parse_beta, resolve_beta
from naig.io import METADATA_KEYS
from naig.metric import DEFAULT_LINE, fano_fisher_metric, parse_line
from naig.sketch.core import SKETCH_DIM, check_seed, tensor_key
from naig.sketch.kernels import ITEMSIZE, STATS, accumulate_files

__all__ = ["AuditConfig", "FileScore", "AuditResult", "run_audit", "DEFAULT_CHUNK", "MAX_SKETCHES"]

SCHEMA_VERSION = 2  # of the audit JSON document (1: before sharded inputs, spread and correlations)
DEFAULT_CHUNK = 1 << 22  # scalars per batch (16 MiB of float32)
_INT = re.compile(r"-?[0-9]{1,18}")  # metadata shown as int (ASCII digits, bounded length)
_SCORES = ("cos", "delta_norm", "energy", "energy_spread", "energy_std", "friction", "pi", "verdict",
           "sketch_ratio", "nonfinite_tensor", "drift")  # FileScore fields in row order
_TASK_SCALARS = 1 << 16  # a thread's task: whole pieces of at least this many scalars (the last aside)
_PARTIAL_BUDGET = 1 << 18  # per-piece sums (of STATS floats each) one batch may hold: 38 MB


MAX_SKETCHES = 1024  # sketch seeds of one audit: each is a pass over every scalar and STATS floats per file


@dataclass(frozen=True)
class AuditConfig:
    """Options of an audit run (``naig audit``), validated on construction.

    Raises:
        UsageError: naming the field (``beta``, ``seed``, ``line``, ``keys``,
            ``sketches``, ``chunk`` or ``threads``) and the fix.
    """

    beta: float | str = "auto"  # inverse temperature β ≥ 0, or "auto" (1 / median positive E)
    seed: int = 0  # sketch seed (uint64); sketch r uses seed + r
    line: tuple[int, int, int] | str = DEFAULT_LINE  # oriented Fano line ℓ of Ψ_ℓ ("1,2,4" too)
    keys: str | None = None  # regex: audit only tensor names it matches
    intersect: bool = False  # use common tensors instead of failing on a mismatch
    sketches: int = 1  # R independent sketch seeds; E_k reported as mean ± std
    chunk: int = DEFAULT_CHUNK  # scalars per streamed batch: bounds memory
    recursive: bool = False  # folders: also walk sub-folders (a folder with an index is one checkpoint)
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)  # files scored in parallel

    def __post_init__(self) -> None:
        object.__setattr__(self, "beta", parse_beta(self.beta))
        object.__setattr__(self, "line", parse_line(self.line))
        check_seed(self.seed)
        if isinstance(self.sketches, bool) or not isinstance(self.sketches, int) or not (
                1 <= self.sketches <= MAX_SKETCHES):
            raise UsageError(f"must be an int in [1, {MAX_SKETCHES}], e.g. 8 (the spread of E falls as "
                             f"1/√R: {MAX_SKETCHES} sketches divide it by 32)", field="sketches",
                             value=self.sketches)
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1:
            raise UsageError("must be a positive number of scalars", field="chunk", value=self.chunk)
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1:
            raise UsageError("must be an int >= 1, e.g. 2", field="threads", value=self.threads)


@dataclass(frozen=True)
class FileScore:
    """The audit of one worker file against the reference."""

    path: Path
    metadata: dict[str, str]  # safetensors metadata (lag, step, worker, ...)
    cos: float | None  # cosine similarity to the reference; None when a norm is 0
    delta_norm: float  # ‖x_k − x_R‖ in full dimension
    energy: float  # E_k (mean over sketches); NaN if non-finite
    energy_spread: float | None  # analytic std of E_k over sketch seeds (docs/design.md §5.1)
    energy_std: float | None  # measured std of E_k over the R sketches (None for one sketch)
    friction: float  # ρ_k ∈ [0, 1]
    pi: float  # Gibbs weight π_k
    verdict: str  # "integrated" | "frozen" | "non-finite"
    sketch_ratio: float | None  # ‖d_k‖² / ‖x_k − x_R‖² (None when Δ = 0)
    drift: list[float]  # d_k (first sketch), 14 g2 coordinates
    nonfinite_tensor: str | None  # first tensor holding NaN/Inf, if any

    def meta(self, key: str) -> int | str | None:
        """Metadata value ``key`` as int when it is one (``lag``, ``step``, ``worker``)."""
        v = self.metadata.get(key)
        return int(v) if v is not None and _INT.fullmatch(v) else v

    def to_dict(self) -> dict[str, Any]:
        """One JSON/CSV-ready row: file, metadata columns, every score and the drift."""
        row: dict[str, Any] = {"file": str(self.path)}
        row.update({k: self.meta(k) for k in METADATA_KEYS})
        row.update({k: getattr(self, k) for k in _SCORES})
        return row


@dataclass(frozen=True)
class AuditResult:
    """Scores of all worker files plus the run's footer figures."""

    reference: Path
    reference_metadata: dict[str, str]
    files: list[FileScore]
    beta: float  # β used
    k_eff: float  # 1 / Σ π_k²
    n: int  # scalar parameters audited per file
    bytes_read: int  # tensor bytes read, all files
    seconds: float  # wall time of the streaming pass
    skipped: dict[str, int]  # tensors left out, by reason
    config: AuditConfig
    warnings: list[str] = field(default_factory=list)
    lag_correlation: dict[str, Any] | None = None  # Spearman r_s of E and ‖Δ‖ with lag (correlation.py)

    @property
    def compression(self) -> float:
        """Routing-signal compression n / 14."""
        return self.n / SKETCH_DIM

    @property
    def throughput(self) -> float:
        """Bytes read per second."""
        return self.bytes_read / self.seconds if self.seconds > 0 else float("inf")

    def rank_overlaps(self) -> list[tuple[int, int]]:
        """Pairs (i, j), i < j, of files whose intervals [max(E − spread, 0), E + spread] overlap.

        Another sketch seed may swap such a pair in the ranking by E (docs/design.md §5.1);
        an empty list means the ranking is stable at one spread. E ≥ 0 always, hence the
        clamp: a worker equal to the reference (E = 0 ± 0) overlaps no one. Non-finite
        files are left out.
        """
        e = np.array([f.energy for f in self.files], dtype=float)  # (K,)
        s = np.array([np.nan if f.energy_spread is None else f.energy_spread for f in self.files])
        ok = np.isfinite(e) & np.isfinite(s)
        lo, hi = np.maximum(e - s, 0.0), e + s
        close = (lo[:, None] < hi[None, :]) & (lo[None, :] < hi[:, None])  # (K, K)
        i, j = np.nonzero(np.triu(close & ok[:, None] & ok[None, :], 1))
        return list(zip(i.tolist(), j.tolist(), strict=True))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the whole audit (non-finite floats still need → null)."""
        cfg, overlaps = self.config, self.rank_overlaps()
        return {
            "schema_version": SCHEMA_VERSION,
            "reference": str(self.reference),
            "reference_metadata": self.reference_metadata,
            "files": [f.to_dict() for f in self.files],
            "beta": self.beta,
            "beta_option": cfg.beta,
            "k_eff": self.k_eff,
            "n": self.n,
            "compression": self.compression,
            "bytes_read": self.bytes_read,
            "seconds": self.seconds,
            "throughput_bytes_per_s": self.throughput,
            "skipped_tensors": self.skipped,
            "ranking_stable": not overlaps,
            "rank_overlaps": [[str(self.files[i].path), str(self.files[j].path)] for i, j in overlaps],
            "line": list(cfg.line),
            "seed": cfg.seed,
            "sketches": cfg.sketches,
            "warnings": self.warnings,
            "lag_correlation": self.lag_correlation,
        }


def _reference_path(ref: str | os.PathLike[str]) -> Path:
    """The reference: a file, an index, or a folder holding an index (one checkpoint)."""
    p = Path(ref)
    if p.is_dir():
        index = find_index(p)
        if index is None:
            raise UsageError(f"{p}: the reference must be one .safetensors file or one sharded checkpoint "
                             f"(a folder holding a *{INDEX_SUFFIX}), not a folder of files")
        return index
    return p


def _resolve_files(
    ref: str | os.PathLike[str], files: Sequence[str | os.PathLike[str]], recursive: bool
) -> tuple[Path, list[Path], list[str]]:
    ref_path = _reference_path(ref)
    notes, workers, seen = [], [], {_identity(ref_path): ref_path}
    for p in expand_inputs(files, recursive):
        first = seen.setdefault(_identity(p), p)
        if first is ref_path and p is not ref_path:
            notes.append(f"{p}: is the reference itself; skipped as a worker")
        elif first is not p:
            also = "" if str(first) == str(p) else f" (also as {first})"
            notes.append(f"{p}: given twice{also}; audited once")
        else:
            workers.append(p)
    if not workers:
        why = f" ({'; '.join(notes)})" if notes else ""
        raise UsageError(f"no worker files to audit{why}; pass REF followed by one or more other FILEs")
    return ref_path, workers, notes


def _identity(p: Path) -> tuple[int, int] | Path:
    """(device, inode) of an existing file, so symlinks and repeats are recognised."""
    try:
        st = p.stat()
    except OSError:
        return p.absolute()  # missing: inspect_input reports it
    return (st.st_dev, st.st_ino)


@dataclass
class _Accumulators:
    """Running float64 statistics: row 0 is the reference, rows 1..K the workers."""

    stats: np.ndarray  # (K+1, R, STATS)
    bad: list[str | None]  # first non-finite tensor per row
    bytes_read: int = 0


@dataclass
class _Batch:
    """One batch in flight: its pieces, each piece's sums and one future per task."""

    pieces: list[Piece]
    partial: np.ndarray  # (P, K+1, R, STATS): each piece's sums, folded into the totals in order
    futures: list[Future]


def _score_pieces(reader: RawReader, where: list[dict[str, TensorData]], pieces: list[Piece], first: int,
                  seeds: list[int], partial: np.ndarray) -> None:
    """Sums of every file's ``pieces[i]`` into ``partial[first + i]`` (a worker thread).

    Each piece is one kernel call over all the files: its codes are hashed once and the
    reference's bytes read once, whatever the file count (``accumulate_files``). The files
    are opened once per audit and shared by the threads.
    """
    for i, p in enumerate(pieces, first):
        name = p.tensor.name
        rows = [(reader.fd(w[name]), w[name].offset + p.start * ITEMSIZE[w[name].dtype], w[name].dtype)
                for w in where]
        bad = accumulate_files([tensor_key(s, name) + p.start for s in seeds], p.stop - p.start, rows,
                               partial[i])
        if bad >= 0:
            raise reader.short_read(where[bad][name])


def _tasks(pieces: list[Piece]) -> Iterator[tuple[int, int]]:
    """[a, b) ranges of pieces, each of at least ``_TASK_SCALARS`` scalars but the last."""
    a = size = 0
    for b, p in enumerate(pieces, 1):
        size += p.stop - p.start
        if size >= _TASK_SCALARS:
            yield a, b
            a, size = b, 0
    if a < len(pieces):
        yield a, len(pieces)


def _submit(pool: ThreadPoolExecutor, reader: RawReader, pieces: list[Piece], seeds: list[int],
            where: list[dict]) -> _Batch:
    partial = np.zeros((len(pieces), len(where), len(seeds), STATS))
    futures = [pool.submit(_score_pieces, reader, where, pieces[a:b], a, seeds, partial)
               for a, b in _tasks(pieces)]
    return _Batch(pieces, partial, futures)


def _fold(batch: _Batch, acc: _Accumulators, where: list[dict], progress: Callable[[int], None] | None
          ) -> None:
    """Add a batch's per-piece sums to the totals, row by row in piece order (any thread count)."""
    for future in batch.futures:
        future.result()
    for row in range(len(where)):
        before = acc.bytes_read
        for i, p in enumerate(batch.pieces):
            acc.stats[row] += batch.partial[i, row]
            acc.bytes_read += (p.stop - p.start) * ITEMSIZE[where[row][p.tensor.name].dtype]
            if acc.bad[row] is None and not np.isfinite(acc.stats[row, 0, :SKETCH_DIM]).all():
                acc.bad[row] = p.tensor.name  # S x is finite iff x is (its other sums may overflow)
        if progress and row:
            progress(acc.bytes_read - before)


def _limited(groups: Iterator[list[Piece]], per_piece: int) -> Iterator[list[Piece]]:
    """Split batches so their per-piece sums (``per_piece`` rows each) fit ``_PARTIAL_BUDGET``.

    Only the grouping changes: the pieces, and so every sum, stay the same.
    """
    most = max(1, _PARTIAL_BUDGET // per_piece)
    for pieces in groups:
        for i in range(0, len(pieces), most):
            yield pieces[i : i + most]


def _stream_all(
    ref: FileInfo,
    workers: list[FileInfo],
    plan: list[TensorInfo],
    cfg: AuditConfig,
    progress: Callable[[int], None] | None,
) -> _Accumulators:
    """Score every file batch by batch on ``cfg.threads`` threads, each task a run of whole
    pieces over all files.

    The next batch is submitted before the current one is folded, so the threads never wait
    for a batch boundary; the totals are summed in one fixed order whatever the thread count.
    """
    seeds = [cfg.seed + r for r in range(cfg.sketches)]
    where = [locate(f) for f in (ref, *workers)]  # row → {tensor name: where its bytes are}
    acc = _Accumulators(np.zeros((len(where), len(seeds), STATS)), [None] * len(where))
    chunk = max(1, cfg.chunk // cfg.sketches)  # the pieces (and so every sum) depend on chunk and R only
    inflight: deque[_Batch] = deque()
    with RawReader() as reader, ThreadPoolExecutor(cfg.threads, thread_name_prefix="naig-audit") as pool:
        try:
            for pieces in _limited(batches(plan, chunk), len(where) * len(seeds)):
                inflight.append(_submit(pool, reader, pieces, seeds, where))
                if len(inflight) > 1:
                    _fold(inflight.popleft(), acc, where, progress)
            while inflight:
                _fold(inflight.popleft(), acc, where, progress)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        reader.check_unchanged()  # a file rewritten in place would mix two versions
    return acc


def _norm_ratio(num: float, den: float) -> float | None:
    return float(num / den) if den > 0 and np.isfinite(den) else None


def _cosine(dot: float, xx: float, rr: float) -> float | None:
    """⟨x, r⟩ / (‖x‖‖r‖), clamped to [−1, 1] (rounding can exceed it by an ulp); None when a norm is 0."""
    c = _norm_ratio(dot, np.sqrt(xx) * np.sqrt(rr))
    return None if c is None else min(1.0, max(-1.0, c))


def _scores(acc: _Accumulators, workers: list[FileInfo], psi: np.ndarray) -> list[dict]:
    with np.errstate(over="ignore", invalid="ignore"):  # overflow (values beyond ~1e77) gives inf: "—"
        return _scores_of(acc, workers, psi)


def _scores_of(acc: _Accumulators, workers: list[FileInfo], psi: np.ndarray) -> list[dict]:
    ref = acc.stats[0]  # (R, STATS)
    rr = ref[0, SKETCH_DIM + 1]  # ‖x_R‖²
    out = []
    for row, info in enumerate(workers, start=1):
        st = acc.stats[row]  # (R, STATS)
        d = st[:, :SKETCH_DIM] - ref[:, :SKETCH_DIM]  # (R, 14) drifts, one per sketch seed
        finite = acc.bad[row] is None and acc.bad[0] is None  # every value finite (E may still overflow)
        e = energy(d, psi) if finite else np.full(len(d), np.nan)  # (R,)
        dot, xx, dd, d4 = st[0, SKETCH_DIM:]  # may overflow for |values| beyond ~1e77 (float64 files)
        out.append(
            dict(
                path=info.path,
                metadata=info.metadata,
                cos=_cosine(dot, xx, rr) if finite else None,
                delta_norm=float(np.sqrt(dd)),
                energy=float(e.mean()),
                energy_spread=energy_spread(dd, d4, psi, len(e)) if finite and np.isfinite(d4) else None,
                energy_std=float(e.std(ddof=1)) if len(e) > 1 else None,
                friction=float(relative_friction(d, psi).mean()) if finite else float("nan"),
                sketch_ratio=_norm_ratio(float(d[0] @ d[0]), dd) if finite else None,
                drift=d[0].tolist(),
                nonfinite_tensor=acc.bad[row],
            )
        )
    return out


def _check_reference(acc: _Accumulators, ref: Path) -> None:
    if acc.bad[0] is not None:
        raise DataError(
            f"{ref}: the reference holds NaN/Inf values (tensor {acc.bad[0]!r}), so no drift is "
            "defined; fix it or choose another reference"
        )


def _verdicts(rows: list[dict], beta_opt: float | str) -> tuple[np.ndarray, float]:
    e = np.array([r["energy"] for r in rows])  # (K,)
    if not np.isfinite(e).any():
        bad = ", ".join(f"{r['path']} ({r['nonfinite_tensor'] or 'E beyond float64'})" for r in rows)
        raise DataError(f"no file has a finite E (NaN/Inf values, or drifts too large for float64): {bad}; "
                        "fix the gradients upstream")
    beta = resolve_beta(beta_opt, e)
    pi = gibbs_weights(e, beta)
    frozen = frozen_mask(pi)
    for r, p, fz in zip(rows, pi, frozen, strict=True):
        ok = np.isfinite(r["energy"])
        r.update(pi=float(p), verdict="non-finite" if not ok else "frozen" if fz else "integrated")
    return pi, beta


def _lag_correlation(files: list[FileScore], seed: int) -> dict[str, Any] | None:
    """Does E track staleness in these files? (None without ≥ 3 distinct int ``lag`` values.)"""
    lags = [f.meta("lag") for f in files]
    return lag_correlation(lags, [f.energy for f in files], [f.delta_norm for f in files], seed=seed)


def run_audit(
    ref: str | os.PathLike[str],
    files: Sequence[str | os.PathLike[str]],
    config: AuditConfig = AuditConfig(),
    progress: Callable[[int], None] | None = None,
) -> AuditResult:
    """Stream a reference and worker files and score each worker (docs/design.md §6).

    Args:
        ref: reference ``.safetensors`` file (gradient or checkpoint), or a sharded
            checkpoint: its ``*.safetensors.index.json`` or the folder holding it.
        files: worker files, index files or folders: a folder holding a
            ``*.safetensors.index.json`` is one checkpoint; any other folder means every
            ``*.safetensors`` in it, sorted (and in its sub-folders with ``recursive``).
        config: options; see ``AuditConfig``.
        progress: called with the number of bytes read after each file's batch.

    Returns:
        ``AuditResult``; files are never modified.

    Raises:
        UsageError: no worker file, or a ``keys`` regex that matches nothing (the
            other options are checked by ``AuditConfig``).
        DataError: missing, truncated, invalid or pickle files; an incomplete sharded
            checkpoint; a file truncated or changed while it is read; mismatched tensors;
            every file non-finite; tensors that hold no values at all. Each message is one line
            naming the file.

    Example:
        >>> import tempfile, torch
        >>> from naig.io import save_gradients
        >>> tmp = tempfile.TemporaryDirectory()
        >>> root = tmp.name
        >>> ref = save_gradients(f"{root}/ref.safetensors", {"w": torch.ones(100)})
        >>> for k in range(3):
        ...     g = {"w": torch.ones(100) + k * torch.linspace(-1, 1, 100)}
        ...     _ = save_gradients(f"{root}/grads/w{k}.safetensors", g, lag=10 * k)
        >>> result = run_audit(ref, [f"{root}/grads"], AuditConfig(beta=1.0))
        >>> for f in result.files:
        ...     print(f.path.name, f.meta("lag"), round(f.cos, 3), f.verdict)
        w0.safetensors 0 1.0 integrated
        w1.safetensors 10 0.864 frozen
        w2.safetensors 20 0.651 frozen
        >>> tmp.cleanup()
    """
    psi = fano_fisher_metric(config.line)
    ref_path, worker_paths, notes = _resolve_files(ref, files, config.recursive)
    ref_info, workers = inspect_input(ref_path), [inspect_input(p) for p in worker_paths]
    plan, skipped = plan_tensors(ref_info, workers, config.keys, config.intersect)
    if not any(t.numel for t in plan):  # no value to compare: every verdict would be a claim about nothing
        raise DataError(f"{ref_path}: the {len(plan)} tensor(s) compared hold no values (every one is "
                        "empty); nothing to audit: compare files with non-empty tensors")
    t0 = time.perf_counter()
    acc = _stream_all(ref_info, workers, plan, config, progress)
    seconds = time.perf_counter() - t0
    _check_reference(acc, ref_path)
    rows = _scores(acc, workers, psi)
    pi, beta = _verdicts(rows, config.beta)
    files = [FileScore(**r) for r in rows]
    return AuditResult(
        reference=ref_path,
        reference_metadata=ref_info.metadata,
        files=files,
        beta=beta,
        k_eff=effective_workers(pi),
        n=sum(t.numel for t in plan),
        bytes_read=acc.bytes_read,
        seconds=seconds,
        skipped=skipped,
        config=config,
        warnings=notes,
        lag_correlation=_lag_correlation(files, config.seed),
    )
