"""What the one file writer asks of the operating system, and what a refusal becomes.

``mdl_jax._io`` writes every file; this module holds the pieces it is built on that are not about
any one way of writing: the ``open`` flags it relies on (0 where a platform lacks one), the set of
errors that are refusals of room or rights, ``OutputError`` (the one error such a refusal becomes,
naming the path), the fsync of a folder, and the umask read without changing it. They are public
here so the writer's modules share them by name; callers import them from ``mdl_jax._io``. Beside
them, the one careful reader of a small file someone may have put anything at (``read_small``,
imported from here by the config files, the gate's risk table and the native libraries' records).
"""

from __future__ import annotations

import errno
import os

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DIRECTORY = getattr(os, "O_DIRECTORY", 0)

# Refusals of room or rights: the user's to fix (free space, another folder), not a bug.
REFUSALS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG,
            getattr(errno, "EDQUOT", errno.ENOSPC)}


class OutputError(OSError):
    """An output could not be written: a full disk, a quota, a read-only mount, a permission, a
    symbolic link where a file of ours should be. The message names the path; what was there before
    is untouched.

    Attributes (those of ``OSError``): ``errno``, ``strerror``, ``filename`` (the path).
    """

    def __init__(self, path: str | os.PathLike, cause: OSError | None = None, message: str | None = None):
        code = cause.errno if cause is not None else None
        reason = (cause.strerror or str(cause)) if cause is not None else None
        super().__init__(code, reason, str(path))
        if message is None:
            hint = {errno.ENOSPC: "the disk is full", errno.EROFS: "a read-only file system",
                    getattr(errno, "EDQUOT", -1): "the disk quota is used up"}.get(code)
            message = f"cannot write {path}: {reason}"
            if hint and hint.lower() != str(reason).lower():
                message += f" ({hint})"
            message += "; nothing was replaced" if code in REFUSALS else ""
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        return (_rebuild_output_error, (self.filename, self.errno, self.strerror, self.message))


def _rebuild_output_error(path, code, reason, message) -> OutputError:
    e = OutputError(path, message=message)
    e.errno, e.strerror = code, reason
    return e


def as_output_error(path, e: OSError) -> OSError:
    """``e`` as an ``OutputError`` naming ``path`` (``e`` itself when it is one already)."""
    return e if isinstance(e, OutputError) else OutputError(path, e)


def fsync_dir(folder: str | os.PathLike) -> None:
    """fsync a folder, so a rename inside it survives a power cut.

    Args:
        folder: the folder.

    Raises:
        OSError: the folder cannot be opened (a file system that cannot fsync a folder is accepted).
    """
    fd = os.open(folder, os.O_RDONLY | DIRECTORY | CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def umask() -> int:
    """The process's umask, read without changing it where Linux says it (a change would race threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def is_write_error(e: OSError) -> bool:
    """An OSError of the write machinery (fsync, rename), not of the caller's block reading its input:
    the block's own reads keep their error. Told apart by errno: a refusal of room or rights, or an
    error no read gives."""
    return e.errno in REFUSALS or e.errno in (errno.EXDEV, errno.EISDIR, errno.ENOTDIR, errno.EIO)


class SmallFileError(ValueError):
    """Why ``read_small`` read nothing: ``kind`` is "unreadable" (``reason``: the system's words),
    "not regular" (``mode``: what is there, for ``file_kind``) or "too large" (``size``: the size it
    has, or None when it grew past the limit while read)."""

    def __init__(self, kind: str, *, reason: str = "", mode: int = 0, size: int | None = None):
        super().__init__(kind)
        self.kind, self.reason, self.mode, self.size = kind, reason, mode, size


def read_small(path: str | os.PathLike, limit: int, *, follow_links: bool = True) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit``: opened non-blocking (a FIFO cannot
    hang the caller) and checked on the opened descriptor (nothing can be swapped in between), at most
    ``limit`` + 1 bytes ever read.

    Args:
        path: the file.
        limit: the most bytes it may hold.
        follow_links: False: a symbolic link at ``path`` is "unreadable" (ELOOP), never followed.

    Returns:
        Its bytes.

    Raises:
        SmallFileError: it cannot be opened or read, is not a regular file (a folder, a FIFO, a
          device), or holds more than ``limit`` bytes.
    """
    import stat

    flags = os.O_RDONLY | CLOEXEC | getattr(os, "O_NONBLOCK", 0) | (0 if follow_links else NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise SmallFileError("unreadable", reason=e.strerror or str(e)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SmallFileError("not regular", mode=st.st_mode)
        if st.st_size > limit:
            raise SmallFileError("too large", size=st.st_size)
        chunks, size = [], 0
        while size <= limit:  # a file growing while it is read is cut off here too
            chunk = os.read(fd, min(limit + 1 - size, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise SmallFileError("unreadable", reason=e.strerror or str(e)) from None
    finally:
        os.close(fd)
    if size > limit:
        raise SmallFileError("too large")
    return b"".join(chunks)


def file_kind(mode: int) -> str:
    """What a file of ``mode`` is, for a message ("a directory", "a FIFO", ...)."""
    import stat

    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"
