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
