import os
from typing import Any

# Before torch is imported (its OpenMP runtime reads this once): two pytest-xdist workers share the two
# cores, and torch's OpenMP threads, by default, spin while they wait for each other. A thread whose
# partner was descheduled for the other worker then burns its core for nothing, which costs far more
# CPU on a loaded machine than passive waiting does (alone, spinning pays a little). The processes the tests start inherit it through os.environ.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Haystack's telemetry (PostHog) is on by default and retries its sends from a background thread: the
# tests run offline and send nothing (a user's own setting wins).
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

import jax
import numpy as np
import pytest

from tests import xla_cache

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # hypothesis is a test extra; the other tests run without it
    HAVE_HYPOTHESIS = False
else:
    HAVE_HYPOTHESIS = True

# Catch silent dtype/rank surprises in the controller (equinox's habit).
jax.config.update("jax_numpy_rank_promotion", "raise")

# The controller's test modules also run with strict dtype promotion (equinox's habit): an implicit
# int32 → float32 or float16 → float32 promotion inside the controller is an error there, not a silent
# widening. Scoped to these modules, not the whole suite: the other modules drive the pipeline, the
# signals and the gate, which mix NumPy and JAX values of several dtypes by design. (Tuning calls
# optax, whose schedules and bias corrections mix Python floats with int32 step counts: those calls
# keep JAX's standard rules inside the library, tune_program._optax_call.) A controller test that
# belongs, by its module, in another file keeps the strict rules by its mark, strict_dtype_promotion.
STRICT_DTYPE_MODULES = frozenset({
    "test_api", "test_calibration", "test_config_file", "test_decision", "test_native", "test_properties", "test_sweep",
    "test_sweep_native", "test_tuning", "test_tuning_settings",
})


@pytest.fixture(autouse=True)
def _strict_dtype_promotion(request):
    if (request.module.__name__.rsplit(".", 1)[-1] in STRICT_DTYPE_MODULES
            or request.node.get_closest_marker("strict_dtype_promotion") is not None):
        with jax.numpy_dtype_promotion("strict"):
            yield
    else:
        yield


# XLA's persistent compilation cache, shared by this run's processes (tests/xla_cache.py says why).
xla_cache.enable()

if HAVE_HYPOTHESIS:
    # Property-based tests (tests/test_properties.py). "ci", the default, is small and derandomized
    # (the same draws every run, so CI is stable); "thorough" searches fresh draws:
    #   HYPOTHESIS_PROFILE=thorough python -m pytest -q tests/test_properties.py
    # No example database: nothing is written into the checkout; a failure prints its reproducer.
    _common: dict[str, Any] = {"deadline": None, "database": None, "print_blob": True,
               "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
    settings.register_profile("ci", max_examples=25, derandomize=True, **_common)
    settings.register_profile("thorough", max_examples=500, **_common)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_sessionfinish(session):
    """Drop hypothesis' garbage-collector callback once the tests are done.

    Hypothesis times garbage collection through a callback in ``gc.callbacks`` for the rest of the
    process. A pytest-xdist worker that is still shutting down 5 s after the controller told it to
    exit (a loaded machine, a large heap to free) is sent a SIGINT by execnet; when that lands while
    the callback runs, Python cannot raise it there and prints "Exception ignored in: gc_callback"
    with a KeyboardInterrupt traceback into the test output. No test runs after this hook, so the
    callback has nothing left to time."""
    import gc

    gc.callbacks[:] = [cb for cb in gc.callbacks
                       if not getattr(cb, "__module__", "").startswith("hypothesis.")]


@pytest.fixture(params=["eager", "jit"])
def maybe_jit(request):
    """Every controller property is checked with the function run eagerly and jitted."""
    if request.param == "jit":
        return jax.jit
    return lambda f, **kw: f


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """This session's own cache folder (embeddings): the runs and gates the tests start
    write there, not into the user's cache. The two parts that are expensive to make and keyed by
    their content, the converted SmolLM2 checkpoints (``models/``, ~15 s, once for every dtype) and the compiled
    native kernels (``native/``, ~10 s per ISA) and the judged gold set (``judged/``, ~18 s of MiniLM),
    link to the default cache instead, so a fresh clone makes each once, not once more per session
    folder (or per pytest-xdist worker)."""
    from mdl_jax._paths import default_cache_dir

    d = tmp_path_factory.mktemp("emb-cache")
    for part in ("models", "native", "judged"):
        shared = default_cache_dir() / part
        shared.mkdir(parents=True, exist_ok=True)
        (d / part).symlink_to(shared, target_is_directory=True)
    return d


@pytest.fixture(scope="session")
def embedder(cache_dir):
    from mdl_jax.signals.embeddings import Embedder

    return Embedder(cache_dir=cache_dir)  # the real bundled all-MiniLM-L6-v2, loaded once


@pytest.fixture(scope="session")
def tqa():
    """The first 30 TruthfulQA items of the shared copy."""
    from mdl_repro.pipeline import data

    return data.load("truthfulqa", limit=30)


@pytest.fixture(scope="session")
def halu():
    """The first 30 HaluEval-QA items of the shared copy."""
    from mdl_repro.pipeline import data

    return data.load("halueval", limit=30)


@pytest.fixture(scope="session")
def local_backend():
    from mdl_repro.pipeline.generation import LocalBackend

    return LocalBackend(batch_size=8, max_new_tokens=12)  # the real bundled SmolLM2, loaded once


@pytest.fixture(scope="session")
def model_server():
    """Base URL (``http://127.0.0.1:PORT/v1``) of one ``python -m mdl_repro.serve`` with its default
    arguments (the bundled SmolLM2), started once per session for the tests that only need a plain
    server: each start costs ~8 s of CPU to import torch and load the model. Tests that need other
    flags (failures, limits, a restart) start their own."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("fastapi")
    proc = subprocess.Popen([sys.executable, "-m", "mdl_repro.serve", "--port", "0"],
                            cwd=Path(__file__).resolve().parents[1], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ))
    try:
        line = proc.stdout.readline()  # printed once the model is loaded and the port bound
        assert "serving" in line, line
        yield line.split(" on ")[-1].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def cli(monkeypatch, capsys):
    """Run ``mdl-jax ARGV`` in this process: ``cli([...], ENV=...)`` → (exit status, stdout, stderr).

    What ``python -m mdl_jax`` runs (``mdl_jax.cli.main``), without a fresh interpreter's ~10 s of
    imports, model loads and compilations: the loaded models and compiled programs are this session's.
    Tests that need a real process (a kill, a second process holding a lock, the installed entry
    point) start one; the others call this."""
    from mdl_jax.cli import main

    def run(argv, **env):
        for k, v in env.items():
            monkeypatch.setenv(k, str(v))
        capsys.readouterr()
        rc = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return rc, out, err

    return run


# --- Two workers (scripts/test.sh runs `pytest -n auto --dist loadgroup`) --------------------------
# The suite is CPU-bound on 2 cores, but one process keeps ~1.2 of them busy (servers answering, models
# loading, single-threaded Python). Two pytest-xdist workers fill the rest. Every test that runs
# SmolLM2 (in this process or in a server it starts) is one group, on one worker: two workers each
# running torch on both cores thrash (each test ran 2-3× slower), and the model is loaded once. Every
# other file is its own group (module fixtures made once). The SmolLM2 group is the longest, so it is
# sent first, then the longest of the rest; a serial run (no -n) runs the same order.
LLM_FILES = ("test_experiment", "test_fidelity", "test_selective", "test_llm_judge", "test_generation_engines",
             "test_serving", "test_serving_load")
LONG_FILES = ("test_tuning", "test_native", "test_docs", "test_scale", "test_decision", "test_lint",
              "test_analysis", "test_ray_data", "test_packaging")


def _group(item) -> str:
    stem = item.path.stem
    return "llm" if stem in LLM_FILES else stem


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    if config.pluginmanager.hasplugin("xdist"):  # (the mark is xdist's: unknown without it)
        for item in items:
            item.add_marker(pytest.mark.xdist_group(_group(item)))

    def rank(item):
        g = _group(item)
        return 0 if g == "llm" else 1 + LONG_FILES.index(g) if g in LONG_FILES else 1 + len(LONG_FILES)

    items.sort(key=rank)  # stable: each file keeps its own order
