"""mdl-jax-repro: the paper's reproduction, beside the library (``mdl_jax``) and imported by nothing in it.

    pip install -e ".[experiments]" -e ./repro
    mdl-jax reproduce --n-questions 12 --out out/quick

What it holds, in data-flow order: ``pipeline`` (the memory stores, the LLM engines, the systems B1,
B2, B3, CRAG and Self-RAG, the judges and the resumable records of ``reproduce``), ``analysis`` (RQ2–RQ4:
the oracle, Table 7's gates, the learned MDL, rigour, reports and figures), ``model_server`` (the
OpenAI-compatible local model server, ``python -m mdl_repro.serve``) and ``cli`` (the commands
``signals``, ``reproduce``, ``judge``, ``analyze``, ``tune``, ``score-gates``, which join ``mdl-jax`` through
the entry-point group ``mdl_jax.commands``). It imports the library's public names; the library's
layer test (``tests/test_layers.py``) proves the reverse never happens.
"""

from mdl_repro._version import __version__ as __version__

__all__ = ["__version__"]
