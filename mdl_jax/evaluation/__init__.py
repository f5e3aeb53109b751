"""The evaluation harness: benchmark loaders (``mdl_jax.evaluation.datasets``) and the metrics that score any
gate on the same records.

It sits above the gate and may import the controller, the signals, the gate and the foundation; nothing
below it imports it. The data stays outside the package: the loaders read ``../shared/data`` (or a user's
path, or the hub), never a file shipped in the wheel.
"""
