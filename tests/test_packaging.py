"""What a user gets from ``pip install mdl-jax``: the wheel and the sdist carry the native kernel's source,
py.typed and the shipped resources; the installed wheel, outside the checkout, runs ``mdl-jax demo``, its
own native kernel (compiled from the shipped .cc) and ``mdl-jax gate``. And the version is one number
everywhere it is written down."""

from __future__ import annotations

import json
import os
import re
import shutil
import site as pysite
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest

from mdl_jax._version import __version__

ROOT = Path(__file__).resolve().parents[1]

# What the wheel must carry besides the Python modules (pyproject.toml's package-data).
SHIPPED = ["mdl_jax/py.typed", "mdl_jax/engines/_native/decide_cpu.cc", "mdl_jax/signals/_native/conflict.cc"]
# What the reproduction's wheel must carry (repro/pyproject.toml's package-data).
REPRO_SHIPPED = ["mdl_repro/py.typed", "mdl_repro/pipeline/resources/gold_labels.jsonl",
                 "mdl_repro/pipeline/resources/calibrated/smollm2-truthfulqa.json",
                 "mdl_repro/pipeline/resources/calibrated/smollm2-halueval.json",
                 "mdl_repro/analysis/resources/gold_verdicts.jsonl"]


def test_citation_cff_names_the_packages_version():
    text = (ROOT / "CITATION.cff").read_text(encoding="utf-8")
    found = re.findall(r"^version:\s*\"?([^\"\s]+)\"?\s*$", text, flags=re.M)
    assert found == [__version__], f"CITATION.cff says {found}, mdl_jax/_version.py says {__version__}"


def test_the_version_is_defined_once():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in meta["project"] and "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "mdl_jax._version.__version__"}
    assert f"## [{__version__}]" in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def test_the_reproduction_is_released_at_the_librarys_version_and_pins_it():
    from mdl_repro._version import __version__ as repro_version

    meta = tomllib.loads((ROOT / "repro" / "pyproject.toml").read_text(encoding="utf-8"))
    assert repro_version == __version__
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "mdl_repro._version.__version__"}
    assert f"mdl-jax[experiments]=={__version__}" in meta["project"]["dependencies"]
    assert meta["project"]["entry-points"]["mdl_jax.commands"] == {"repro": "mdl_repro.cli:register"}


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert r.returncode == 0, f"{cmd[:4]} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r


# Run inside the fresh venv (cwd outside the checkout): the installed copy's native kernel against the
# pure-JAX definition of one record, vmapped.
NATIVE_CHECK = """
import json, sys
import jax, numpy as np
import mdl_jax
from mdl_jax import MDLConfig, decide, decide_one
from mdl_jax.engines import native
from mdl_jax.signals import conflict_native

ok = native.load()
lexical = conflict_native.status()
texts = ["X is safe", "X is not safe", "Y is blue"]
x = np.random.default_rng(0).uniform(size=(3, 4099)).astype(np.float32)
cfg = MDLConfig()
d = decide(*x, cfg, engine="native" if ok else "jax")  # the kernel, by name, where it builds
ref = jax.vmap(decide_one, in_axes=(0, 0, 0, None))(*x, cfg)
cf = np.asarray(ref.C_final)
near = np.any(np.abs(cf[:, None] - np.asarray(cfg.thresholds, np.float32)) < 1e-5, axis=-1)
print(json.dumps({
    "file": mdl_jax.__file__, "source": str(native.SOURCE), "ok": ok, "status": native.status(),
    "threads": native.threads_used()[0], "compiler": native.compiler() is not None,
    "max_diff": {f: float(np.max(np.abs(np.asarray(getattr(d, f)) - np.asarray(getattr(ref, f)))))
                 for f in ("C", "alpha", "C_final", "v_meta", "norm", "g_A")},
    "actions_equal": bool(np.array_equal(np.asarray(d.action)[~near], np.asarray(ref.action)[~near])),
    "actions": sorted({int(a) for a in np.asarray(d.action)}),
    "lexical": lexical, "lexical_source": str(conflict_native._SOURCE),
    "lexical_counts": conflict_native.group_counts(texts, [3]).tolist(),
}))
"""


def _wheel_files(whl: Path, shipped, dist_info_file: str) -> tuple[set[str], str]:
    """(the wheel's file names, the text of one of its dist-info files), after checking it holds every
    path in ``shipped``."""
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        dist_info = whl.name.split("-py3-")[0] + ".dist-info"
        text = z.read(f"{dist_info}/{dist_info_file}").decode()
    missing = [p for p in shipped if p not in names]
    assert not missing, f"{whl.name} lacks {missing}"
    return names, text


@pytest.mark.slow
def test_the_wheel_installed_outside_the_checkout_runs(tmp_path):
    # Build from a copy of what the sdist is made of: setuptools writes build/ and *.egg-info beside
    # pyproject.toml, which would leave the checkout dirty. --no-isolation: the build needs no network
    # (setuptools comes from this environment). build makes the sdist, then the wheel FROM the sdist,
    # so the wheel checked below is also the proof that the sdist builds.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "CITATION.cff"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "mdl_jax", src / "mdl_jax",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)])
    (whl,), (sdist,) = dist.glob("*.whl"), dist.glob("*.tar.gz")
    assert whl.name == f"mdl_jax-{__version__}-py3-none-any.whl"

    names, meta = _wheel_files(whl, SHIPPED, "METADATA")
    assert f"mdl_jax-{__version__}.dist-info/licenses/LICENSE" in names
    assert f"\nVersion: {__version__}\n" in meta and "\nLicense-Expression: MIT\n" in meta
    assert not any(n.startswith(("tests/", "experiments/", "mdl_repro/")) for n in names)
    # the paper's reproduction is not in the library's wheel: only the deprecated aliases' stubs
    moved = sorted(n for n in names if n.startswith(("mdl_jax/pipeline/", "mdl_jax/analysis/")))
    assert moved == ["mdl_jax/analysis/__init__.py", "mdl_jax/pipeline/__init__.py"], moved
    with tarfile.open(sdist) as t:
        snames = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    missing = [p for p in SHIPPED + ["LICENSE", "pyproject.toml"] if p not in snames]
    assert not missing, f"the sdist lacks {missing}"

    # A fresh venv. Third-party packages (jax, torch, sentence-transformers, ...) come from this
    # environment's site-packages (from PyPI they would take minutes); mdl_jax itself is the wheel,
    # installed non-editable into the venv. cwd is outside the checkout and PYTHONPATH is dropped, so
    # the checkout is not on sys.path; the editable install of the checkout this environment may hold
    # is a finder that comes after the venv's site-packages.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py, cli = venv / "bin" / "python", venv / "bin" / "mdl-jax"
    # Not --system-site-packages: run from inside a virtual environment, that exposes the BASE
    # interpreter's packages (no jax there), not this environment's. A .pth line that adds this
    # environment's site folders (after the venv's own, so the wheel wins) works from both.
    venv_site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          cwd=tmp_path).stdout.strip())
    parents = [p for p in pysite.getsitepackages() if Path(p).is_dir()]
    (venv_site / "_outer_env.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in parents), encoding="utf-8")
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--force-reinstall",
          "--no-index", "--no-compile", "--quiet", str(whl)])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(MDL_JAX_CACHE_DIR=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp_path, env=env).stdout.strip())
    assert site.is_relative_to(venv)

    demo = _run([str(cli), "demo"], cwd=tmp_path, env=env).stdout
    for label in ("Active", "Supp", "Silent", "Opt-Out"):
        assert re.search(rf"\s{re.escape(label)}\s", demo), f"demo printed no {label}:\n{demo}"

    got = json.loads(_run([str(py), "-c", NATIVE_CHECK], cwd=tmp_path, env=env).stdout.strip().splitlines()[-1])
    assert Path(got["file"]).is_relative_to(site), f"imported {got['file']}, not the installed wheel"
    assert Path(got["source"]).is_relative_to(site) and Path(got["source"]).is_file()
    if got["compiler"]:  # a machine with a C++ compiler must build it (else decide runs pure JAX)
        assert got["ok"], got["status"]
        # built from the shipped .cc into this test's cache, and the kernel is what decide ran
        assert Path(got["status"]["path"]).is_relative_to(tmp_path / "cache"), got["status"]
        assert got["threads"] > 0
    assert all(v <= 2e-6 for v in got["max_diff"].values()), got["max_diff"]
    # the conflict detector's source ships too, and builds into this test's cache where a compiler is
    assert Path(got["lexical_source"]).is_relative_to(site) and Path(got["lexical_source"]).is_file()
    if got["compiler"]:
        assert got["lexical"]["available"], got["lexical"]
        assert Path(got["lexical"]["path"]).is_relative_to(tmp_path / "cache"), got["lexical"]
    assert got["lexical_counts"] == [1]
    assert got["actions_equal"] and len(got["actions"]) > 1

    rows = [{"query": "What is the boiling point of water at sea level?",
             "memories": ["Water boils at 100 degrees Celsius at sea level.",
                          "At sea level, water boils at 100 °C (212 °F)."]},
            {"query": "Who wrote Hamlet?", "memories": ["The Eiffel Tower is in Paris."]},
            {"query": "Is it safe to eat raw cookie dough?", "memories": []}]
    src_rows, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src_rows.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = _run([str(cli), "gate", str(src_rows), "--out", str(out), "--no-progress"], cwd=tmp_path, env=env)
    assert "3 rows decided" in r.stderr
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["query"] for g in got] == [r["query"] for r in rows]
    # the installed gate's actions are the controller's on the signals it reports
    from mdl_jax import Action, decide

    d = decide(*(np.array([g[f"mdl_{k}"] for g in got], np.float32) for k in "MRA"))
    assert [g["mdl_action"] for g in got] == [Action(int(a)).label for a in np.asarray(d.action)]
    assert got[2]["mdl_M"] == 0.0 and got[2]["mdl_action"] == "Opt-Out"  # no memories at A = 0.5
    assert got[0]["mdl_M"] > got[1]["mdl_M"]  # MiniLM: the on-topic memories are the more relevant

    # The reproduction's own wheel, built the same way, joins the command line through its entry point.
    rsrc = tmp_path / "rsrc"
    shutil.copytree(ROOT / "repro", rsrc, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info",
                                                                       "build"))
    _run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(dist), str(rsrc)])
    (rwhl,) = dist.glob("mdl_jax_repro-*.whl")
    assert rwhl.name == f"mdl_jax_repro-{__version__}-py3-none-any.whl"
    rnames, ep = _wheel_files(rwhl, REPRO_SHIPPED, "entry_points.txt")
    assert not any(n.startswith("mdl_jax/") for n in rnames)
    assert "[mdl_jax.commands]" in ep and "mdl_repro.cli:register" in ep
    # (This environment's editable install of the reproduction is visible from the venv too, so what the
    # library does without it is tested in-process: tests/test_cli.py.)
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--force-reinstall",
          "--no-index", "--no-compile", "--quiet", str(rwhl)])
    r = _run([str(cli), "reproduce", "--help"], cwd=tmp_path, env=env)
    assert "--n-questions" in r.stdout
    r = _run([str(py), "-W", "error::DeprecationWarning", "-c",
              "import mdl_repro.pipeline.systems as m; print(m.__file__)"], cwd=tmp_path, env=env)
    assert Path(r.stdout.strip()).is_relative_to(site)
