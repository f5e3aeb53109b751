"""The habits CI keeps: ruff (lint and import order, configured in pyproject.toml) and mypy (types, the
same file) are clean on the package. Run by the README's test command, like every other test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_ruff_is_clean_on_the_package():
    pytest.importorskip("ruff", reason="the dev extra: pip install -e '.[dev]'")
    r = _run("ruff", "check", "mdl_jax")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


@pytest.mark.slow
def test_mypy_is_clean_on_the_package(tmp_path):
    pytest.importorskip("mypy", reason="the dev extra: pip install -e '.[dev]'")
    # a cache outside the checkout: a fresh clone stays clean, and a stale cache never hides an error
    r = _run("mypy", "--cache-dir", str(tmp_path / "mypy-cache"), "mdl_jax")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_the_checkers_would_catch_an_error(tmp_path):
    # guard against a configuration that silently checks nothing (an exclude that matches all, ...)
    pytest.importorskip("ruff")
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    r = _run("ruff", "check", "--config", str(ROOT / "pyproject.toml"), str(bad))
    assert r.returncode != 0 and "F401" in r.stdout
    pytest.importorskip("mypy")
    typed = tmp_path / "typed.py"
    typed.write_text("def f(x: int) -> int:\n    return x\n\n\nf('a')\n")
    r = _run("mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "c"), str(typed))
    assert r.returncode != 0 and "arg-type" in r.stdout, r.stdout
