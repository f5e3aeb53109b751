"""A tour of mdl-jax: the controller, its transformations, calibration, sweeps, tuning, config
files and the memory gate, on synthetic signals. The same code, with prose, is docs/tour.md."""

import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import mdl_jax
from mdl_jax import (
    Action,
    MDLConfig,
    bootstrap_weights,
    calibrate,
    config_grid,
    decide,
    decide_one,
    load_config,
    save_config,
    soft_decide,
    sweep,
    tune,
)

rng = np.random.default_rng(0)
N = 400
M, R, A = rng.uniform(0, 1, (3, N)).astype(np.float32)
# synthetic oracle labels: a hidden controller (other gates and thresholds) with 10% of labels flipped
hidden = MDLConfig(gate_coeffs=(0.8, 0.2), thresholds=(0.5, 0.3, 0.1))
adopt = (np.asarray(decide(M, R, A, hidden).action) == 0) ^ (rng.uniform(size=N) < 0.1)
print(f"{N} records, {adopt.mean():.0%} labelled adopt")

d = decide(0.85, 0.80, 0.20)
print(Action(int(d.action)).label, f"C={float(d.C):.3f} alpha={float(d.alpha):.3f} C_final={float(d.C_final):.3f}")
e = np.asarray(d.energies)                            # ‖Π_k v_meta‖², summing to ‖v_meta‖²
print("energies (wm, r, a):", np.round(e, 3), "shares:", np.round(e / e.sum(), 3))

batch = decide(M, R, A)                               # (N,) in, every field (N,) out
labels = [a.label for a in Action]
counts = np.bincount(np.asarray(batch.action), minlength=4)
print(dict(zip(labels, counts.tolist())))

cfg = MDLConfig()
one = jax.jit(jax.vmap(decide_one, in_axes=(0, 0, 0, None)))(jnp.asarray(M), jnp.asarray(R), jnp.asarray(A), cfg)
assert (np.asarray(one.action) == np.asarray(batch.action)).mean() > 0.99  # the same controller

# (N, 4): P(Active), P(Supp), P(Silent), P(Opt-Out)
p = soft_decide(M, R, A)
print("mean P(Active):", float(p[..., 0].mean()), "share Active:", float((np.asarray(batch.action) == 0).mean()))


def mean_p_active(c):
    return soft_decide(M, R, A, c)[..., 0].mean()


grads = jax.jit(jax.grad(mean_p_active))(cfg)         # an MDLConfig of gradients, field by field
print("d mean P(Active) / d thresholds:", np.round(np.asarray(grads.thresholds), 3))

cal_idx, test_idx = np.arange(N) < N // 2, np.arange(N) >= N // 2
cal = calibrate(M[cal_idx], R[cal_idx], A[cal_idx], adopt[cal_idx])
print("θ:", np.round(cal.config.thresholds, 3), "agreement:", round(float(cal.best_agreement), 3),
      "tied θ0:", np.round(cal.plateau, 3), "constant:", cal.constant)
held_out = decide(M[test_idx], R[test_idx], A[test_idx], cal.config)
print("held-out accuracy:", float(((np.asarray(held_out.action) == 0) == adopt[test_idx]).mean()))

# K = 36, C order
grid = config_grid(MDLConfig(), g_a=np.linspace(0, 1, 6), g_b=np.linspace(0, 1, 6))
# W = 20 resamples
res = sweep(M, R, A, grid, adopt=adopt, weights=bootstrap_weights(N, 20, seed=0))
acc = res.accuracy.reshape(6, 6, 20)                  # (g_a, g_b, resample)
lo, hi = np.percentile(acc, [2.5, 97.5], axis=-1)
i, j = np.unravel_index(acc.mean(-1).argmax(), (6, 6))
print(f"best (g_a, g_b) = ({i / 5:.1f}, {j / 5:.1f}): accuracy {acc.mean(-1)[i, j]:.3f} "
      f"(95% bootstrap {lo[i, j]:.3f}-{hi[i, j]:.3f})")
print("action counts of that config, first resample:", res.counts.reshape(6, 6, 20, 4)[i, j, 0])

val = rng.uniform(size=N) < 0.25                      # a quarter of the records for early stopping
tuned = tune(M, R, A, adopt, fields=("gate_coeffs", "thresholds"), val=val, steps=80, patience=15)
h = tuned.history
series = [k for k, v in h.items() if np.ndim(v) >= 1]
scalars = {k: int(v) if k.endswith("_step") else round(float(v), 3) for k, v in h.items() if np.ndim(v) == 0}
print("per-step series:", sorted(series))
print("scalars:", scalars)
stop = int(h["stopped_step"])
# stopped early: the rest repeats the frozen parameters
if stop < len(h["loss"]) - 1:
    assert np.all(h["val_accuracy"][stop + 1:] == h["val_accuracy"][stop + 1])
print("tuned gate:", np.round(tuned.config.gate_coeffs, 3), "θ:", np.round(tuned.config.thresholds, 3))

# not the current folder: the tour leaves no files behind
folder = Path(tempfile.mkdtemp())
path = save_config(tuned.config, folder / "tuned.json", note="tuned on the tour's synthetic records")
again = load_config(path)
assert again == tuned.config
from_file = decide(M, R, A, path)                     # a path, like "tuned.json", is a config too
assert (np.asarray(from_file.action) == np.asarray(decide(M, R, A, again).action)).all()
print(path.read_text()[:120].replace("\n", " "), "...")
print("mdl-jax", mdl_jax.__version__)

# imported here, not at the top: the gate is the one step that needs the signals extra (MiniLM)
from mdl_jax.gate import MemoryGate  # noqa: E402
from mdl_jax.signals.embeddings import ModelLoadError  # noqa: E402

gate = MemoryGate(risk=0.2, config=tuned.config)
try:
    d = gate.decide("What is the capital of France?",
                    ["Paris is the capital of France.", {"text": "The capital city of France is Paris.", "source": "wiki"}])
except ModelLoadError as e:  # the core install alone: nothing here can run MiniLM
    print("the memory gate is skipped:", e)
else:
    print(d.action_name, {k: round(v, 3) for k, v in d.scalars.items() if k in ("M", "R", "A", "C_final")})
    print("inject:", d.memories)
    print("no memories:", gate.decide("What is the capital of France?", []).action_name)
