"""Read and write gradient / checkpoint files in the safetensors format.

``save_gradients`` lets training code write audit input (a state dict of
gradients with ``lag``, ``step`` and ``worker`` metadata) from the dicts training
loops actually hold: ``None`` gradients of frozen parameters, tied weights and other
tensors that share storage, sparse embedding gradients, DTensor (FSDP2) shards and
numpy arrays of any stride. Pickle formats (``.pt``, ``.bin``, ``.ckpt``) are never loaded.
"""

from __future__ import annotations

import math
import os
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from naig.errors import UsageError

__all__ = ["METADATA_KEYS", "save_gradients", "json_ready", "missing_reason", "temp_beside"]

METADATA_KEYS = ("lag", "step", "worker")
_RESERVED = "__metadata__"  # the safetensors header key that holds the metadata
_SHOWN = 5  # names listed in a notice before "and N more"


def json_ready(obj: Any) -> Any:
    """``obj`` with every NaN/±inf float (also inside dicts, lists and tuples) replaced by None,
    so ``json.dumps`` writes strict JSON (``null``) rather than ``NaN``.

    Example:
        >>> json_ready({"loss": float("nan"), "curve": [1.5, float("inf")]})
        {'loss': None, 'curve': [1.5, None]}
    """
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_ready(v) for v in obj]
    return obj


def missing_reason(path: str | os.PathLike[str]) -> str:
    """Why ``path`` cannot be opened though named: ``"no such file"``, ``"a symbolic link loop"``, or
    the system's reason (e.g. ``"Permission denied"``); for a path that exists, ``"not a file"``.

    Example:
        >>> missing_reason("/no/such/path")
        'no such file'
    """
    try:
        os.stat(path)
    except OSError as exc:
        import errno

        if exc.errno == errno.ELOOP:
            return "a symbolic link loop (each link points back to another)"
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return "no such file"
        return exc.strerror or type(exc).__name__
    return "not a file"


def _names(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _from_numpy(value: Any) -> Any:
    """A numpy array as a torch tensor: native byte order, positive strides, contiguous."""
    import numpy as np
    import torch

    arr = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("="))
    return torch.from_numpy(arr)


def _to_tensor(name: str, value: Any, densified: list[str]) -> Any:
    """One value as a detached, contiguous CPU tensor (gathered if a DTensor, dense if sparse)."""
    import numpy as np
    import torch

    try:
        if callable(getattr(value, "full_tensor", None)):  # DTensor (FSDP2, tensor parallel)
            value = value.full_tensor()
        t = _from_numpy(value) if isinstance(value, np.ndarray) else torch.as_tensor(value)
        if t.layout != torch.strided:  # sparse gradients, e.g. nn.Embedding(sparse=True)
            t = t.to_dense()
            densified.append(name)
        return t.detach().cpu().contiguous()
    except (TypeError, ValueError, RuntimeError, NotImplementedError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"tensor {name!r} cannot be saved ({reason}); pass a torch tensor or a numpy "
                         "array of numbers", field="tensors") from None


def _unshare(tensors: dict[str, Any]) -> dict[str, Any]:
    """Copy tensors that share storage with an earlier one (tied weights, views), so each is saved."""
    seen: set[int] = set()
    out = {}
    for name, t in tensors.items():
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and storage.nbytes():
            t = t.clone() if ptr in seen else t
            seen.add(ptr)
        out[name] = t
    return out


def _check_names(tensors: Mapping[str, Any]) -> None:
    for name in tensors:
        if not isinstance(name, str):
            raise UsageError(f"tensor names must be str, got {name!r}; use the state dict's names",
                             field="tensors")
        if name == _RESERVED:
            raise UsageError(f"the name {_RESERVED!r} is reserved by safetensors for the metadata; "
                             "rename that tensor", field="tensors")


def _prepare(tensors: Mapping[str, Any]) -> dict[str, Any]:
    """Validate and convert; warn once about skipped ``None`` values and densified sparse tensors."""
    _check_names(tensors)
    missing = [n for n, t in tensors.items() if t is None]
    if len(missing) == len(tensors):
        raise UsageError("every tensor is None; pass gradients after backward()", field="tensors")
    if missing:
        warnings.warn(f"save_gradients: skipped {len(missing)} tensor(s) with no gradient (None, e.g. "
                      f"frozen or unused parameters): {_names(missing)}", UserWarning, stacklevel=3)
    densified: list[str] = []
    data = {n: _to_tensor(n, t, densified) for n, t in tensors.items() if t is not None}
    if densified:
        warnings.warn(f"save_gradients: sparse gradient(s) saved as dense tensors: {_names(densified)}",
                      UserWarning, stacklevel=3)
    return _unshare(data)


def temp_beside(path: Path, suffix: str) -> tuple[int, str]:
    """A new empty file in ``path``'s folder for an atomic write (write it, then ``os.replace``):
    (an open descriptor, its name). Unlike ``tempfile.mkstemp`` (mode 0600) it gets the permissions
    of any file the user creates, 0666 less the umask, which the rename then gives ``path``.

    Raises:
        OSError: the folder is missing or not writable.
    """
    for name in tempfile._get_candidate_names():  # random names, as mkstemp draws them
        tmp = os.path.join(path.absolute().parent, f".{path.name}.{name}{suffix}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")  # pragma: no cover - endless names


def _write(path: Path, data: dict[str, Any], meta: dict[str, str]) -> None:
    """Write atomically: a temporary file in the same folder, then a rename."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_beside(path, ".safetensors.tmp")
    mode = os.fstat(fd).st_mode & 0o777  # 0666 less the umask
    os.close(fd)
    try:
        try:
            save_file(data, tmp, metadata=meta)  # safetensors writes its own file, mode 0600
        except KeyError as exc:  # a dtype safetensors has no type for (complex128, quantised)
            bad = next((n for n, t in data.items() if t.dtype == exc.args[0]), "?")
            raise UsageError(f"tensor {bad!r} has dtype {str(exc.args[0]).removeprefix('torch.')}, which "
                             "safetensors cannot store; convert it first (e.g. .float())",
                             field="tensors") from None
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


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

    Takes the dict as a training loop builds it, ``{n: p.grad for n, p in
    model.named_parameters()}``:

    - ``None`` values (frozen or unused parameters) are skipped, and a ``UserWarning``
      names them (filter it with ``warnings`` if that is expected);
    - tensors that share storage (tied weights, overlapping views) are each saved
      under their own name (safetensors alone refuses them);
    - sparse tensors (``nn.Embedding(sparse=True)`` gradients) are saved dense, with a
      ``UserWarning`` naming them;
    - DTensors (FSDP2, tensor parallel) are gathered with ``full_tensor()``: a
      collective, so every rank of the mesh must call ``save_gradients`` (or gather)
      together;
    - numpy arrays of any stride or byte order are copied to contiguous native order.

    Args:
        path: destination ``.safetensors`` path; parent directories are created. The
            file is written to a temporary name and renamed, so a failed call leaves no
            partial file.
        tensors: {name: torch.Tensor, DTensor, numpy array or None}.
        lag: staleness τ of this worker, in server steps (metadata ``lag``).
        step: server step at which the gradient was taken (metadata ``step``).
        worker: worker id (metadata ``worker``).
        **metadata: further string-able metadata (e.g. ``strategy``, ``seed``).

    Returns:
        The path written.

    Raises:
        UsageError: the path does not end in ``.safetensors``, is a directory or lies under a
            file; ``tensors`` is empty or all ``None``; a name is not a str or is ``__metadata__``
            (reserved by safetensors); a value cannot be turned into a tensor or has a dtype
            safetensors cannot store (complex128, quantised). Nothing is written then.

    Example:
        >>> import torch, tempfile, os
        >>> tmp = tempfile.TemporaryDirectory()
        >>> p = os.path.join(tmp.name, "w0.safetensors")
        >>> save_gradients(p, {"w": torch.ones(3)}, lag=10, step=50, worker=0).name
        'w0.safetensors'
        >>> tmp.cleanup()
    """
    path = Path(os.fsdecode(path) if isinstance(path, bytes) else path)
    if path.suffix != ".safetensors":
        raise UsageError(f"{path}: gradient files must end in .safetensors; rename it")
    if path.is_dir():
        raise UsageError(f"{path}: is a directory; name a file in it, e.g. {path / 'w0.safetensors'}")
    blocked = next((p for p in path.absolute().parents if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise UsageError(f"{path}: {blocked} is a file, not a folder; choose another path")
    if not tensors:
        raise UsageError(f"{path}: no tensors to save; pass a non-empty state dict")
    meta = {"lag": lag, "step": step, "worker": worker, **metadata}
    meta = {k: str(v) for k, v in meta.items() if v is not None}
    _write(path, _prepare(tensors), meta)
    return path
