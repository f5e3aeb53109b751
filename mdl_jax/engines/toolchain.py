"""Build machinery: a C++ source compiled into a shared library that is cached, verified and loaded.

One module for it because three libraries share it: the controller's kernel (``engines.kernel``) and
the signals' C++ helpers (``mdl_jax.signals.conflict_native``, ``dots_native``). Each library is built
with the system C++ compiler on first use, cached under ``$MDL_JAX_CACHE_DIR/native`` keyed by what
went into it, and loaded only when its bytes match the size and sha256 its build recorded: a library
cut short (a full disk, a killed copy) would map pages past the end of its file, and the first call
into them would kill the process with SIGBUS, with no exception to catch.

``MDL_JAX_NATIVE=0`` (deprecated: name the engine instead) keeps every native library from being built
or loaded. ``address`` is the one way the callers of these libraries pass a NumPy array to them.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import struct
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

from mdl_jax._paths import default_cache_dir

ENV_SWITCH = "MDL_JAX_NATIVE"


class NativeBuildError(RuntimeError):
    """The native kernel could not be built or loaded (the engine cannot run here)."""


def enabled() -> bool:
    """False when ``MDL_JAX_NATIVE`` is 0 / false / no / off (a deprecated switch: name the engine
    instead); the native libraries are then neither built nor loaded."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def compiler() -> str | None:
    """The C++ compiler the builds use: ``$CXX``, else g++, c++ or clang++ on the PATH; None if none."""
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def record_path(lib: Path) -> Path:
    """The sidecar that says what the complete library is: its size and sha256."""
    return lib.with_name(lib.name + ".sha256")


def _record(data: bytes) -> str:
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}\n"


def verified(lib: Path) -> bool:
    """True when ``lib`` is exactly the library its build recorded (size and sha256).

    Loading a library that was cut short maps pages past the end of the file (see the module's
    docstring), so a library is loaded only after its bytes match the record that its build wrote
    after finishing; it is hashed once per process.
    """
    try:
        want = record_path(lib).read_text()
        data = lib.read_bytes()
    except OSError:
        return False
    return want == _record(data)


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


def compile_library(source: Path, flags: list[str], out: Path) -> Path:
    """Compile the C++ ``source`` with ``flags`` into the shared library ``out``, atomically, with its
    size/sha256 record beside it.

    Both files are written under temporary names and renamed into place, so ``out`` is only ever a
    complete library or absent. The record is renamed first: a library whose record is missing or
    stale (a concurrent build, a crash between the renames) fails ``verified`` and is rebuilt,
    never loaded.

    Args:
      source: the C++ file.
      flags: the compiler's flags (optimisation, ISA, include folders).
      out: where the library goes; its folder is made if missing.

    Returns:
      ``out``.

    Raises:
      NativeBuildError: no compiler, the compiler failed, or it left an incomplete library.
    """
    cxx = compiler()
    if cxx is None:
        raise NativeBuildError("no C++ compiler found (tried $CXX, g++, c++, clang++)")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    tmp_record = tmp + ".sha256"
    cmd = [cxx, *flags, "-o", tmp, str(source)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode != 0:
            raise NativeBuildError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        data = Path(tmp).read_bytes()
        if not elf_complete(data):
            raise NativeBuildError(f"{' '.join(cmd)} left an incomplete library ({len(data)} bytes; "
                                   "is the disk full?)")
        with open(tmp_record, "w") as f:
            f.write(_record(data))
            f.flush()
            os.fsync(f.fileno())
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())  # the bytes are on disk before either name points at them
        os.replace(tmp_record, record_path(out))
        os.replace(tmp, out)
    finally:
        for t in (tmp, tmp_record):
            if os.path.exists(t):
                os.unlink(t)
    return out


def source_library_path(source: Path, flags: list[str], stem: str, cache_dir: Path | None = None) -> Path:
    """Where a plain C++ library of the signal wing (``signals/_native``) lives: keyed by its source,
    the compiler, its flags and the machine, so any change rebuilds it."""
    parts: list[bytes | str] = [source.read_bytes(), compiler() or "", " ".join(flags), platform.machine()]
    key = hashlib.sha256(b"\0".join(p if isinstance(p, bytes) else p.encode() for p in parts))
    return (cache_dir or default_cache_dir()) / "native" / f"{stem}-{key.hexdigest()[:16]}.so"


def load_source_library(source: Path, flags: list[str], path: Path) -> ctypes.CDLL:
    """The library at ``path`` (``source_library_path``), built from ``source`` first unless its bytes
    match the record its build wrote (``verified``): a missing, cut-short or foreign file is never loaded."""
    if not verified(path):
        compile_library(source, flags, path)
    return ctypes.cdll.LoadLibrary(str(path))


def load_once(state: dict, lock: threading.Lock, load: Callable[[], dict], what: str, fallback: str) -> bool:
    """A signal-wing library's ``available()``: ``load()`` (→ the entries to keep in ``state``) runs once
    per process, under ``lock``; ``state["ok"]`` remembers the answer. ``MDL_JAX_NATIVE=0`` skips it; a
    failed build or load warns once, naming ``what`` and the ``fallback`` that runs instead."""
    ok = state.get("ok")
    if ok is not None:
        return ok
    with lock:
        if "ok" in state:
            return state["ok"]
        if not enabled():
            state.update(ok=False, error=f"{ENV_SWITCH}=0")
            return False
        try:
            state.update(ok=True, **load())
        except (NativeBuildError, OSError, subprocess.SubprocessError, AttributeError) as e:
            state.update(ok=False, error=str(e))
            warnings.warn(f"mdl_jax: {what} unavailable, using {fallback} ({e}). Set {ENV_SWITCH}=0 to "
                          "silence this.", RuntimeWarning, stacklevel=4)
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
