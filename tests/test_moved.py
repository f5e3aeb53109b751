"""The seam between the library and the paper's reproduction (``mdl_jax._moved``, ``mdl_jax.cli``): the
old module names resolve to the moved module objects with a DeprecationWarning; the reproduction's
commands join ``mdl-jax`` through the ``mdl_jax.commands`` entry points; and without the reproduction
installed, both the old names and the commands say how to install it. (That nothing in the library
imports the reproduction is ``tests/test_layers.py``'s.)"""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

import mdl_jax.cli as cli
from mdl_jax import _moved


def _forget(monkeypatch, prefix: str) -> None:
    for name in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_an_old_name_is_the_moved_module_itself_with_a_deprecation_warning(old, monkeypatch):
    _forget(monkeypatch, old)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {_moved.MOVED[old]}"):
        mod = importlib.import_module(old)
    assert mod is importlib.import_module(_moved.MOVED[old])


def test_a_submodule_of_an_old_name_is_never_loaded_a_second_time(monkeypatch):
    _forget(monkeypatch, "mdl_jax.pipeline")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from mdl_jax.pipeline import data as old_data
        from mdl_jax.pipeline.stores import Store as OldStore  # type: ignore[import-not-found]
    from mdl_repro.pipeline import data, stores

    assert old_data is data and OldStore is stores.Store
    assert sys.modules["mdl_jax.pipeline.stores"] is stores
    assert stores.__spec__.name == stores.__name__ == "mdl_repro.pipeline.stores"  # still itself


def test_an_old_name_without_the_reproduction_says_how_to_install_it(monkeypatch):
    # A fake for the failure path: the reproduction made unimportable in this process.
    _forget(monkeypatch, "mdl_jax.pipeline")
    _forget(monkeypatch, "mdl_repro")
    monkeypatch.setitem(sys.modules, "mdl_repro", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ModuleNotFoundError, match=r"mdl_jax.pipeline moved to mdl_repro.pipeline.*pip install"):
            importlib.import_module("mdl_jax.pipeline")


def test_the_reproductions_commands_join_through_their_entry_point(capsys):
    assert cli.main(["reproduce", "--help"]) == 0
    assert "--n-questions" in capsys.readouterr().out
    assert cli.main(["tune", "--help"]) == 0


@pytest.mark.parametrize("argv", [["reproduce", "--n-questions", "2"], ["judge", "x.jsonl"], ["tune"]])
def test_without_the_reproduction_its_commands_are_one_line_naming_the_install(argv, monkeypatch, capsys):
    # A fake for the failure path: no distribution registers commands.
    import importlib.metadata as md

    monkeypatch.setattr(md, "entry_points", lambda **kw: [])
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mdl-jax: error: {argv[0]}: ") and "pip install -e ./repro" in err[0]


def test_an_added_command_groups_errors_are_bad_input_not_bugs():
    from mdl_jax.cli.args import add_user_errors, user_errors
    from mdl_repro.analysis.oracle import RecordsError
    from mdl_repro.pipeline.judgement import JudgeInputError

    # the entry point registers them when the command line is built
    cli._add_later_commands(cli.Parser(prog="mdl-jax").add_subparsers())
    assert {RecordsError, JudgeInputError} <= set(user_errors())
    with pytest.raises(TypeError, match="expected exception classes"):
        add_user_errors("not a class")


@pytest.mark.parametrize("old", ["mdl_jax.serve", "mdl_jax.serving.model_server"])
def test_python_m_an_old_name_without_the_reproduction_is_one_line_and_exit_2(old, monkeypatch, capsys):
    # A fake for the failure path, as above; `python -m mdl_jax.serve` runs exactly this.
    _forget(monkeypatch, "mdl_repro")
    monkeypatch.setitem(sys.modules, "mdl_repro", None)
    assert _moved.run_as_main(old) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"mdl-jax: warning: python -m {old} is deprecated")
    assert len(err) == 2 and err[1].startswith(f"mdl-jax: error: {old} moved to") and "pip install" in err[1]


@pytest.mark.slow  # a fresh Python process
def test_python_m_an_old_name_runs_the_moved_command():
    import subprocess

    r = subprocess.run([sys.executable, "-m", "mdl_jax.serving.model_server", "--help"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "usage: python -m mdl_repro.serve" in r.stdout, r.stderr[-2000:]
    assert "deprecated; use python -m mdl_repro.model_server" in r.stderr


def test_a_reproduction_that_does_not_load_leaves_the_library_commands_working(monkeypatch, capsys):
    # A real entry point whose module does not exist: what a half-removed install looks like.
    import importlib.metadata as md

    ep = md.EntryPoint(name="repro", value="mdl_repro_missing_module:register", group=cli.ENTRY_POINTS)
    monkeypatch.setattr(md, "entry_points", lambda **kw: [ep])
    assert cli.main(["demo"]) == 0
    capsys.readouterr()
    assert cli.main(["reproduce", "--n-questions", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "installed but does not load" in err[0] and "mdl_repro_missing_module" in err[0]
