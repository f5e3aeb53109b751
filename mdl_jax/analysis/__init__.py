"""Deprecated alias of ``mdl_repro.analysis``, the paper's reproduction (``pip install -e ./repro``); goes in the next
release. See ``mdl_jax._moved``."""

from mdl_jax._moved import alias

alias(__name__)
