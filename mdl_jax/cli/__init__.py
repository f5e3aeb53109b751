"""The command line, ``mdl-jax``: the top of the house. Nothing in the library imports it.

One module per command group (``experiment``: signals and reproduce; ``judge``; ``analyze``; ``tune``;
``sweep``; ``gate``; ``score_gates``; ``gateway``; ``demo``), the argument types and the one-line error
in ``args``. Heavy modules (signals, generation) are imported inside their subcommands so
``mdl-jax demo`` and ``import mdl_jax`` stay light. ``reproduce`` composes the experiment pipeline and
the analyses here, at the top, so that neither has to import the other.
"""

from __future__ import annotations

from mdl_jax.cli.args import CommandError, Parser, fail, user_errors
from mdl_jax.cli.demo import DEMO_TRIPLES, demo

DESCRIPTION = ("The Memory Decision Layer: the controller (demo, sweep, tune), the experiment (signals, "
               "reproduce, judge, analyze, score-gates) and the memory gate (gate, gateway).")

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
    """Every subcommand but ``demo``, one module of this package per command group. Each module
    imports its heavy dependencies inside the command, so building the parser stays light."""
    from mdl_jax.cli import analyze, benchmarks, experiment, gate, gateway, judge, score_gates, sweep, tune

    experiment.register(sub)
    judge.register(sub)
    analyze.register(sub)
    tune.register(sub)
    gate.register(sub)
    score_gates.register(sub)
    gateway.register(sub)
    sweep.register(sub)
    benchmarks.register(sub)
