"""Build machinery: a C++ source compiled into a shared library that is cached, verified and loaded.

One module for it because three libraries share it: the controller's kernel (``engines.kernel``) and
the signals' C++ helpers (``mdl_jax.signals.conflict_native``, ``dots_native``). Each library is built
with the system C++ compiler on first use, cached under ``$MDL_JAX_CACHE_DIR/native`` keyed by what
went into it, and loaded only when its bytes match the size and sha256 its build recorded: a library
cut short (a full disk, a killed copy) would map pages past the end of its file, and the first call
into them would kill the process with SIGBUS, with no exception to catch.

``MDL_JAX_NATIVE=0`` keeps every native library from being built or loaded: the one switch for callers
that run "auto" and take no engine argument (the gate, its framework components, the gateway, the
command line); a call that names ``engine="native"`` under it is refused, saying so. ``address`` is
the one way the callers of these libraries pass a NumPy array to them.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import stat
import struct
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from mdl_jax._fs import SmallFileError, read_small
from mdl_jax._io import atomic_path, write_bytes
from mdl_jax._paths import ENV_CACHE, default_cache_dir, own_folder

ENV_SWITCH = "MDL_JAX_NATIVE"


class NativeBuildError(RuntimeError):
    """The native kernel could not be built or loaded (the engine cannot run here)."""


def enabled() -> bool:
    """False when ``MDL_JAX_NATIVE`` is 0 / false / no / off; the native libraries are then neither
    built nor loaded."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def compiler() -> str | None:
    """The C++ compiler command the builds use, as one string: ``$CXX`` where it is set (split as a
    shell would, so ``ccache g++`` works; its program must be on the PATH, else None: a ``$CXX`` that
    names nothing is not replaced by another compiler behind the user's back), else g++, c++ or
    clang++ on the PATH; None if none."""
    cxx = os.environ.get("CXX", "").strip()
    if cxx:
        try:
            words = shlex.split(cxx)
        except ValueError:
            return None
        program = shutil.which(words[0]) if words else None
        return shlex.join([program, *words[1:]]) if program else None
    for name in ("g++", "c++", "clang++"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def _no_compiler() -> str:
    cxx = os.environ.get("CXX", "").strip()
    if cxx:
        return f"$CXX is {cxx!r}, which names no program on the PATH"
    return "no C++ compiler found (tried $CXX, g++, c++, clang++)"


def record_path(lib: Path) -> Path:
    """The sidecar that says what the complete library is: its size and sha256."""
    return lib.with_name(lib.name + ".sha256")


def _record(data: bytes) -> bytes:
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}\n".encode()


# A record is one short line; a library is a few hundred KB. Nothing larger is read into memory.
_RECORD_MAX = 256
_LIBRARY_MAX = 256 << 20


def _read_regular(path: Path, limit: int) -> bytes | None:
    """The bytes of the regular file at ``path``; None for anything else (missing, unreadable, a
    symbolic link, which is not followed, a FIFO or device, which is not waited on) or anything over
    ``limit`` bytes (``mdl_jax._fs.read_small``)."""
    try:
        return read_small(path, limit, follow_links=False)
    except SmallFileError:
        return None


def verified(lib: Path) -> bool:
    """True when ``lib`` is exactly the library its build recorded (size and sha256) and a complete one.

    Loading a library that was cut short maps pages past the end of the file (see the module's
    docstring), so a library is loaded only after its bytes match the record that its build wrote
    after finishing; it is hashed once per process. A record or library that is not a regular file
    (a link, a FIFO) or cannot be read is "not verified": the library is built again.
    """
    want = _read_regular(record_path(lib), _RECORD_MAX)
    data = None if want is None else _read_regular(lib, _LIBRARY_MAX)
    return data is not None and want == _record(data) and library_complete(data)


def elf_complete(data: bytes) -> bool:
    """Do the ELF headers' tables and loadable segments all end inside the file? (A compiler or
    linker that hit a full disk could still leave a short file behind; non-ELF formats pass.)"""
    if data[:4] != b"\x7fELF":
        return True
    if len(data) < 64 or data[4] != 2:  # only ELF64 is built here
        return False
    order = "<" if data[5] == 1 else ">"
    phoff, shoff = struct.unpack_from(order + "QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", data, 0x36)
    if phoff + phnum * phentsize > len(data) or shoff + shnum * shentsize > len(data):
        return False
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from(order + "IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1 and p_offset + p_filesz > len(data):  # PT_LOAD
            return False
    return True


def library_complete(data: bytes) -> bool:
    """A library this platform can load whole: on Linux an ELF file (``elf_complete``); elsewhere
    (Mach-O, PE) only not empty."""
    if sys.platform.startswith("linux"):
        return data[:4] == b"\x7fELF" and elf_complete(data)
    return bool(data) and elf_complete(data)


def cache_folder(folder: Path) -> Path:
    """``folder`` (made if missing) checked as a folder of this user's alone: a library in it is code
    this process runs, and a record beside it proves only that the two agree, so whoever could write
    there could run code here (``mdl_jax._paths.own_folder``). A link at ``folder`` (a cache shared
    between checkouts) is judged by the folder it leads to: who can write that is what matters.

    Raises:
      NativeBuildError: the folder (where a link leads) is not a folder, is another user's, or cannot
        be made; a link that leads nowhere.
    """
    what = f"the native library cache (${ENV_CACHE}/native)"
    if folder.is_symlink() and not folder.exists():   # never made wherever a dangling link points
        raise NativeBuildError(f"{what}: {folder} is a link to nothing ({os.readlink(folder)}); remove it "
                               f"or set ${ENV_CACHE} to a folder of your own")
    try:
        return own_folder(folder.resolve() if folder.is_symlink() else folder, what=what)
    except ValueError as e:
        raise NativeBuildError(f"{e}; or set ${ENV_CACHE} to a folder of your own") from None


# A build takes at most the compiler's timeout (``compile_library``'s); temporaries older than this
# were left by a build that was killed, and are removed by the next build in the folder.
_STALE_S = 3600


def _remove_stale_temporaries(folder: Path) -> None:
    now = time.time()
    for p in folder.iterdir():
        name = p.name
        if not ((name.startswith(".") and name.endswith(".tmp")) or (name.startswith("tmp") and ".so" in name)):
            continue
        try:
            st = os.lstat(p)
            if now - st.st_mtime < _STALE_S:
                continue
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.unlink(p)
        except OSError:
            continue  # another build removed it first


def _compiler_error(stderr: str) -> str:
    # the compiler's first line that names an error (else its last line), for a one-line message
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    first = next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else "no output")
    return first if len(first) <= 300 else first[:297] + "..."


def compile_library(source: Path, flags: list[str], out: Path) -> Path:
    """Compile the C++ ``source`` with ``flags`` into the shared library ``out``, atomically, with its
    size/sha256 record beside it.

    The compiler writes into a fresh private folder (``mdl_jax._io.atomic_path``: no one can plant a
    name there), and the library and its record are renamed into place, so ``out`` is only ever a
    complete library or absent. The record is renamed first: a library whose record is missing or
    stale (a concurrent build, a crash between the renames) fails ``verified`` and is rebuilt,
    never loaded.

    Args:
      source: the C++ file.
      flags: the compiler's flags (optimisation, ISA, include folders).
      out: where the library goes; its folder is made if missing and must be this user's alone
        (``cache_folder``).

    Returns:
      ``out``.

    Raises:
      NativeBuildError: no compiler, the folder is not this user's alone, the compiler failed, or it
        left an incomplete library.
    """
    cxx = compiler()
    if cxx is None:
        raise NativeBuildError(_no_compiler())
    cache_folder(out.parent)
    _remove_stale_temporaries(out.parent)
    with atomic_path(out) as tmp:
        cmd = [*shlex.split(cxx), *flags, "-o", str(tmp), str(source)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode != 0:
            raise NativeBuildError(f"the C++ compiler failed ({Path(cmd[0]).name} {source.name}, exit "
                                   f"{proc.returncode}): {_compiler_error(proc.stderr)}")
        data = _read_regular(tmp, _LIBRARY_MAX) or b""
        if not library_complete(data):
            raise NativeBuildError(f"the C++ compiler ({Path(cmd[0]).name}) left no complete library "
                                   f"({len(data)} bytes; is the disk full?)")
        write_bytes(record_path(out), _record(data))
    return out


def load_library(path: Path, build: Callable[[Path], Path]) -> ctypes.CDLL:
    """The library at ``path``, loaded only when its folder is this user's alone (``cache_folder``) and
    its bytes match the record its build wrote (``verified``); ``build(path)`` makes it first when they
    do not (missing, cut short, foreign), and once more when a complete library does not load here
    (built on another machine).

    Raises:
      NativeBuildError: as ``cache_folder`` and ``build``; OSError: it does not load even when built.
    """
    cache_folder(path.parent)
    if not verified(path):
        build(path)
    try:
        return ctypes.cdll.LoadLibrary(str(path))
    except OSError:
        build(path)
        return ctypes.cdll.LoadLibrary(str(path))


def source_library_path(source: Path, flags: list[str], stem: str, cache_dir: Path | None = None) -> Path:
    """Where a plain C++ library of the signal wing (``signals/_native``) lives: keyed by its source,
    the compiler, its flags and the machine, so any change rebuilds it."""
    parts: list[bytes | str] = [source.read_bytes(), compiler() or "", " ".join(flags), platform.machine()]
    key = hashlib.sha256(b"\0".join(p if isinstance(p, bytes) else p.encode() for p in parts))
    return (cache_dir or default_cache_dir()) / "native" / f"{stem}-{key.hexdigest()[:16]}.so"


def load_source_library(source: Path, flags: list[str], path: Path) -> ctypes.CDLL:
    """The library at ``path`` (``source_library_path``), built from ``source`` first unless its bytes
    match the record its build wrote (``load_library``): a missing, cut-short or foreign file is never
    loaded."""
    return load_library(path, lambda out: compile_library(source, flags, out))


def load_once(state: dict, lock: threading.Lock, load: Callable[[], dict], what: str, fallback: str,
              warn: bool = True) -> bool:
    """A signal-wing library's ``available()``: ``load()`` (→ the entries to keep in ``state``) runs once
    per process, under ``lock``; ``state["ok"]`` remembers the answer. ``MDL_JAX_NATIVE=0`` (read on every
call) makes it False without a build; a
    failed build or load warns once, naming ``what`` and the ``fallback`` that runs instead, on the
    first call with ``warn`` (a caller that names the engine says the error itself, and goes on with
    no fallback to warn of)."""
    if not enabled():  # read on every call, as the controller's engine reads it: a switch set later counts
        return False
    if state.get("ok") is None:
        with lock:
            if "ok" not in state:
                try:
                    state.update(ok=True, **load())
                except (NativeBuildError, OSError, subprocess.SubprocessError, AttributeError) as e:
                    state.update(ok=False, error=str(e), failed=True)
    if warn and state.get("failed") and not state.get("warned"):
        state["warned"] = True
        warnings.warn(f"mdl_jax: {what} unavailable, using {fallback} ({state['error']}). Set {ENV_SWITCH}=0 "
                      "to silence this.", RuntimeWarning, stacklevel=4)
    return state["ok"]


_CHAR = ctypes.c_char


def address(a) -> int:
    """The address of a NumPy array's first byte, for a ctypes call into one of these libraries.

    Through the buffer protocol for a writable array, cheaper than ``a.ctypes.data`` (a gate query
    passes five); read-only or empty arrays, which the protocol refuses, take ``.ctypes.data``.

    Args:
      a: a C-contiguous NumPy array.

    Returns:
      The address as an int.
    """
    try:
        return ctypes.addressof(_CHAR.from_buffer(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data
