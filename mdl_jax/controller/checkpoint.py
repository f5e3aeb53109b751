"""A streamed sweep's progress on disk, so a run stopped part-way resumes, and never onto other inputs.

A checkpoint is one ``.npz`` file (NumPy's format, read with ``allow_pickle=False``) holding the
reducer's sums after whole passes, the row where the next pass starts, and what the sums depend on:
the sha256 of the Parquet file's bytes, a digest of the configs, and the options (columns, resamples
and their seed, pass size, the engine that runs with its ISA variant, mesh, and the versions of
mdl-jax, JAX, jaxlib and NumPy). ``sweep_parquet`` writes it whole or
not at all (``mdl_jax._io``) at a pass boundary once ``EVERY_S`` seconds have passed since the last,
and removes it when the sweep is done. Passes are cut at fixed offsets of the record stream, so a
resumed sweep adds the same passes as an uninterrupted one: the result is the same to the bit.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from mdl_jax.controller import config as _config
from mdl_jax.controller.config import NUMERIC_FIELDS, MDLConfig

# Seconds between checkpoints: the work a kill loses at most (besides one pass), against the cost of
# writing the sums (about 8 × 8 bytes per config and weight vector, held once more while written).
EVERY_S = 60.0
_FORMAT = 1


def versions() -> dict:
    """The versions whose arithmetic the sums depend on: this library's, JAX's, jaxlib's and NumPy's."""
    import jax
    import jaxlib

    from mdl_jax._version import __version__

    return {"mdl_jax": __version__, "jax": jax.__version__, "jaxlib": getattr(jaxlib, "__version__", ""),
            "numpy": np.__version__}


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes (``hashlib.file_digest``: read in blocks, memory flat)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def configs_digest(cfg: MDLConfig) -> str:
    """sha256 of a batch's numeric leaves (shape and float32 bytes, field by field) and static fields."""
    h = hashlib.sha256()
    for f in NUMERIC_FIELDS:
        a = np.ascontiguousarray(np.asarray(getattr(cfg, f), np.float32))
        h.update(f"{f}{a.shape}".encode() + a.tobytes())
    h.update(repr(_config.flatten(cfg)[1]).encode())
    return h.hexdigest()


class Checkpoint:
    """The progress file of one streamed sweep.

    Args:
      path: the checkpoint file (``.npz``).
      inputs: {"file": the Parquet file's digest, "configs": the configs' digest, "options": a dict
        of JSON values}: what the sums depend on; a checkpoint of other inputs is refused.
    """

    def __init__(self, path: str | os.PathLike, inputs: dict):
        self.path = Path(path)
        self.inputs = json.loads(json.dumps(inputs))   # as it reads back: tuples become lists

    def load(self) -> tuple[dict, int] | None:
        """(the sums, the row the next pass starts at) of a checkpoint of these inputs; None when there
        is none.

        Raises:
          ValueError: naming ``checkpoint``: the file is not a checkpoint of this library (damaged, or
            something else), or one of other inputs (saying which changed).
        """
        if not os.path.lexists(self.path):
            return None
        if not self.path.is_file():   # a FIFO would hang the read, a folder fail it obscurely
            raise ValueError(f"checkpoint: {str(self.path)!r} is not a regular file; remove it or name another")
        try:
            if not zipfile.is_zipfile(self.path):   # (NumPy would take it for a pickle and suggest loading it)
                raise ValueError("not an .npz file")
            with np.load(self.path, allow_pickle=False) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                sums = {k.removeprefix("s_"): z[k] for k in z.files if k.startswith("s_")}
            if not isinstance(meta, dict) or type(meta.get("row")) is not int or meta["row"] < 0:
                raise ValueError("its record of progress is not one")
        except (OSError, ValueError, KeyError, UnicodeError, zipfile.BadZipFile, EOFError) as e:
            raise ValueError(f"checkpoint: {str(self.path)!r} is not a readable sweep checkpoint ({e}); "
                             "remove it to start over") from None
        if meta.get("format") != _FORMAT:
            raise ValueError(f"checkpoint: {str(self.path)!r} is of another format ({meta.get('format')!r}); "
                             "remove it to start over")
        changed = [what for what, key in (("the Parquet file's content", "file"), ("the configs", "configs"))
                   if meta.get(key) != self.inputs[key]]
        old, new = meta.get("options"), self.inputs["options"]
        old = old if isinstance(old, dict) else {}
        changed += [f"{k} ({old.get(k)!r} then, {new.get(k)!r} now)" for k in sorted(set(old) | set(new))
                    if old.get(k) != new.get(k)]
        if changed:
            raise ValueError(f"checkpoint: {str(self.path)!r} is the progress of a sweep of other inputs: "
                             f"{'; '.join(changed)} changed. Remove it to start over")
        return sums, int(meta["row"])

    def save(self, sums: dict, row: int) -> None:
        """The sums after every pass before ``row``, written whole or not at all."""
        from mdl_jax._io import write_bytes

        meta = {"format": _FORMAT, **self.inputs, "row": int(row)}
        arrays: dict[str, Any] = {f"s_{k}": np.asarray(v) for k, v in sums.items()}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        buf = io.BytesIO()
        np.savez(buf, **arrays)   # (the sums once more in memory while it is written)
        write_bytes(self.path, buf.getvalue())


def remove(path: str | os.PathLike) -> None:
    """A checkpoint whose sweep is done: its progress is no longer needed (nothing where there is none)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
