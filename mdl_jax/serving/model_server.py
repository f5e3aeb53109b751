"""Deprecated alias of ``mdl_repro.model_server``, the paper's reproduction (``pip install -e ./repro``);
goes in the next release. See ``mdl_jax._moved``."""

from mdl_jax._moved import alias, run_as_main

if __name__ == "__main__":
    raise SystemExit(run_as_main("mdl_jax.serving.model_server"))
alias(__name__)
