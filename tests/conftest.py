import os

import jax
import numpy as np
import pytest

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # hypothesis is a test extra; the other tests run without it
    settings = None

# Catch silent dtype/rank surprises in the controller (equinox's habit).
jax.config.update("jax_numpy_rank_promotion", "raise")

if settings is not None:
    # Property-based tests (tests/test_properties.py). "ci", the default, is small and derandomized
    # (the same draws every run, so CI is stable); "thorough" searches fresh draws:
    #   HYPOTHESIS_PROFILE=thorough python -m pytest -q tests/test_properties.py
    # No example database: nothing is written into the checkout; a failure prints its reproducer.
    _common = {"deadline": None, "database": None, "print_blob": True,
               "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
    settings.register_profile("ci", max_examples=25, derandomize=True, **_common)
    settings.register_profile("thorough", max_examples=500, **_common)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


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
    return tmp_path_factory.mktemp("emb-cache")


@pytest.fixture(scope="session")
def embedder(cache_dir):
    from mdl_jax.signals.embeddings import Embedder

    return Embedder(cache_dir=cache_dir)  # the real bundled all-MiniLM-L6-v2, loaded once


@pytest.fixture(scope="session")
def local_backend():
    from mdl_jax.pipeline.generation import LocalBackend

    return LocalBackend(batch_size=8, max_new_tokens=24)  # the real bundled SmolLM2, loaded once


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
