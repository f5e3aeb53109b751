"""What every command shares: the one-line error (``CommandError``, ``fail``), the parser class, the
argparse ``type=`` functions that check flags before any work starts, and which exceptions mean bad
input. Nothing here imports a heavy module at import time."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class CommandError(Exception):
    """A bad input the user must fix (not a bug): ``main`` prints it as one line and exits 2."""


class Parser(argparse.ArgumentParser):
    """argparse, except that a usage error is ONE line on stderr, ``mdl-jax: error: <command>: ...``,
    and exit 2 (argparse's default prints the usage block first). Subparsers inherit the class."""

    def error(self, message):
        cmd = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        fail(f"{cmd}{message}")


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``mdl-jax: error: message`` as one line on stderr and exit with ``code``."""
    print(f"mdl-jax: error: {' '.join(str(message).split())}", file=sys.stderr)
    raise SystemExit(code)


# -- argparse ``type=`` functions: flags are checked when the command line is parsed, before any
#    work, lock or folder exists; the message names what was expected and echoes what was written.

def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    """An int ≥ 1."""
    v = _int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer ≥ 1, got {text!r}")
    return v


def nonneg_int(text: str) -> int:
    """An int ≥ 0."""
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer ≥ 0, got {text!r}")
    return v


SEED_MAX = 2 ** 32 - 1


def seed_int(text: str) -> int:
    """A seed: an int in [0, 2^32) (the width every PRNG here takes without aliasing)."""
    v = _int(text)
    if not 0 <= v <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"expected a seed in [0, {SEED_MAX}], got {text!r}")
    return v


def positive_float(text: str) -> float:
    """A finite float > 0."""
    import math

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return v


def existing_file(text: str) -> str:
    """A path to an existing regular file."""
    from pathlib import Path

    p = Path(text)
    if not p.exists():
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    if not p.is_file():
        raise argparse.ArgumentTypeError(f"not a regular file: {text!r}")
    return text


def existing_dir(text: str) -> str:
    """A path to an existing folder."""
    from pathlib import Path

    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"no such folder: {text!r}")
    return text


def _names_a_device(text: str) -> bool:
    """Does ``text``, or a link on the way from it, lead into /dev or /proc? (/dev/stdout is a link to
    /proc/self/fd/1, itself a link to whatever stdout is: a regular file when redirected, and a
    rename over the name would replace the link, not write the file.)"""
    import os

    path = os.path.abspath(text)
    for _ in range(40):   # the kernel's own limit on links followed
        if (path == "/dev" or path.startswith(("/dev/", "/proc/"))) and not path.startswith("/dev/shm/"):
            return True   # (/dev/shm is a file system of files, written as any other)
        if not os.path.islink(path):
            return False
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
    return True


def _creatable(text: str, want_dir: bool) -> str:
    import os
    from pathlib import Path

    p = Path(text)
    kind = "folder" if want_dir else "file"
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a {kind} path, got {text!r}")
    if not want_dir and _names_a_device(text):
        raise argparse.ArgumentTypeError(f"{text!r} names a device or a process's file descriptor (/dev, "
                                         "/proc), never replaced; leave out the option to print, or name a file")
    if p.exists():
        if want_dir and not p.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder")
        if not want_dir and p.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} is a folder, expected a file path")
        if not want_dir and not p.is_file():
            # a device or FIFO (/dev/null, /dev/stdout) would be replaced by a regular file, as every
            # output is written to a fresh name and renamed over its path
            raise argparse.ArgumentTypeError(f"{text!r} is not a regular file (a device, FIFO or socket is "
                                             "never replaced; leave out the option to print, or name a file)")
        if not os.access(p, os.W_OK):
            raise argparse.ArgumentTypeError(f"{text!r} is not writable")
        return text
    # the nearest existing ancestor must be a writable folder (nothing is created here)
    q = p.absolute().parent
    while not q.exists():
        q = q.parent
    if not q.is_dir():
        raise argparse.ArgumentTypeError(f"cannot create {text!r}: {str(q)!r} is not a folder")
    if not os.access(q, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot create {text!r}: {str(q)!r} is not writable")
    return text


def out_dir(text: str) -> str:
    """An output folder that exists or can be created (checked, not created)."""
    return _creatable(text, True)


def out_file(text: str) -> str:
    """An output file that can be written (checked, not created)."""
    return _creatable(text, False)


def refuse_same_file(out: str | None, *, what: str = "--out", **inputs: str | None) -> None:
    """A ``CommandError`` when the output file ``out`` is one of the command's input files (the same
    file, through any link): writing it would replace the input before, or while, it is read.

    Args:
      out: the output path, or None (no file output).
      what: the option that names ``out``, for the message.
      inputs: {what the input is called on the command line: its path, or None}.
    """
    import os

    if not out or not os.path.exists(out):
        return
    for name, path in inputs.items():
        if path and os.path.exists(path) and os.path.samefile(out, path):
            raise CommandError(f"{what} {out!r} is the {name} file; it would be replaced by the output")


def write_stdout(text: str) -> None:
    """``text`` to standard output, flushed: a refusal (a full disk) is one ``OutputError`` line, not a
    traceback; a reader that left (``| head``) ends the command quietly (``main``)."""
    import sys

    from mdl_jax._io import OutputError

    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        raise OutputError("<standard output>", e) from None


def config_file(text: str) -> str:
    """An MDL config file that loads (version, fields, invariants): a broken one fails at parse time."""
    existing_file(text)
    from mdl_jax import load_config

    try:
        load_config(text)
    except ValueError as e:  # ConfigFileError and the config's own checks name the field
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


# Exception classes that command groups outside this package (the reproduction's, registered through
# the ``mdl_jax.commands`` entry points) add: their bad input is printed the same way.
_EXTRA_USER_ERRORS: list[type[BaseException]] = []


def add_user_errors(*types: type[BaseException]) -> None:
    """Treat ``types`` as bad input in every command: one line on stderr, exit 2 (see ``user_errors``).

    Args:
      *types: exception classes a command group raises for input the user must fix.
    """
    for t in types:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise TypeError(f"add_user_errors: expected exception classes, got {t!r}")
        if t not in _EXTRA_USER_ERRORS:
            _EXTRA_USER_ERRORS.append(t)


def user_errors() -> tuple[type[BaseException], ...]:
    """The exception classes that mean bad input or an output the system refuses (a full disk, a
    read-only folder), printed as one line, exit 2, not a bug."""
    from mdl_jax._io import OutputError
    from mdl_jax.controller.config_file import ConfigFileError
    from mdl_jax.evaluation.datasets.files import DataError  # stdlib-only: keeps the CLI light

    return (CommandError, DataError, ConfigFileError, OutputError, *_EXTRA_USER_ERRORS)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` that shows an argument's default where it has one: never "(default: None)" or
    "(default: [])", which say nothing (the help text says what an unset option means), nor on a
    required argument, nor twice where the help text states its default in words."""

    def _get_help_string(self, action):
        if action.default is None or action.default == [] or action.required or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)
