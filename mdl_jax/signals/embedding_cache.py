"""The embedding cache on disk: (model id, sha256(text)) → float32 vector, in one SQLite file.

Its own module because the file outlives the process and every embedder of a cache folder shares it:
what survives a crash, a damaged file, a read-only folder, and a row of the wrong size is decided here
once, apart from how the vectors are computed (``embeddings``). The file's format (tables ``emb`` and
``dims``, keys ``text_key``) is what earlier runs wrote and later ones read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import stat
import threading
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

import numpy as np

from mdl_jax._paths import make_private_folders


def text_key(text: str) -> bytes:
    """The cache's key of a text (the ``key`` column of the ``emb`` table).

    Args:
        text: any text.

    Returns:
        The sha256 digest (32 bytes) of its UTF-8 bytes.
    """
    return hashlib.sha256(text.encode("utf-8")).digest()


# SQLite's primary result codes (``sqlite3.Error.sqlite_errorcode & 0xFF``) that EmbeddingCache acts on
_SQLITE_CORRUPT = {11, 26}       # SQLITE_CORRUPT ("malformed"), SQLITE_NOTADB ("file is not a database")
_SQLITE_NO_WRITE = {3, 8, 14}    # SQLITE_PERM, SQLITE_READONLY, SQLITE_CANTOPEN (a folder it cannot write)
# The file's tables; ``dims`` holds each model id's vector size, written with its vectors: a row of another
# size (damaged, or left by another model once at the same local path) is never served.
_TABLES = ("CREATE TABLE IF NOT EXISTS emb (model TEXT, key BLOB, vec BLOB, PRIMARY KEY (model, key));"
           "CREATE TABLE IF NOT EXISTS dims (model TEXT PRIMARY KEY, dim INTEGER);")
_COLUMNS = {"emb": ["model", "key", "vec"], "dims": ["model", "dim"]}


def _check_tables(db: sqlite3.Connection) -> None:
    """A file whose tables are not the cache's (another program's file by the cache's name) is not a
    cache: its rows would be read by columns it lacks. Raised as SQLite's "not a database", it is set
    aside as a damaged file is (renamed, never deleted) or, read-only, not read."""
    for table, cols in _COLUMNS.items():
        have = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
        if have and have != cols:
            e = sqlite3.DatabaseError(f"not the cache's tables: {table} has the columns ({', '.join(have)}), "
                                      f"expected ({', '.join(cols)})")
            e.sqlite_errorcode = 26  # SQLITE_NOTADB
            raise e


def _sqlite_code(e: BaseException) -> int | None:
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF
    msg = str(e).lower()  # (an error raised without a code)
    if "malformed" in msg or "not a database" in msg:
        return 11
    return 8 if "readonly" in msg or "unable to open" in msg else None


class EmbeddingCache:
    """SQLite-backed (model id, sha256(text)) → float32 vector. Writes are committed per batch, so
    an interrupted run keeps everything embedded so far.

    A damaged file (not a database, or one whose pages are malformed: overwritten, truncated) is set
    aside as ``embeddings.sqlite.corrupt-<UTC time>-<pid>`` (its ``-wal`` and ``-shm`` with it) with a
    RuntimeWarning naming both, and a new cache is built in its place, when it is opened or whenever a
    read or a write meets the damage: its vectors are embedded again, never failed on. (That is the
    damage SQLite detects: it keeps no checksum of a row's bytes, so a bit flipped inside a stored
    vector is served as it is; a row of the wrong size is never served.) A symbolic link at the file's
    name, or another user's file in a folder others may write, is not opened (the vectors are cached
    in memory, with a RuntimeWarning saying why); missing folders are made ours alone (mode 0700).
    A cache this process cannot write (a read-only folder or file, a read-only mount, another
    account's) is opened read-only: its vectors are read as before and new ones are not stored (one
    RuntimeWarning says so). Where there is neither, the vectors are cached in memory for the process.

    Args:
        path: the database file (``<cache_dir>/embeddings.sqlite``).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.read_only = False
        self._lock = threading.Lock()
        self._warned_read_only = False
        self._inode: tuple[int, int] | None = None
        self._db = self._open()

    # -- opening, and what to do with a damaged or unwritable file ------------------------------------
    def _open(self) -> sqlite3.Connection:
        with contextlib.suppress(OSError):  # a folder that cannot be made: nothing to read either, see below
            make_private_folders(self.path.parent)
        untrusted = _untrusted(self.path)
        if untrusted:
            return self._in_memory(untrusted)
        for _ in range(2):
            # the file as it was when it failed to open: only that one is set aside, never one that
            # another process built in its place meanwhile
            seen = _inode(self.path)
            try:
                return self._open_writable()
            except sqlite3.DatabaseError as e:
                code = _sqlite_code(e)
                if code in _SQLITE_CORRUPT:
                    if self._set_aside(e, seen):
                        continue  # a new file in its place
                    return self._in_memory(f"it is damaged ({e}) and cannot be set aside")
                if code not in _SQLITE_NO_WRITE:
                    raise
                return self._open_read_only(e)
        return self._in_memory("it is damaged again after being rebuilt")

    def _open_writable(self) -> sqlite3.Connection:
        # nofollow: a link put at the name after the check above is refused, not written through
        db = sqlite3.connect(f"file:{quote(str(self.path))}?nofollow=1", uri=True, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a commit survives the process being killed (resumable runs), not a power cut
            # (the last vectors would be embedded again); FULL's fsync per commit would dominate a small call
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_TABLES)
            _check_tables(db)
        except BaseException:
            db.close()
            raise
        self._inode = _inode(self.path)
        return db

    def _open_read_only(self, why: BaseException) -> sqlite3.Connection:
        """The cache as it is, read-only (``mode=ro``; ``immutable=1`` where SQLite cannot make the
        WAL's shared-memory file beside it either); in memory where there is nothing to read."""
        if not self.path.is_file():
            return self._in_memory(f"it cannot be created ({why})")
        for mode in ("mode=ro", "mode=ro&immutable=1"):
            db = sqlite3.connect(f"file:{quote(str(self.path))}?{mode}&nofollow=1", uri=True,
                                 check_same_thread=False)
            try:
                names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                if not {"emb", "dims"} <= names:
                    db.close()
                    return self._in_memory(f"it cannot be written ({why}) and holds no vectors")
                _check_tables(db)
                db.execute("SELECT 1 FROM emb LIMIT 1").fetchall()
            except sqlite3.DatabaseError as e:
                db.close()
                if _sqlite_code(e) in _SQLITE_CORRUPT:
                    return self._in_memory(f"it is damaged ({e}) and cannot be written ({why})")
                continue
            self.read_only = True
            return db
        return self._in_memory(f"it can be neither written ({why}) nor read")

    def _in_memory(self, why: str) -> sqlite3.Connection:
        import warnings

        warnings.warn(f"embedding cache {self.path}: {why}; this process caches its vectors in memory only",
                      RuntimeWarning, stacklevel=2)
        self.read_only = False
        self._inode = None
        db = sqlite3.connect(":memory:", check_same_thread=False)
        db.executescript(_TABLES)
        return db

    def _set_aside(self, err: BaseException, seen: tuple[int, int] | None) -> bool:
        """Move the damaged file (and its WAL files) aside, if the name still holds ``seen`` (the file
        found damaged); False where it cannot be moved."""
        import time
        import warnings

        if getattr(self, "_db", None) is not None:
            self._db.close()
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
                                    f"-{os.getpid()}")
        # another process may have set it aside and built a new one already: that one is not touched
        if seen is not None and _inode(self.path) != seen:
            return True
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        for suffix in ("-wal", "-shm"):  # a WAL left by the damaged file must never be replayed into the new one
            with contextlib.suppress(OSError):
                os.rename(f"{self.path}{suffix}", f"{aside}{suffix}")
        warnings.warn(f"embedding cache {self.path} is damaged ({' '.join(str(err).split())[:200]}); it was "
                      f"set aside as {aside.name} and a new cache is built in its place (its texts are "
                      "embedded again)", RuntimeWarning, stacklevel=2)
        return True

    def _recover(self, err: sqlite3.DatabaseError) -> None:
        """After a read or write met a damaged file (the caller holds the lock): set it aside and go on
        with a new one; other errors are raised as they are."""
        if _sqlite_code(err) not in _SQLITE_CORRUPT:
            raise err
        if self._inode is None or not self._set_aside(err, self._inode):
            if getattr(self, "_db", None) is not None:
                self._db.close()
            self._db = self._in_memory(f"it is damaged ({err}) and cannot be set aside")
            return
        self._db = self._open()

    # -- reads and writes ---------------------------------------------------------------------------
    def get(self, model: str, texts: Sequence[str]) -> dict[bytes, np.ndarray]:
        """{sha256(text): vector} for those of ``texts`` cached under ``model``."""
        return self.get_keys(model, {text_key(t) for t in texts})

    def get_keys(self, model: str, keys) -> dict[bytes, np.ndarray]:
        """{key: vector} for those of ``keys`` (sha256 digests of texts) cached under ``model``; {} for
        all of them where the file turns out damaged (set aside: they are embedded again)."""
        keys = list(keys)
        out: dict[bytes, np.ndarray] = {}
        with self._lock:
            try:
                dim = self._dim(model)
                for i in range(0, len(keys), 900):  # SQLite's bound-variable limit
                    chunk = keys[i:i + 900]
                    q = f"SELECT key, vec FROM emb WHERE model=? AND key IN ({','.join('?' * len(chunk))})"
                    for k, v in self._db.execute(q, [model, *chunk]):
                        # else damaged (not a float32 vector, or not of the model's size): embedded again
                        if isinstance(v, bytes) and v and len(v) % 4 == 0 and dim in (None, len(v) // 4):
                            out[k] = np.frombuffer(v, dtype=np.float32)
            except sqlite3.DatabaseError as e:
                self._recover(e)
                return {}
        return out

    def dim(self, model: str) -> int | None:
        """The vector size last cached under ``model``.

        Args:
            model: a model id (``Embedder.model_id``).

        Returns:
            The size, or None when none is recorded (nothing cached yet, or a cache from before the
            sizes were recorded, or a damaged one, set aside).
        """
        with self._lock:
            try:
                return self._dim(model)
            except sqlite3.DatabaseError as e:
                self._recover(e)
                return None

    def _dim(self, model: str) -> int | None:
        row = self._db.execute("SELECT dim FROM dims WHERE model=?", (model,)).fetchone()
        return None if row is None else int(row[0])

    def put(self, model: str, texts: Sequence[str], vecs: np.ndarray) -> None:
        """Store the vectors of ``texts`` under ``model`` (committed at once); nothing in a read-only
        cache; into a new cache where the file turns out damaged (set aside first)."""
        if self.read_only:
            if not self._warned_read_only:
                import warnings

                self._warned_read_only = True
                warnings.warn(f"embedding cache {self.path} cannot be written (read-only): its vectors are "
                              "read, and the new ones are not stored", RuntimeWarning, stacklevel=2)
            return
        rows = [(model, text_key(t), np.ascontiguousarray(v, np.float32).tobytes())
                for t, v in zip(texts, vecs)]
        with self._lock:
            for attempt in range(2):
                try:
                    with self._db:
                        self._db.executemany("INSERT OR REPLACE INTO emb VALUES (?, ?, ?)", rows)
                        if len(vecs):
                            self._db.execute("INSERT OR REPLACE INTO dims VALUES (?, ?)",
                                             (model, int(np.shape(vecs)[-1])))
                    return
                except sqlite3.DatabaseError as e:
                    if attempt or _sqlite_code(e) not in _SQLITE_CORRUPT:
                        raise
                    self._recover(e)
                    if self.read_only:
                        return

    def close(self) -> None:
        self._db.close()


def _untrusted(path: Path) -> str | None:
    """Why the database at ``path`` must not be opened, or None: a symbolic link at its name (SQLite
    would write through it), or a file of another user's that someone else could have put there (a
    folder group or others may write, or a third user's). Another user's file in a folder only they
    (or we) may write is a shared read-only cache, and is read."""
    try:
        st = os.lstat(path)
        folder = os.stat(path.parent)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link (remove it and a new cache is made)"
    me = os.geteuid() if hasattr(os, "geteuid") else st.st_uid
    if st.st_uid == me:
        return None
    # another user's file: trusted where only its owner or we could have put it there
    if folder.st_mode & 0o022:
        return (f"it belongs to another user (uid {st.st_uid}) in a folder others may write, so anyone "
                "could have planted its vectors; use a cache folder of your own")
    if folder.st_uid not in (me, st.st_uid):
        return (f"it belongs to another user (uid {st.st_uid}) in a folder of a third (uid {folder.st_uid}); "
                "use a cache folder of your own")
    return None


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino

