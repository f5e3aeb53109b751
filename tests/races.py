"""A run ending beside another: the folder it removes as it ends goes just as the other takes its lock."""

from __future__ import annotations

import shutil
from pathlib import Path


def folder_goes_once(monkeypatch, folder: Path, lock_name: str, when: str) -> list[int]:
    """Patch so that ``folder`` is removed once, just before the lock file ``lock_name`` in it is opened
    (``when="before its opening"``) or just before it is locked (``"as it locks"``).

    Returns:
      The countdown: ``[0]`` once the folder went.
    """
    import fcntl

    from mdl_jax import _io

    left = [1]

    def gone(real):
        def call(*args, **kw):
            if left[0] and (real.__name__ != "open_append" or Path(args[0]).name == lock_name):
                left[0] -= 1
                shutil.rmtree(folder)
            return real(*args, **kw)
        return call

    if when == "as it locks":
        monkeypatch.setattr(fcntl, "flock", gone(fcntl.flock))
    else:
        monkeypatch.setattr(_io, "open_append", gone(_io.open_append))
    return left
