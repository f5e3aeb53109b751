"""The evaluation harness: benchmark loaders (``datasets``), the metrics that score any gate on the same
records (``metrics``), reader-free scoring of MDL and the compared gates (``scoring``), AdaRAGUE's replay of
a reader's recorded answers (``replay``) and one run over the benchmarks (``run``, ``mdl-jax benchmarks``).

It sits above the gate and may import the controller, the signals, the gate and the foundation; nothing
below it imports it. The data stays outside the package: the loaders read ``../shared/data`` (or a user's
path, or the hub), never a file shipped in the wheel.
"""
