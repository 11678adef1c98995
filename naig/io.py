"""Read and write gradient / checkpoint files in the safetensors format.

``save_gradients`` lets training code write audit input (a state dict of
gradients with ``lag``, ``step`` and ``worker`` metadata). Pickle formats
(``.pt``, ``.bin``, ``.ckpt``) are never loaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from naig.errors import UsageError

__all__ = ["METADATA_KEYS", "save_gradients"]

METADATA_KEYS = ("lag", "step", "worker")


def save_gradients(
    path: str | os.PathLike[str],
    tensors: Mapping[str, Any],
    *,
    lag: int | None = None,
    step: int | None = None,
    worker: int | str | None = None,
    **metadata: Any,
) -> Path:
    """Save a state dict of gradients (or parameters) as a safetensors file for ``naig audit``.

    Args:
        path: destination ``.safetensors`` path; parent directories are created.
        tensors: {name: torch.Tensor or numpy array}; non-contiguous tensors are
            copied to contiguous CPU memory. Typical use:
            ``{n: p.grad for n, p in model.named_parameters() if p.grad is not None}``.
        lag: staleness τ of this worker, in server steps (metadata ``lag``).
        step: server step at which the gradient was taken (metadata ``step``).
        worker: worker id (metadata ``worker``).
        **metadata: further string-able metadata (e.g. ``strategy``, ``seed``).

    Returns:
        The path written.

    Raises:
        UsageError: if ``path`` does not end in ``.safetensors`` or ``tensors`` is empty.

    Example:
        >>> import torch, tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "w0.safetensors")
        >>> save_gradients(p, {"w": torch.ones(3)}, lag=10, step=50, worker=0).name
        'w0.safetensors'
    """
    import torch
    from safetensors.torch import save_file

    path = Path(path)
    if path.suffix != ".safetensors":
        raise UsageError(f"{path}: gradient files must end in .safetensors; rename it")
    if not tensors:
        raise UsageError(f"{path}: no tensors to save; pass a non-empty state dict")
    meta = {"lag": lag, "step": step, "worker": worker, **metadata}
    meta = {k: str(v) for k, v in meta.items() if v is not None}
    data = {n: torch.as_tensor(t).detach().cpu().contiguous() for n, t in tensors.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(data, str(path), metadata=meta)
    return path
