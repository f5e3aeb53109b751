"""Where mdl-jax keeps files between runs (shared by the controller's kernel cache and the pipeline)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_CACHE = "MDL_JAX_CACHE_DIR"


def default_cache_dir() -> Path:
    """``$MDL_JAX_CACHE_DIR``, else ``~/.cache/mdl_jax``."""
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "mdl_jax")


def make_private_folders(path: Path) -> None:
    """Create the folder ``path`` and its missing parents, each ours alone (mode 0700:
    ``mkdir(parents=True)`` would give them the umask's); folders that exist are left as they are.

    Raises:
        OSError: a folder cannot be made (a file or a dangling link in the way, a read-only mount).
    """
    for p in [*reversed(path.parents), path]:
        if not os.path.lexists(p):
            p.mkdir(mode=0o700, exist_ok=True)


def own_folder(path: Path, *, what: str) -> Path:
    """Create ``path`` if missing (its missing parents too, mode 0700) and check that it is a real folder of this
    user's, not a symlink someone planted: writing into a planted link writes wherever it points. A
    folder of ours that group or others may write (made under umask 002) is made ours alone (chmod
    go-w), since they could plant names in it between our checks and our writes.

    Only ``path`` itself is checked (through a file descriptor opened with O_NOFOLLOW, so a link
    swapped in after the check is never followed or chmodded): the folder it is in is the caller's
    choice (the cache folder) and is trusted as such.

    Args:
        path: the folder.
        what: the argument or setting the folder comes from, for the error.

    Returns:
        ``path``.

    Raises:
        ValueError: ``path`` cannot be created or opened, is a symlink or not a folder, or belongs to
          another user.
    """
    import stat

    try:
        make_private_folders(path)
    except OSError as e:  # a file or a dangling link where the folder should be, a read-only mount
        raise ValueError(f"{what}: cannot create the folder {path} ({e.strerror})") from None
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:  # ELOOP / ENOTDIR: a symlink or a file at the name
        raise ValueError(f"{what}: {path} is a symbolic link or not a folder ({e.strerror}); it must be "
                         "a real folder (remove it and it is made again)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise ValueError(f"{what}: {path} is not a folder")
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            raise ValueError(f"{what}: {path} belongs to another user (uid {st.st_uid}); remove it")
        if st.st_mode & 0o022:
            try:
                os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~0o022)
            except OSError as e:
                raise ValueError(f"{what}: {path} is writable by other users (mode "
                                 f"{stat.filemode(st.st_mode)}) and cannot be made yours alone "
                                 f"({e.strerror}); chmod go-w it") from None
    finally:
        os.close(fd)
    return path
