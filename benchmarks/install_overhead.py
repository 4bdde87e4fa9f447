"""Lowering time with and without ``hx.install()``, side by side in one run.

Models (``--layers`` deep, ``--width`` wide, batch 8):

- ``plain``: ``x = tanh(x @ w + b)`` with f32 weights -- no ``hx.*`` op, so
  install only walks the module and skips it;
- ``q8 dequantize@``: ``x = tanh(x @ hx.dequantize(qw) + b)`` written by hand --
  every layer is folded by ``hx-fold-scales`` (one rewrite per layer, done by
  its jaxpr stage before lowering: ``hx_matmul_q`` is lowered instead of the
  dequantize and the dot), then verified;
- ``q8 matmul_q``: ``x = tanh(hx.matmul_q(x, qw) + b)`` -- verified, nothing to fold.

"lower" is ``Traced.lower()`` (jaxpr -> StableHLO, plus the pipeline when
installed) with JAX's caches cleared before each repetition; "trace+lower" is
``jax.jit(f).lower(...)`` of a fresh function. Modes alternate repetition by
repetition so background load hits both alike, each after ``gc.collect()``;
medians are printed, with the
ratio installed / not installed (target <= 1.10), the ratio of the fastest
repetitions (closest to an idle machine), the hook's own time per module from
``hx.stats()`` (walk + pipeline) and ``1 + hook / without``: the overhead as the
hook itself measures it, which background load on a shared machine disturbs
far less than the difference of two wall-clock medians.

Usage: ``python benchmarks/install_overhead.py [--layers 48] [--width 256] [--reps 21]``
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import hxmlir as hx
from hxmlir.integration.installation import DEFAULT_PIPELINE


def make_models(layers: int, width: int):
  rng = np.random.default_rng(0)
  ws = [jnp.asarray(rng.standard_normal((width, width)) / np.sqrt(width), jnp.float32)
        for _ in range(layers)]
  bs = [jnp.asarray(rng.standard_normal(width) * 0.1, jnp.float32) for _ in range(layers)]
  qws = [hx.quantize(w) for w in ws]
  x = jnp.asarray(rng.standard_normal((8, width)), jnp.float32)

  def plain(x, ws, bs):
    for w, b in zip(ws, bs):
      x = jnp.tanh(x @ w + b)
    return x

  def q8_dequant(x, qws, bs):
    for qw, b in zip(qws, bs):
      x = jnp.tanh(x @ hx.dequantize(qw) + b)
    return x

  def q8_matmul_q(x, qws, bs):
    for qw, b in zip(qws, bs):
      x = jnp.tanh(hx.matmul_q(x, qw) + b)
    return x

  return [("plain", plain, (x, ws, bs)),
          ("q8 dequantize@", q8_dequant, (x, qws, bs)),
          ("q8 matmul_q", q8_matmul_q, (x, qws, bs))]


def _timed(fn) -> float:
  gc.collect()  # start each measurement from the same heap: no inherited collection
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def measure(fn, args, reps: int) -> dict:
  traced = jax.jit(fn).trace(*args)
  times = {("lower", False): [], ("lower", True): [],
           ("trace+lower", False): [], ("trace+lower", True): []}
  pipeline_s, modules = 0.0, 0
  for rep in range(reps + 1):  # repetition 0 warms up
    for on in (False, True) if rep % 2 else (True, False):
      jax.clear_caches()
      hx.stats(reset=True)
      if on:
        hx.install()
      t_lower = _timed(traced.lower)
      jax.clear_caches()
      fresh = jax.jit(lambda *a: fn(*a))  # a new function: nothing cached
      t_all = _timed(lambda: fresh.lower(*args))  # noqa: B023  (called right here)
      if on:
        total = hx.stats().get("total", {})
        if rep:
          pipeline_s += total.get("seconds", 0.0)
          modules += total.get("modules", 0)
        hx.uninstall()
      if rep:
        times["lower", on].append(t_lower)
        times["trace+lower", on].append(t_all)
  out = {k: (statistics.median(v), min(v)) for k, v in times.items()}
  out["hook s/module"] = pipeline_s / max(modules, 1)
  return out


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--layers", type=int, default=48)
  p.add_argument("--width", type=int, default=256)
  p.add_argument("--reps", type=int, default=21)
  a = p.parse_args(argv)
  print(f"jax {jax.__version__}, {jax.devices()[0].platform}; {a.layers} layers, width "
        f"{a.width}, batch 8; pipeline {DEFAULT_PIPELINE}; "
        f"median of {a.reps}")
  head = (f"{'model':<16} {'what':<12} {'without ms':>11} {'with ms':>8} {'ratio':>7}"
          f" {'min-ratio':>9} {'hook ms/module':>15} {'1+hook/without':>15}")
  print(head)
  print("-" * len(head))
  worst = 0.0
  for name, fn, args in make_models(a.layers, a.width):
    m = measure(fn, args, a.reps)
    for what in ("lower", "trace+lower"):
      (off, off_min), (on, on_min) = m[what, False], m[what, True]
      ratio = on / off
      worst = max(worst, ratio) if what == "lower" else worst
      hook = (f"{m['hook s/module'] * 1e3:15.2f} {1 + m['hook s/module'] / off:14.3f}x"
              if what == "lower" else "")
      print(f"{name:<16} {what:<12} {off * 1e3:11.1f} {on * 1e3:8.1f} {ratio:6.3f}x "
            f"{on_min / off_min:8.3f}x {hook}")
  print(f"worst median lowering ratio {worst:.3f}x (target <= 1.10x): "
        f"{'met' if worst <= 1.10 else 'NOT met'}")


if __name__ == "__main__":
  main()
