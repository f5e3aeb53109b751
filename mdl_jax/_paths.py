"""Where mdl-jax keeps files between runs (shared by the controller's kernel cache and the pipeline)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_CACHE = "MDL_JAX_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$MDL_JAX_CACHE_DIR``, else ``~/.cache/mdl_jax``."""
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "mdl_jax")



def fsync_dir(folder: Path) -> None:
    """fsync a folder, so a rename inside it survives a power cut."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_with(path: Path, write, *, tmp_dir: Path | None = None) -> None:
    """``write(binary file)`` into a fresh temp file in ``tmp_dir`` (default: beside ``path``), then
    fsync, rename onto ``path`` and fsync ``path``'s folder; the temp file is removed on failure.

    The fresh name comes from mkstemp (O_CREAT | O_EXCL), so a name planted beforehand is never
    followed, and the rename replaces a planted symlink itself, never its target."""
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=tmp_dir or path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (``replace_with``), creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_with(path, lambda f: f.write(data))
