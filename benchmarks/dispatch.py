"""The cost of one call of a jitted function that uses hx ops, against an f32 call.

Four calls of the same small product (a ``64 x 64`` weight, ``x: f32[8, 64]``), while
``hxmlir.install()`` is active:

- ``f32``: ``jax.jit(lambda x, w: x @ w)`` with an f32 weight (the reference call);
- ``make_qarray inside``: ``jax.jit`` of a function that builds the ``q8`` inside
  (``hx.make_qarray(qvalue, scale)``) from array arguments, then ``hx.matmul_q``;
- ``q8 argument``: ``jax.jit(lambda x, q: hx.matmul_q(x, q))`` called with a ``q8``;
- ``hx.jit``: ``hx.jit`` of the same, called with the ``q8``.

Each variant is compiled and called once first; then ``--rounds`` rounds (default 7),
each timing ``--calls`` calls (default 300) of every variant in turn, each call's result
blocked on (``jax.block_until_ready``), so background load hits all of them alike. Printed:
the median microseconds per call of each variant, its ratio to the f32 call's median, and
the ratio of the fastest rounds (the closest to an idle machine), with the CPU model.

Usage: ``python benchmarks/dispatch.py [--rounds 7] [--calls 300]``
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import hxmlir as hx


def cpu_model() -> str:
  """The CPU's model name from ``/proc/cpuinfo`` (``platform.processor()`` elsewhere)."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"


def variants() -> list[tuple[str, callable, tuple]]:
  """``(name, function, arguments)`` of each call timed."""
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.standard_normal((64, 64)), jnp.float32)
  x = jnp.asarray(rng.standard_normal((8, 64)), jnp.float32)
  q = hx.quantize(w)
  qvalue, scale = hx.qarray_parts(q)

  def built_inside(x, qvalue, scale):
    return hx.matmul_q(x, hx.make_qarray(qvalue, scale))

  def product(x, q):
    return hx.matmul_q(x, q)

  return [("jax.jit, f32", jax.jit(lambda x, w: x @ w), (x, w)),
          ("jax.jit, make_qarray inside, arrays", jax.jit(built_inside), (x, qvalue, scale)),
          ("jax.jit, q8 argument", jax.jit(product), (x, q)),
          ("hx.jit, q8 argument", hx.jit(product), (x, q))]


def time_calls(f, args, calls: int) -> float:
  """Microseconds per call of ``f(*args)`` over ``calls`` calls, each result blocked on."""
  block = jax.block_until_ready
  t0 = time.perf_counter()
  for _ in range(calls):
    block(f(*args))
  return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--rounds", type=int, default=7)
  ap.add_argument("--calls", type=int, default=300)
  a = ap.parse_args()
  hx.install()
  cases = variants()
  for _, f, args in cases:  # compile, and reach the steady state
    time_calls(f, args, 20)
  times: dict[str, list[float]] = {name: [] for name, _, _ in cases}
  for _ in range(a.rounds):
    for name, f, args in cases:
      times[name].append(time_calls(f, args, a.calls))
  ref_med = statistics.median(times[cases[0][0]])
  ref_min = min(times[cases[0][0]])
  print(f"CPU: {cpu_model()}; jax {jax.__version__}; median of {a.rounds} rounds of "
        f"{a.calls} calls, hxmlir installed")
  print("| call | us per call (median) | vs f32 (median) | vs f32 (fastest rounds) |")
  print("|---|---|---|---|")
  for name, _, _ in cases:
    med = statistics.median(times[name])
    print(f"| {name} | {med:.1f} | {med / ref_med:.2f}x | {min(times[name]) / ref_min:.2f}x |")


if __name__ == "__main__":
  main()
