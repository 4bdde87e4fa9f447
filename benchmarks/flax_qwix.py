"""One Flax NNX transformer stack in f32, through ``hxmlir.flax`` and through qwix PTQ.

The model (``Stack``): ``--layers`` pre-LayerNorm transformer blocks of width ``d = 512``,
8 heads, feed-forward ``ff = 2048`` with GELU, every dense layer an ``nnx.Linear``; its
input is ``f32[1, tokens, d]``. It is quantized, weights only, with the same format by

- ``hxmlir.flax.quantize(model, dtype)`` (``layout="out_in"``, the default: ``q8[out, in]``,
  one scale per output channel, applied with ``hx.einsum``), and with
  ``layout="in_out"`` (``q8[in, out]``, one scale per input row: the layout the native CPU
  kernel serves while hxmlir is installed, ``hx.matmul_q``);
- qwix (``qwix.quantize_model(model, qwix.PtqProvider([QuantizationRule(module_path=".*",
  weight_qtype=dtype)]), x)``): its per-channel weight quantization (one scale per output
  channel, the contraction axis reduced).

Printed per format, side by side from one run: the output's relative error against the
f32 model (``||y - y_f32|| / ||y_f32||`` over ``f32[1, 128, d]`` random inputs), the bytes
of all the model's parameters on the device (``jax.Array.on_device_size_in_bytes`` of every
leaf: XLA CPU keeps qwix's ``int4`` one byte per value, hxmlir packs two), and the jit'd
forward time (``jax.jit`` of ``nnx.merge(graphdef, state)(x)``, the state passed in, or
with ``--jit nnx`` ``nnx.jit`` of ``model(x)``; hxmlir being installed, both take JAX's
C++ dispatch path with the 24 ``q8`` weights as with arrays) at 1
and 128 tokens: the median (``--stat min``: the minimum) over ``--rounds`` interleaved rounds (each round calls every
variant once, in a seeded random order), with the time of each against qwix's
(``/qwix``) and against f32's. Everything runs while ``hxmlir.install()`` is active.
Targets: error ``<= 1.5x`` qwix's, bytes ``<= `` qwix's, time ``<= 0.6x`` qwix's.

Usage::

  python benchmarks/flax_qwix.py                       # int8 and int4, 4 layers
  python benchmarks/flax_qwix.py --formats int8 --layers 2 --rounds 20
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import qwix
from flax import nnx

import hxmlir as hx
import hxmlir.flax as hxf

D, HEADS, FF = 512, 8, 2048


class Block(nnx.Module):
  """A pre-LayerNorm transformer block: attention, then a GELU feed-forward."""

  def __init__(self, rngs: nnx.Rngs):
    self.ln1 = nnx.LayerNorm(D, rngs=rngs)
    self.q, self.k, self.v, self.o = (nnx.Linear(D, D, rngs=rngs) for _ in range(4))
    self.ln2 = nnx.LayerNorm(D, rngs=rngs)
    self.up = nnx.Linear(D, FF, rngs=rngs)
    self.down = nnx.Linear(FF, D, rngs=rngs)

  def __call__(self, x):
    b, s, _ = x.shape
    h = self.ln1(x)
    split = lambda t: t.reshape(b, s, HEADS, D // HEADS)
    att = nnx.dot_product_attention(split(self.q(h)), split(self.k(h)), split(self.v(h)))
    x = x + self.o(att.reshape(b, s, D))
    return x + self.down(jax.nn.gelu(self.up(self.ln2(x))))


class Stack(nnx.Module):
  """``layers`` blocks, then a final LayerNorm."""

  def __init__(self, layers: int, rngs: nnx.Rngs):
    self.blocks = nnx.List([Block(rngs) for _ in range(layers)])
    self.ln = nnx.LayerNorm(D, rngs=rngs)

  def __call__(self, x):
    for blk in self.blocks:
      x = blk(x)
    return self.ln(x)


def cpu_model() -> str:
  """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"


def device_bytes(state) -> int:
  """Bytes of every array in ``state`` (hx values: their components) on the device."""
  leaves = jax.tree.leaves(hxf.to_arrays(state))
  return sum(int(a.on_device_size_in_bytes()) for a in leaves)


def forward(model, jit: str = "jax"):
  """``(jitted f(state, x), state)`` for ``model``. ``jit="jax"``: ``jax.jit`` of
  ``nnx.merge(graphdef, state)(x)``, the graph static and the state passed in (hxmlir being
  installed, a state holding hx values takes JAX's C++ dispatch path as one of arrays
  does); ``"nnx"``: ``nnx.jit`` of ``model(x)``, called with the model (``state`` is it)."""
  if jit == "nnx":
    return nnx.jit(lambda m, x: m(x)), model
  graphdef, state = nnx.split(model)
  return jax.jit(lambda st, x: nnx.merge(graphdef, st)(x)), state


def qwix_model(model, dtype, x):
  rules = [qwix.QuantizationRule(module_path=".*", weight_qtype=dtype)]
  return qwix.quantize_model(model, qwix.PtqProvider(rules), x)


def run(fmt: str, layers: int, rounds: int, seed: int, stat=statistics.median,
        jit: str = "jax") -> list[tuple]:
  dtype = {"int8": jnp.int8, "int4": jnp.int4}[fmt]
  model = Stack(layers, nnx.Rngs(seed))
  x128 = jax.random.normal(jax.random.key(seed + 1), (1, 128, D))
  x1 = x128[:, :1]
  variants = {
      "f32": model,
      "qwix": qwix_model(model, dtype, x128),
      "hxmlir out_in": hxf.quantize(model, dtype),
      "hxmlir in_out": hxf.quantize(model, dtype, layout="in_out"),
  }
  fns = {name: forward(m, jit) for name, m in variants.items()}
  ys = {name: np.asarray(f(st, x128)) for name, (f, st) in fns.items()}
  ref = ys["f32"].astype(np.float64)
  err = {name: float(np.linalg.norm(y - ref) / np.linalg.norm(ref)) for name, y in ys.items()}
  nbytes = {name: device_bytes(nnx.state(m)) for name, m in variants.items()}
  times = {}
  for tokens, x in ((1, x1), (128, x128)):
    for f, st in fns.values():
      f(st, x).block_until_ready()  # compile
    t = {name: [] for name in fns}
    order = np.random.default_rng(seed)
    for _ in range(rounds):
      for name in order.permutation(list(fns)):
        f, st = fns[name]
        t0 = time.perf_counter()
        f(st, x).block_until_ready()
        t[name].append(time.perf_counter() - t0)
    times[tokens] = {name: stat(v) for name, v in t.items()}
  rows = []
  for name in fns:
    rows.append((fmt, name, err[name], nbytes[name],
                 *(times[tok][name] for tok in (1, 128)),
                 *(times[tok][name] / times[tok]["qwix"] for tok in (1, 128)),
                 *(times[tok][name] / times[tok]["f32"] for tok in (1, 128)),
                 err[name] / err["qwix"] if err["qwix"] else float("nan"),
                 nbytes[name] / nbytes["qwix"]))
  return rows


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--formats", nargs="+", default=["int8", "int4"], choices=["int8", "int4"])
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--rounds", type=int, default=30)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--stat", choices=["median", "min"], default="median",
                  help="the time of a variant over the rounds (min: on a loaded machine)")
  ap.add_argument("--jit", choices=["jax", "nnx"], default="jax",
                  help="jax.jit of nnx.merge(graphdef, state)(x), or nnx.jit of model(x)")
  args = ap.parse_args(argv)
  hx.install()
  print(f"CPU: {cpu_model()}, {os.cpu_count()} CPUs; jax {jax.__version__}, "
        f"qwix {qwix.__version__ if hasattr(qwix, '__version__') else '?'}; "
        f"{args.layers} layers, d {D}, ff {FF}; {args.jit}.jit; {args.stat} of {args.rounds} "
        "interleaved rounds")
  print(f"hx.matmul_q on CPU while installed: {hx.cpu_kernel_info()}")
  head = (f"{'format':<6} {'variant':<14} | {'rel. error':>10} {'/qwix':>6} | {'MiB':>7} "
          f"{'/qwix':>6} | {'ms @1':>7} {'ms @128':>8} | {'/qwix @1':>8} {'@128':>6} | "
          f"{'/f32 @1':>7} {'@128':>6} | targets")
  print(head)
  print("-" * len(head))
  for fmt in args.formats:
    stat = statistics.median if args.stat == "median" else min
    for (f, name, err, nb, t1, t128, q1, q128, f1, f128, er, br) in run(
        fmt, args.layers, args.rounds, args.seed, stat, args.jit):
      marks = ""
      if name.startswith("hxmlir"):
        marks = (f"err{'+' if er <= 1.5 else '-'} bytes{'+' if br <= 1 else '-'} "
                 f"time{'+' if max(q1, q128) <= 0.6 else '-'}")
      print(f"{f:<6} {name:<14} | {err:>10.2e} {er:>6.2f} | {nb / 2**20:>7.2f} {br:>6.2f} | "
            f"{t1 * 1e3:>7.2f} {t128 * 1e3:>8.2f} | {q1:>8.2f} {q128:>6.2f} | "
            f"{f1:>7.2f} {f128:>6.2f} | {marks}", flush=True)


if __name__ == "__main__":
  main()
