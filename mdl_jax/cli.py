"""Command line: ``mdl-jax demo`` (the controller on a few signal triples) and later stages.

Heavy modules (signals, generation) are imported inside their subcommands so ``mdl-jax demo`` and
``import mdl_jax`` stay light.
"""

from __future__ import annotations

import argparse
import sys

DEMO_TRIPLES = [
    # (label, M, R, A): named cases that reach all four actions under the deployed defaults
    ("relevant, consistent, low risk", 0.85, 0.80, 0.20),
    ("relevant, consistent, medium risk", 0.85, 0.80, 0.50),
    ("relevant, conflicting, medium risk", 0.80, 0.15, 0.50),
    ("weakly relevant, medium risk", 0.30, 0.50, 0.50),
    ("relevant, weakly reliable, high risk", 0.80, 0.30, 0.85),
    ("relevant, conflicting, high risk", 0.85, 0.15, 0.85),
    ("irrelevant, conflicting, high risk", 0.10, 0.10, 0.85),
]


def demo(out=sys.stdout) -> None:
    import numpy as np

    from mdl_jax import Action, MDLConfig, decide

    cfg = MDLConfig()
    M, R, A = (np.array([t[i] for t in DEMO_TRIPLES], np.float32) for i in (1, 2, 3))
    d = decide(M, R, A, cfg)
    head = (f"{'case':36s} {'M':>5s} {'R':>5s} {'A':>5s}  {'action':8s} {'C':>6s} {'alpha':>6s} "
            f"{'C_final':>7s}  {'E_wm':>5s} {'E_r':>5s} {'E_a':>5s}")
    print("MDL controller, paper defaults (Table 2): θ = "
          f"{tuple(cfg.thresholds)}, n = [{cfg.n_min:.3f}, {cfg.n_max:.3f}]", file=out)
    print("E_k = share of ‖v_meta‖² in subspace k (Lemma 1 attribution)\n", file=out)
    print(head, file=out)
    print("-" * len(head), file=out)
    e = np.asarray(d.energies)
    share = e / e.sum(-1, keepdims=True)
    for i, (label, m, r, a) in enumerate(DEMO_TRIPLES):
        print(f"{label:36s} {m:5.2f} {r:5.2f} {a:5.2f}  {Action(int(d.action[i])).name:8s} "
              f"{float(d.C[i]):6.3f} {float(d.alpha[i]):6.3f} {float(d.C_final[i]):7.3f}  "
              f"{share[i, 0]:5.2f} {share[i, 1]:5.2f} {share[i, 2]:5.2f}", file=out)


class CommandError(Exception):
    """A bad input the user must fix (not a bug): ``main`` prints it as one line and exits 2."""


class Parser(argparse.ArgumentParser):
    """argparse, except that a usage error is ONE line on stderr, ``mdl-jax: error: <command>: ...``,
    and exit 2 (argparse's default prints the usage block first). Subparsers inherit the class."""

    def error(self, message):
        cmd = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        fail(f"{cmd}{message}")


def fail(message: str, code: int = 2):
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


def _creatable(text: str, want_dir: bool) -> str:
    import os
    from pathlib import Path

    p = Path(text)
    kind = "folder" if want_dir else "file"
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a {kind} path, got {text!r}")
    if p.exists():
        if want_dir and not p.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder")
        if not want_dir and p.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} is a folder, expected a file path")
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


def config_file(text: str) -> str:
    """An MDL config file that loads (version, fields, invariants): a broken one fails at parse time."""
    existing_file(text)
    from mdl_jax import load_config

    try:
        load_config(text)
    except ValueError as e:  # ConfigFileError and the config's own checks name the field
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def remove_if_empty(path, created: bool) -> None:
    """Remove a folder this command created when it failed before writing anything into it."""
    from pathlib import Path

    p = Path(path)
    if created and p.is_dir():
        try:
            p.rmdir()  # only if empty: never deletes what a user or an earlier run put there
        except OSError:
            pass


def user_errors() -> tuple[type[BaseException], ...]:
    """The exception classes that mean bad input (printed as one line, exit 2), not a bug."""
    from mdl_jax.controller.config_file import ConfigFileError
    from mdl_jax.pipeline.data import DataError  # stdlib-only modules: keep the CLI light

    errs: list = [CommandError, DataError, ConfigFileError]
    try:
        from mdl_jax.analysis.oracle import RecordsError
        from mdl_jax.pipeline.judgement import JudgeInputError

        errs += [RecordsError, JudgeInputError]
    except ImportError:  # pragma: no cover - the analyses' extras are not installed
        pass
    return tuple(errs)


def run(args) -> int:
    """Run a parsed subcommand; a bad-input error becomes one line on stderr and exit 2."""
    try:
        return args.func(args)
    except user_errors() as e:
        # Bad input is the user's to fix, not a bug: one line that names the file and line, no
        # traceback; exit 2 like argparse's usage errors.
        fail(str(e))


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    # A skipped records line or a fallback is worth one line to a CLI user, not a source excerpt.
    return f"mdl-jax: warning: {' '.join(str(message).split())}\n"


def main(argv=None) -> int:
    """``mdl-jax``: returns the exit status (2 for bad input, with one ``mdl-jax: error:`` line)."""
    import warnings

    saved, warnings.formatwarning = warnings.formatwarning, _one_line_warning
    parser = Parser(prog="mdl-jax", description=__doc__)
    sub = parser.add_subparsers(dest="cmd")
    sub.add_parser("demo", help="decide for a handful of (M, R, A) triples and print a table")
    _add_later_commands(sub)
    try:
        args = parser.parse_args(argv)
        if args.cmd in (None, "demo"):
            demo()
            return 0
        return run(args)
    except SystemExit as e:  # parse errors, --help, and ``fail``
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        warnings.formatwarning = saved


def _add_later_commands(sub) -> None:
    """Subcommands of the pipeline (signals, reproduce, judge) and the analyses (analyze, tune)."""
    from mdl_jax.analysis import analyze, gate_scores, learned, stream_sweep
    from mdl_jax.gate import command as gate_command
    from mdl_jax.pipeline import commands, judgement
    from mdl_jax.serving import command as gateway_command

    commands.register(sub)
    judgement.register(sub)
    analyze.register(sub)
    learned.register(sub)
    gate_command.register(sub)
    gate_scores.register(sub)
    gateway_command.register(sub)
    stream_sweep.register(sub)
