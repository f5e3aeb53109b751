import jax
import numpy as np
import pytest

# Catch silent dtype/rank surprises in the controller (equinox's habit).
jax.config.update("jax_numpy_rank_promotion", "raise")


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
    from mdl_jax.pipeline.embeddings import Embedder

    return Embedder(cache_dir=cache_dir)  # the real bundled all-MiniLM-L6-v2, loaded once


@pytest.fixture(scope="session")
def local_backend():
    from mdl_jax.pipeline.generation import LocalBackend

    return LocalBackend(batch_size=8, max_new_tokens=24)  # the real bundled SmolLM2, loaded once
