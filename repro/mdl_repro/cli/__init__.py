"""The reproduction's commands, added to ``mdl-jax`` through the entry-point group ``mdl_jax.commands``
(``repro/pyproject.toml``): ``signals`` and ``reproduce`` (``experiment``), ``judge``, ``analyze``,
``tune`` (the learned MDL on a run's records) and ``score-gates``. ``reproduce`` composes the experiment
pipeline and the analyses here, at the top, so that neither has to import the other."""

from __future__ import annotations


def register(sub) -> None:
    """Add the reproduction's subcommands to ``mdl-jax``'s subparsers (the entry point's target)."""
    from mdl_jax.cli.args import add_user_errors
    from mdl_repro.analysis.oracle import RecordsError
    from mdl_repro.cli import analyze, experiment, judge, score_gates, tune
    from mdl_repro.pipeline.judgement import JudgeInputError
    from mdl_repro.pipeline.records import OtherInputs

    add_user_errors(RecordsError, JudgeInputError, OtherInputs)
    experiment.register(sub)
    judge.register(sub)
    analyze.register(sub)
    tune.register(sub)
    score_gates.register(sub)
