"""``python -m mdl_jax.serve``: the OpenAI-compatible server of ``mdl_jax.pipeline.serve``."""

from mdl_jax.pipeline.serve import main

if __name__ == "__main__":
    raise SystemExit(main())
