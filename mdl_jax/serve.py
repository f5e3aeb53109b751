"""``python -m mdl_jax.serve``: the OpenAI-compatible local model server (``mdl_jax.serving.model_server``)."""

from mdl_jax.serving.model_server import main

if __name__ == "__main__":
    raise SystemExit(main())
