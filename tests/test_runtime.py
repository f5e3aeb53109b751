"""mdl_jax.runtime and import side effects: ``import mdl_jax`` changes no JAX setting; synchronous CPU
dispatch is an explicit call, which works before JAX's CPU backend starts and says so when too late."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, **env) -> str:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("JAX_CPU_ENABLE_ASYNC_DISPATCH", "MDL_JAX_ASYNC_DISPATCH")}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**clean, **env})
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_importing_mdl_jax_leaves_every_jax_config_value_unchanged():
    code = (
        "import json, jax\n"
        "before = {k: repr(v) for k, v in jax.config.values.items()}\n"
        "import mdl_jax, mdl_jax.controller.sweep, mdl_jax.controller.tuning\n"
        "after = {k: repr(v) for k, v in jax.config.values.items()}\n"
        "from jax._src import xla_bridge\n"
        "print(json.dumps({'changed': sorted(k for k in before.keys() | after.keys() "
        "if before.get(k) != after.get(k)), 'n': len(before), "
        "'backend_started': bool(xla_bridge._backends)}))\n")
    out = json.loads(_python(code).strip().splitlines()[-1])
    assert out["n"] > 50, out   # the comparison saw JAX's settings
    assert out["changed"] == [], out
    assert not out["backend_started"], out   # importing starts no backend either


def test_synchronous_cpu_dispatch_before_the_backend_starts_takes_effect():
    code = (
        "import jax, mdl_jax, mdl_jax.runtime as rt\n"
        "applied = rt.synchronous_cpu_dispatch()\n"
        "print(bool(applied), jax.config.values['jax_cpu_enable_async_dispatch'])\n"
        "print(float(mdl_jax.decide(0.8, 0.7, 0.2).C_final) > 0)\n"
        "print(repr(applied))\n")
    # what it returns says what it did when printed, not an object address
    assert _python(code).split() == ["True", "False", "True", "synchronous_cpu_dispatch(applied=True)"]


def test_synchronous_cpu_dispatch_too_late_warns_and_changes_nothing():
    code = (
        "import warnings, jax, jax.numpy as jnp\n"
        "jnp.zeros(1).block_until_ready()\n"
        "import mdl_jax.runtime as rt\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    applied = rt.synchronous_cpu_dispatch()\n"
        "print(bool(applied), jax.config.values['jax_cpu_enable_async_dispatch'])\n"
        "print([str(x.message) for x in w])\n")
    first, second = _python(code).strip().splitlines()[-2:]
    assert first.split() == ["False", "True"]
    assert "started already" in second and "before the first JAX computation" in second
    quiet = code.replace("rt.synchronous_cpu_dispatch()", "rt.synchronous_cpu_dispatch(warn_if_late=False)")
    first, second = _python(quiet).strip().splitlines()[-2:]
    assert first.split() == ["False", "True"] and second == "[]"


def test_the_users_environment_wins_and_the_call_works_as_a_context_manager():
    code = (
        "import jax, mdl_jax.runtime as rt\n"
        "with rt.synchronous_cpu_dispatch() as applied:\n"
        "    print(bool(applied), jax.config.values['jax_cpu_enable_async_dispatch'])\n")
    assert _python(code, JAX_CPU_ENABLE_ASYNC_DISPATCH="1").split() == ["False", "True"]
    assert _python(code).split() == ["True", "False"]


def test_the_command_line_runs_with_synchronous_dispatch():
    code = (
        "import jax\n"
        "from mdl_jax.cli import main\n"
        "rc = main(['demo'])\n"
        "print(rc, jax.config.values['jax_cpu_enable_async_dispatch'])\n")
    assert _python(code).strip().splitlines()[-1].split() == ["0", "False"]
