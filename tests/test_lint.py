"""The habits CI keeps: ruff (lint and import order, configured in pyproject.toml) and mypy (types, the
same file) are clean on the package, its tests and the experiments; the package's comments say why,
not how fast. Run by the README's test command, like every other test."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=900)


# What ruff and mypy check, here and in .pre-commit-config.yaml.
CHECKED = ("mdl_jax", "tests", "experiments")


def test_ruff_is_clean_on_the_package_tests_and_experiments():
    pytest.importorskip("ruff", reason="the dev extra: pip install -e '.[dev]'")
    r = _run("ruff", "check", *CHECKED)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


@pytest.mark.slow
def test_mypy_is_clean_on_the_package_tests_and_experiments(tmp_path):
    pytest.importorskip("mypy", reason="the dev extra: pip install -e '.[dev]'")
    # a cache outside the checkout: a fresh clone stays clean, and a stale cache never hides an error
    r = _run("mypy", "--cache-dir", str(tmp_path / "mypy-cache"), *CHECKED)
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


# --- comments say why ----------------------------------------------------------------------------

# What a measurement looks like in prose. A duration or a rate (a number and a unit of time), a
# speed-up (a number glued to ×, or "N× / N x faster, slower, as fast, longer"), a pointer into the
# tracker ("issue 16", "issue #416"), a work session, a date-stamped measurement, or the machine a
# figure came from ("dev VM", "2-core", "measured here").
_NARRATION = {
    "timing": re.compile(r"(?<![\w.])\d+(?:[.,]\d+)?\s*(?:µs|us|ms|s|sec|seconds?|min|minutes?)\b"),
    "rate": re.compile(r"(?<![\w.])\d[\d.,]*(?:\s*×\s*10\^\d+)?\s*[A-Za-z-]*/s\b"),
    "ratio": re.compile(r"(?<![\w.])\d+(?:\.\d+)?×(?!\s*\d)"
                        r"|(?<![\w.])\d+(?:\.\d+)?\s*[x×]\s+(?:faster|slower|as fast|longer|quicker)\b", re.I),
    "issue": re.compile(r"\bissues?\s*#?\d+", re.I),
    "session": re.compile(r"\bsession\s*\d+", re.I),
    "date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    "machine": re.compile(r"\bdev (?:VM|CPU|machine)\b|\b\d+-core\b|\bZen 4 VM\b|\bmeasured (?:here|on)\b", re.I),
}

# A number with a unit of time that states what the code DOES is a fact, not a measurement: a
# default, a timeout, a backoff or a wait the code itself performs. Such phrases are allowed by file
# and exact text, so a new one is a decision someone writes down here, never a loophole.
_FACTS = {
    "repro/mdl_repro/pipeline/judgement_llm.py": ("(0.5 s, 1 s, 2 s, ...)",),
}

_NOT_YET: frozenset[str] = frozenset()


def _prose(path: Path):
    """(line, text) of every comment and every string statement (docstrings) in a Python file."""
    src = path.read_text(encoding="utf-8")
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for i, line in enumerate(node.value.value.splitlines()):
                yield node.lineno + i, line


def _narration(path: Path, rel: str) -> list[str]:
    found = []
    for line, text in _prose(path):
        for fact in _FACTS.get(rel, ()):
            text = text.replace(fact, "")
        for kind, rx in _NARRATION.items():
            found += [f"{rel}:{line}: {kind} {m.group(0)!r}" for m in rx.finditer(text)]
    return found


def test_package_comments_carry_no_timings_ratios_issue_numbers_or_machines():
    """Comments and docstrings in mdl_jax/ and repro/mdl_repro/ say why the code is as it is, never how fast it ran, where,
    or in which ticket: such a figure is true of one machine on one day and goes stale on the next.
    The measured numbers live in docs/benchmarks.md and the CHANGELOG.

    Flagged in every comment and string statement: a duration or rate (``30 µs``, ``1.2 s``,
    ``21 texts/s``), a speed-up (``2.3×``, ``3x faster``), ``issue 16`` / ``issue #416``,
    ``session 20``, a date, and machine names (``dev VM``, ``2-core``, ``measured here``). The rule
    for units: a duration the code itself sets (a default, a timeout, a backoff) is a fact about the
    code and may stay, listed in ``_FACTS`` by file and exact phrase; a duration something took is a
    measurement and may not. Dimensions written with a spaced × (``21 × 21``, ``2×2``) are shapes, not
    ratios, and pass."""
    found = []
    for path in sorted([*(ROOT / "mdl_jax").rglob("*.py"), *(ROOT / "repro" / "mdl_repro").rglob("*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel not in _NOT_YET:
            found += _narration(path, rel)
    assert not found, "narration in comments (say why; numbers go to docs/benchmarks.md):\n" + "\n".join(found)


# The most lines one module of the library may have: a module a reader takes in at one sitting, with one
# job. The reproduction (repro/) is the paper's code, held to the layering but not to this.
MODULE_LINES = 600


def test_no_module_of_the_library_is_longer_than_a_sitting():
    long = sorted(f"{p.relative_to(ROOT).as_posix()}: {n} lines" for p in (ROOT / "mdl_jax").rglob("*.py")
                  if (n := len(p.read_text(encoding="utf-8").splitlines())) > MODULE_LINES)
    assert not long, f"library modules over {MODULE_LINES} lines (split by job):\n" + "\n".join(long)


# Everywhere else the project speaks (its docs, changelog, experiments, tests, committed run notes): no
# pointer into the tracker, no work session, no nickname of a machine of ours. Timings may stand there (the
# docs are where they belong); the CPU is named by its model and flags, never "the dev VM".
_TRACKER = {"issue": re.compile(r"(?:\b|(?<=\\n))issues?\s*#?\d+|(?<!RFC )\b\d{1,3} §\d", re.I),
            "session": re.compile(r"\bsessions?\s*\d+", re.I),
            "machine": re.compile(r"\bdev (?:VM|CPU|machine)\b", re.I)}


def _project_texts() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "*.md", "*.py", "*.toml", "*.yml", "*.yaml", "*.sh", "*.cfg"],
                             cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode:
        pytest.skip("not a git checkout: the tracked files are not known")
    return [ROOT / f for f in tracked.stdout.splitlines() if f != "tests/test_lint.py" and (ROOT / f).is_file()]


def _tracker_refs(path: Path, rel: str) -> list[str]:
    return [f"{rel}:{n}: {kind} {m.group(0)!r}"
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            for kind, rx in _TRACKER.items() for m in rx.finditer(line)]


def test_the_project_names_no_issue_numbers_sessions_or_our_machines():
    """The docs, changelog, experiments and tests describe the project, not how its work was organised:
    ``issue #25``, ``session 21`` and ``the dev VM`` mean nothing to a reader and go stale."""
    found = [f for p in _project_texts() for f in _tracker_refs(p, p.relative_to(ROOT).as_posix())]
    assert not found, "name the change, the CPU (model and flags), not the ticket or session:\n" + "\n".join(found)


def test_the_tracker_check_catches_each_kind(tmp_path):
    bad = tmp_path / "bad.md"
    bad.write_text("Issue #25 §3, session 21: faster on the dev VM.\nsessions 25-26; issue 7\n"
                   'print("\\nIssue 25 targets"); see 19 §6\n')
    found = _tracker_refs(bad, "bad.md")
    assert {f.split()[1] for f in found} == set(_TRACKER) and len(found) == 7, found
    ok = tmp_path / "ok.md"
    ok.write_text("One plain model server per test session; ONNX Runtime sessions; an issue tracker; "
                  "RFC 9112 §6.1; RFC 793 §3; docs/benchmarks.md §4.\n")
    assert _tracker_refs(ok, "ok.md") == []


def test_the_narration_check_catches_each_kind(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('"""Runs in 12.5 µs on the dev VM (issue 16), 2.3× as fast since session 20."""\n'
                   "x = 1  # 3x faster on the 2-core box, 21 texts/s, measured here 2026-11-30\n"
                   "y = 2  # a 21 × 21 grid of 2×2 blocks\n")
    kinds = {f.split()[1] for f in _narration(bad, "bad.py")}
    assert kinds == set(_NARRATION), kinds
    assert not [f for f in _narration(bad, "bad.py") if ":3:" in f]
    ok = tmp_path / "ok.py"
    ok.write_text('"""Backoff between tries (0.5 s, 1 s, 2 s, ...)."""\n')
    assert _narration(ok, "repro/mdl_repro/pipeline/judgement_llm.py") == []
    assert _narration(ok, "elsewhere.py")


def test_the_commit_hooks_check_what_the_suite_checks():
    hooks = (ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8")
    assert "files: ^(mdl_jax|tests|experiments)/" in hooks
    assert "entry: mypy " + " ".join(CHECKED) in hooks
