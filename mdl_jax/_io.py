"""The one file writer: every file mdl-jax writes goes through here.

A file is written under a fresh random name in its own folder (created with ``O_CREAT | O_EXCL |
O_NOFOLLOW``, so a name planted beforehand, a symlink to someone's file included, is never opened),
fsynced, renamed over its final name (a rename replaces a symlink at that name, never writes through
it) and the folder fsynced: a reader, a crash or a full disk leaves the old file or the new one, never
half of one. A folder of several files (an analysis, a tuned set) is written into a fresh sibling
folder and published whole (``publish_dir``). An append-only record file is opened with
``O_NOFOLLOW`` and must be a regular file (``open_append``).

A write the system refuses for lack of room or rights (a full disk, a quota, a read-only mount, a
permission) raises ``OutputError``, one ``OSError`` whose message names the path; the command line
prints it as one line and exits 2.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from mdl_jax._fs import (
    CLOEXEC,
    NOFOLLOW,
    OutputError,
    as_output_error,
    fsync_dir,
    is_write_error,
    umask,
)

# The one write call of the helper's files; a test of the full-disk path replaces it here only.
_write = os.write


def _fresh_file(folder: Path, name: str) -> tuple[int, Path]:
    """(fd, path) of a new empty file under a fresh random name in ``folder``, opened for writing.

    ``O_EXCL`` makes the create fail on any existing name (a symlink, dangling or not, included), and
    ``O_NOFOLLOW`` refuses a link besides; a taken name is retried under another. The mode is
    0666 less the umask, what ``open(path, "w")`` would give."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC
    for _, candidate in zip(range(100), _names(name)):
        tmp = folder / candidate
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no fresh temporary name is free", str(folder))


def _names(name: str) -> Iterator[str]:
    """Temporary names for a file called ``name``: hidden, random, never reused."""
    while True:
        yield f".{name}.{_token()}.tmp"


def _token() -> str:
    return secrets.token_hex(6)


class _FdWriter(io.RawIOBase):
    """A raw binary file over a descriptor whose every write goes through ``_write``, so a refusal
    while writing (ENOSPC, EDQUOT, EFBIG, ...) is an ``OutputError`` naming the final path."""

    def __init__(self, fd: int, path: Path):
        super().__init__()
        self._fd, self._path = fd, path

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def write(self, b) -> int:
        try:
            return _write(self._fd, b)
        except OSError as e:
            raise OutputError(self._path, e) from None

    def seek(self, pos: int, whence: int = 0) -> int:
        return os.lseek(self._fd, pos, whence)

    def tell(self) -> int:
        return os.lseek(self._fd, 0, os.SEEK_CUR)

    def truncate(self, size: int | None = None) -> int:
        size = self.tell() if size is None else size
        os.ftruncate(self._fd, size)
        return size

    def close(self) -> None:
        if not self.closed:
            try:
                os.close(self._fd)
            finally:
                super().close()


def _check_mode(mode: str, allowed: tuple[str, ...]) -> None:
    if mode not in allowed:
        raise ValueError(f"mode: expected one of {', '.join(map(repr, allowed))}, got {mode!r}")


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", *, encoding: str = "utf-8",
                newline: str | None = None, tmp_dir: str | os.PathLike | None = None,
                make_parents: bool = True) -> Iterator[IO[Any]]:
    """A file to write ``path`` through: a fresh temporary file in ``path``'s folder, renamed over
    ``path`` when the block ends without an exception (after fsync; the folder is fsynced after the
    rename), removed when it raises. ``path`` holds its old bytes or the new ones, never a mix.

    Examples:
      >>> with atomic_open("out.csv", "w", newline="") as f:          # doctest: +SKIP
      ...     csv.writer(f).writerows(rows)
      >>> with atomic_open("fig.png") as f:                            # doctest: +SKIP
      ...     fig.savefig(f, format="png")

    Args:
        path: the file to write; a symbolic link at ``path`` is replaced, never written through.
        mode: ``"wb"`` (bytes) or ``"w"`` (text in ``encoding``, with ``newline`` as ``open``'s).
        encoding: the text encoding (mode ``"w"``).
        newline: as ``open``'s (``""`` for the csv module).
        tmp_dir: where the temporary file is made (default: ``path``'s folder); on the same file system.
        make_parents: create ``path``'s missing folders.

    Yields:
        The open file (binary or text).

    Raises:
        OutputError: the temporary file cannot be made, written, fsynced or renamed (a full disk, a
          read-only mount, ...); the message names ``path``, and ``path`` is untouched.
        ValueError: ``mode`` is neither "wb" nor "w".
    """
    _check_mode(mode, ("wb", "w"))
    path = Path(path)
    folder = Path(tmp_dir) if tmp_dir is not None else path.parent
    try:
        if make_parents:
            path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _fresh_file(folder, path.name)
    except OSError as e:
        raise as_output_error(path, e) from None
    raw = _FdWriter(fd, path)
    f: IO[Any] = io.BufferedWriter(raw, buffer_size=1 << 16)
    if mode == "w":
        f = io.TextIOWrapper(f, encoding=encoding, newline=newline)
    try:
        try:
            yield f
            f.flush()
            os.fsync(fd)
        finally:
            try:
                f.close()
            except OSError:
                pass  # a failed flush is reported above (or the block's own error is)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and not isinstance(e, OutputError) and is_write_error(e):
            raise OutputError(path, e) from None
        raise
    try:
        fsync_dir(path.parent)
    except OSError as e:
        raise as_output_error(path, e) from None


def write_bytes(path: str | os.PathLike, data: bytes, *, make_parents: bool = True) -> Path:
    """Write ``data`` to ``path`` whole or not at all (``atomic_open``).

    Args:
        path: the file.
        data: its bytes.
        make_parents: create ``path``'s missing folders.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        OutputError: as ``atomic_open``; ``path`` is untouched.
        TypeError: ``data`` is not bytes-like.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data: expected bytes, got {type(data).__name__}")
    with atomic_open(path, "wb", make_parents=make_parents) as f:
        f.write(data)
    return Path(path)


def write_text(path: str | os.PathLike, text: str, *, encoding: str = "utf-8",
               make_parents: bool = True) -> Path:
    """``write_bytes`` of ``text`` encoded as ``encoding``; a ``text`` that is not a str raises
    TypeError (naming it), and everything else is as ``write_bytes``."""
    if not isinstance(text, str):
        raise TypeError(f"text: expected a str, got {type(text).__name__}")
    return write_bytes(path, text.encode(encoding), make_parents=make_parents)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path for a writer that takes a file name, not a file (an exporter, a converter):
    a fresh private folder (mode 0700, no one else can plant names in it) beside ``path``, holding
    the name to write; on success the file is fsynced and renamed over ``path``; the folder is
    removed either way.

    Args:
        path: the final file.

    Yields:
        The temporary file's path (not yet created).

    Raises:
        OutputError: as ``atomic_open``; ``path`` is untouched.
    """
    import tempfile

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    except OSError as e:
        raise as_output_error(path, e) from None
    try:
        tmp = work / path.name
        yield tmp
        try:
            # non-blocking: the open of a FIFO for reading would wait for a writer before the check
            fd = os.open(tmp, os.O_RDONLY | NOFOLLOW | CLOEXEC | getattr(os, "O_NONBLOCK", 0))
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OutputError(path, message=f"cannot write {path}: the writer made no regular file")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.chmod(tmp, 0o666 & ~umask())
            os.replace(tmp, path)
            fsync_dir(path.parent)
        except OSError as e:
            raise as_output_error(path, e) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _fsync_tree(root: Path) -> None:
    """fsync every regular file and folder under ``root`` (links are not followed)."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            try:
                fd = os.open(p, os.O_RDONLY | NOFOLLOW | CLOEXEC | getattr(os, "O_NONBLOCK", 0))
            except OSError as e:
                if e.errno == errno.ELOOP:  # a link a writer made: nothing of ours to sync
                    continue
                raise
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


@contextlib.contextmanager
def publish_dir(final_dir: str | os.PathLike, *, owns: Callable[[str], bool] | None = None,
                keep_existing: bool = False) -> Iterator[Path]:
    """A folder of several files published whole or not at all.

    The block writes into a fresh private sibling folder (``mkdtemp`` in ``final_dir``'s parent;
    inside ``final_dir`` when it is a mount point or its parent is not ours to write). When the
    block ends without an exception, every file in it is fsynced and the folder is published:

    - ``final_dir`` missing: the folder is renamed to ``final_dir``.
    - ``final_dir`` holds only names this output owns (``owns``): it is swapped whole: the old folder
      renamed aside, the new one renamed in, the old one removed.
    - ``final_dir`` also holds names this output does not own (a run folder with its records; a
      user's folder given as ``--out``): those stay; each new file is renamed into it and the owned
      names the new output lacks are removed (stale files of an earlier run). The files are all on
      disk before the first rename, so a full disk or a kill while writing leaves the old files.

    When the block raises (or publishing fails) the temporary folder is removed and ``final_dir``
    is untouched.

    Args:
        final_dir: the output folder. A symbolic link there is followed only to an existing folder
          of this user's (an output folder kept elsewhere); any other link is refused.
        owns: ``owns(name)`` is True for a name in ``final_dir`` that this output writes (a stale
          one is removed). None: only the names the new output contains.
        keep_existing: an existing ``final_dir`` is kept and the new folder dropped (a cache that
          two processes may fill at once: the first one stays).

    Yields:
        The temporary folder to write into (mode 0700 while written; the published folder gets the
        mode a ``mkdir`` gives).

    Raises:
        OutputError: the folder cannot be made or published (a full disk, a read-only mount, a file
          where the folder should be); ``final_dir`` is untouched.
    """

    final = Path(final_dir)
    if final.is_symlink():
        final = _linked_folder(final)
    parent = final.parent
    try:
        if os.path.lexists(final) and not final.is_dir():
            raise OutputError(final, message=f"cannot write the folder {final}: a file is there, not a folder")
        parent.mkdir(parents=True, exist_ok=True)
        tmp = _work_folder(final)
    except OSError as e:
        raise as_output_error(final, e) from None
    try:
        yield tmp
        _fsync_tree(tmp)
        os.chmod(tmp, 0o777 & ~umask())
        _publish(tmp, final, owns, keep_existing)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OutputError) and e.filename and Path(e.filename).is_relative_to(tmp):
            # a file of the temporary folder: name the file the user will look for
            where = final / Path(e.filename).relative_to(tmp)
            raise OutputError(where, e, e.message.replace(e.filename, str(where))) from None
        if isinstance(e, OSError) and not isinstance(e, OutputError) and is_write_error(e):
            raise OutputError(final, e) from None
        raise


def _work_folder(final: Path) -> Path:
    """A fresh private folder to write ``final``'s files into: beside it, or inside it when ``final``
    is a mount point (a rename cannot cross file systems) or sits in a parent we may not write; then
    the files are renamed in one by one, since the folder itself cannot be swapped."""
    import tempfile

    prefix = f".{final.name}."
    if final.is_dir() and os.path.ismount(final):
        return Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=final))
    try:
        return Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=final.parent))
    except PermissionError:
        if not final.is_dir():
            raise
        return Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=final))


def _linked_folder(link: Path) -> Path:
    """The folder a symbolic link at an output folder's name points to, if it is an existing folder of
    this user's (an output folder kept elsewhere); a link to anything else is refused, since writing
    through it would put our files where someone else chose."""
    real = link.resolve()
    try:
        st = os.stat(real)
    except OSError:
        st = None
    if st is None or not stat.S_ISDIR(st.st_mode) or (hasattr(os, "geteuid") and st.st_uid != os.geteuid()):
        raise OutputError(link, message=f"cannot write the folder {link}: it is a symbolic link to {real}, which "
                                        "is not an existing folder of yours; remove the link or choose another folder")
    return real


def _publish(tmp: Path, final: Path, owns, keep_existing: bool) -> None:
    if not os.path.lexists(final):
        try:
            os.rename(tmp, final)
        except OSError as e:  # another process published first
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not final.is_dir():
                raise
            if keep_existing:
                shutil.rmtree(tmp, ignore_errors=True)
                return
            _publish(tmp, final, owns, keep_existing)
            return
        fsync_dir(final.parent)
        return
    if keep_existing:
        shutil.rmtree(tmp, ignore_errors=True)
        return
    new = set(os.listdir(tmp))
    inside = tmp.parent == final
    old = [n for n in os.listdir(final) if not (inside and n == tmp.name)]
    mine = owns if owns is not None else new.__contains__
    swapped = False
    if not inside and all(mine(n) or n in new for n in old):
        aside = final.parent / f".{final.name}.old-{_token()}"
        try:
            os.rename(final, aside)
            swapped = True
        except OSError as e:  # a mount point, a folder in use: its files are replaced one by one below
            if e.errno not in (errno.EBUSY, errno.EACCES, errno.EPERM, errno.EXDEV, errno.EINVAL):
                raise
    if swapped:
        try:
            os.rename(tmp, final)
        except BaseException:
            os.rename(aside, final)
            raise
        fsync_dir(final.parent)
        shutil.rmtree(aside, ignore_errors=True)
        return
    for n in sorted(new):  # a folder holding others' files: the new files renamed in, one by one
        src, dst = tmp / n, final / n
        if src.is_dir() and not src.is_symlink() and dst.is_dir() and not dst.is_symlink():
            aside = final / f".{n}.old-{_token()}"
            os.rename(dst, aside)
            os.rename(src, dst)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(src, dst)
    for n in old:
        if n not in new and mine(n):
            p = final / n
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
    fsync_dir(final)
    os.rmdir(tmp)


def open_append(path: str | os.PathLike, mode: str = "ab", *, encoding: str = "utf-8") -> IO[Any]:
    """An append-only file (a durable record file, a lock file), opened without following a symbolic
    link and only if it is a regular file (a FIFO or a device is refused), created if missing (mode
    0666 less the umask). The caller flushes and fsyncs what must survive a crash (``append_bytes``).

    Args:
        path: the file; its folder must exist.
        mode: ``"ab"`` (bytes), ``"a"`` (text in ``encoding``) or ``"a+"`` (text, also read).
        encoding: the text encoding.

    Returns:
        The open file.

    Raises:
        OutputError: ``path`` is a symbolic link or not a regular file, or cannot be opened (a
          read-only mount, a permission); the message names it.
        ValueError: ``mode`` is not one of the three.
    """
    _check_mode(mode, ("ab", "a", "a+"))
    path = Path(path)
    flags = (os.O_RDWR if mode == "a+" else os.O_WRONLY) | os.O_APPEND | os.O_CREAT | NOFOLLOW | CLOEXEC
    try:
        fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0), 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OutputError(path, e, f"cannot write {path}: it is a symbolic link; refusing to write "
                                       "through it (remove it)") from None
        if e.errno == errno.ENXIO:  # a FIFO with no reader (O_NONBLOCK), a socket
            raise OutputError(path, e, f"cannot write {path}: not a regular file (remove it)") from None
        raise OutputError(path, e) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(path, message=f"cannot write {path}: not a regular file (remove it)")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    if mode == "a+":
        return open(fd, mode, encoding=encoding, closefd=True)  # noqa: SIM115 - the caller closes it
    f: IO[Any] = io.BufferedWriter(_FdWriter(fd, path))
    return f if mode == "ab" else io.TextIOWrapper(f, encoding=encoding)


def lock_file(path: str | os.PathLike, make_folder: Callable[[], Any] | None = None) -> IO[Any] | None:
    """``path`` opened as ``open_append`` opens it (mode ``"a+"``) and locked exclusively (``flock``), or
    None where another open file holds its lock: one run at a time writes a folder. The lock lasts
    until the file is closed or its process ends, however it ends, so a killed run never leaves a
    folder locked.

    The lock is on the file the name holds once it is taken: where a run ending beside this one removed
    the file (or its folder) between its opening and its locking, the name is opened again (the folder
    made again by ``make_folder``), a few times, so two runs never each hold a lock of one folder. For
    that, whoever removes a lock file (or its folder) does so while holding its lock.

    Args:
        path: the lock file.
        make_folder: called before each try, to make (or check) ``path``'s folder; None: the folder must
          exist, and its going as this locks is read as the end of its run (None is returned).

    Returns:
        The open, locked file (close it to let go), or None: another holds it, or the name kept
        changing under it.

    Raises:
        OutputError: as ``open_append``; and what ``make_folder`` raises.
    """
    import fcntl

    for attempt in range(_LOCK_TRIES):
        if make_folder is not None:
            make_folder()
        try:
            f = open_append(path, "a+")
        except OutputError:
            if attempt == _LOCK_TRIES - 1 or os.path.isdir(os.path.dirname(os.path.abspath(path))):
                raise
            if make_folder is not None:
                continue  # the folder went with its run's end: made again
            if attempt:
                return None
            raise
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = os.fstat(f.fileno())
            try:
                named = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                named = None
        except BlockingIOError:
            f.close()
            return None
        except BaseException:
            f.close()
            raise
        if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
            return f
        f.close()  # locked a file the name no longer holds: that lock guards nothing
    return None


# how often ``lock_file`` opens the name again when the file under it changed as it locked: once is
# what a run ending beside it costs; more would take a loop of runs, each ending as this one locks
_LOCK_TRIES = 4


def append_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Append ``data`` to ``path`` (``open_append``) and fsync it: on return it survives a crash.

    Args:
        path: the record file; its folder must exist.
        data: the bytes to append (whole lines, for a line-oriented file).

    Raises:
        OutputError: as ``open_append``, or the disk refused the write (a full disk); a torn last
          line may then remain, which the record readers skip.
    """
    with open_append(path, "ab") as f:
        f.write(data)
        f.flush()
        try:
            os.fsync(f.fileno())
        except OSError as e:
            raise as_output_error(path, e) from None


def database_path(path: str | os.PathLike) -> Path:
    """``path`` checked for a writer that opens it by name itself (SQLite): its folder created, and a
    symbolic link at ``path`` refused, since the writer would follow it. (SQLite opens its journal
    and WAL files with ``O_NOFOLLOW`` itself.)

    Args:
        path: the database file.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        OutputError: ``path`` is a symbolic link or not a regular file, or its folder cannot be made.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as e:
        raise OutputError(path, e) from None
    if stat.S_ISLNK(st.st_mode):
        raise OutputError(path, message=f"cannot write {path}: it is a symbolic link; refusing to write "
                                        "through it (remove it)")
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(path, message=f"cannot write {path}: not a regular file (remove it)")
    return path
