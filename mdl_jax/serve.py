"""Deprecated: ``python -m mdl_jax.serve`` is ``python -m mdl_repro.serve`` (the local model server moved to
the paper's reproduction, ``pip install -e ./repro``); goes in the next release. See ``mdl_jax._moved``."""

from mdl_jax._moved import alias, run_as_main

if __name__ == "__main__":
    raise SystemExit(run_as_main("mdl_jax.serve"))
alias(__name__)
