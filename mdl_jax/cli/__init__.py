"""The command line, ``mdl-jax``: the top of the house. Nothing in the library imports it.

One module per command group of the library (``sweep``, ``gate``, ``gateway``, ``benchmarks``,
``demo``), the argument types and the one-line error in ``args``. Heavy modules (signals, the gate's
embedder) are imported inside their subcommands so ``mdl-jax demo`` and ``import mdl_jax`` stay light.

Other distributions add command groups through the entry-point group ``mdl_jax.commands``: each entry
is a function ``register(subparsers)``. The paper's reproduction (``mdl-jax-repro``, ``repro/`` in the
repository) adds ``signals``, ``reproduce``, ``judge``, ``analyze``, ``tune`` and ``score-gates`` that
way, so the library never imports it; without it installed those names print how to install it.
"""

from __future__ import annotations

import argparse

from mdl_jax.cli.args import CommandError, Parser, fail, user_errors
from mdl_jax.cli.demo import DEMO_TRIPLES, demo

DESCRIPTION = ("The Memory Decision Layer: the controller (demo, sweep), the memory gate (gate, gateway), the "
               "field's benchmarks (benchmarks) and, with mdl-jax-repro installed, the paper's experiment "
               "(signals, reproduce, judge, analyze, tune, score-gates).")

ENTRY_POINTS = "mdl_jax.commands"
# The reproduction's commands, named here only to tell a user without it installed where they went.
REPRO_COMMANDS = ("signals", "reproduce", "judge", "analyze", "tune", "score-gates")
REPRO_INSTALL = "pip install -e ./repro from the repository's root (the mdl-jax-repro distribution)"

__all__ = ["CommandError", "DEMO_TRIPLES", "Parser", "demo", "fail", "main", "run", "user_errors"]


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

    from mdl_jax.runtime import synchronous_cpu_dispatch

    # Before any command starts JAX's CPU backend: the commands and the gateway decide per query.
    # (Called in a process where JAX runs already, e.g. from a test, it changes nothing, silently.)
    synchronous_cpu_dispatch(warn_if_late=False)
    saved, warnings.formatwarning = warnings.formatwarning, _one_line_warning
    parser = Parser(prog="mdl-jax", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="cmd")
    sub.add_parser("demo", help="decide for a handful of (M, R, A) triples and print a table",
                   description="Decides seven named (M, R, A) cases, one or more of each action, with the default "
                               "config and prints action, C, α, C_final and each subspace's share of ‖v_meta‖². "
                               "Cost: a second or two (compiling the controller).")
    _add_later_commands(sub)
    try:
        # Known args only, so that a command that is not installed can say so whatever flags follow it;
        # every installed command still refuses what it does not know, as parse_args would.
        args, extra = parser.parse_known_args(argv)
        if extra and not getattr(args, "not_installed", False):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        if args.cmd in (None, "demo"):
            demo()
            return 0
        return run(args)
    except SystemExit as e:  # parse errors, --help, and ``fail``
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BrokenPipeError:
        # The reader of stdout left (``mdl-jax demo | head``): stop quietly, as a Unix tool does. stdout
        # goes to /dev/null first, so the interpreter's own flush at exit does not raise again.
        import os
        import sys

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 1
    finally:
        warnings.formatwarning = saved


def _add_later_commands(sub) -> None:
    """Every subcommand but ``demo``: the library's, one module of this package per command group, then
    those that installed distributions register under ``mdl_jax.commands``. Each module imports its
    heavy dependencies inside the command, so building the parser stays light."""
    from importlib.metadata import entry_points

    from mdl_jax.cli import benchmarks, gate, gateway, sweep

    gate.register(sub)
    gateway.register(sub)
    sweep.register(sub)
    benchmarks.register(sub)
    broken = []
    for ep in sorted(entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        try:
            ep.load()(sub)
        except Exception as e:  # a broken install must not take the library's own commands down with it
            broken.append(f"{ep.value}: {type(e).__name__}: {e}")
    for name in REPRO_COMMANDS:
        if name not in sub.choices:
            p = sub.add_parser(name, help=f"(needs mdl-jax-repro: {REPRO_INSTALL})", add_help=False)
            p.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
            p.set_defaults(func=_not_installed(name, broken), not_installed=True)


def _not_installed(name: str, broken: list[str]):
    def cmd(args) -> int:
        if broken:
            raise CommandError(f"{name}: the paper's reproduction is installed but does not load "
                               f"({'; '.join(broken)}); reinstall it: {REPRO_INSTALL}")
        raise CommandError(f"{name}: this command is the paper's reproduction, which is not installed: {REPRO_INSTALL}")
    return cmd
