"""``hxmlir demo``: the whole plugin at work on one model, step by step.

:func:`run_demo` takes a model -- the built-in transformer stack
(:mod:`hxmlir.models.builtin`, no download) or the real all-MiniLM-L6-v2
(:mod:`hxmlir.models.minilm`) -- and:

1. ``load``: builds the f32 model and its input;
2. ``quantize``: quantizes every dense weight with ``hx.quantize`` to the format
   asked for (:mod:`hxmlir.formats`; default ``q8``: int8 + one f32 scale per row;
   ``dtype="int4"``, ``group_size=32``, ``method="mse"`` give ``q4[k, n:g32]``);
3. ``install``: ``hx.install()`` puts hxmlir's pass pipeline into JAX's lowering;
4. ``jit``: lowers and compiles the quantized model under ``jax.jit``;
5. ``ir``: shows what the pipeline did: ``hx.*`` composites of each kind in the
   IR before and after the passes, scale folds applied (on the naive
   dequantize-then-dot model, whose ``x @ dequantize(w)`` the pipeline folds)
   and the ``hx-verify`` result;
6. ``accuracy``: runs the quantized and f32 models and compares them (max and
   relative error; for MiniLM the per-sentence cosine);
7. ``kernel``: which ``hx.matmul_q`` implementation runs on CPU and why
   (:func:`hxmlir.cpu_kernel_info`: the native kernel or the StableHLO
   lowering); ``timing``: times one step of the f32 model, the quantized model and
   the naive dequantize-then-dot model (compiled without the plugin, and with
   it, which folds it into ``hx.matmul_q``) side by side, in interleaved
   rounds (median per model; its ratio to f32: the median and quartiles of the
   per-round ratios);
   the quantized models are called through :func:`hxmlir.jit` (their weights cross
   the call as arrays, like the f32 model's), and once more through ``jax.jit``'s
   own call, whose Python dispatch of hi arguments a step pays in JAX 0.10.2;
8. ``weights``: weight bytes as stored on the device (values + scales) against f32;
9. ``export``: exports the quantized model for ``cpu``, ``cuda`` and ``tpu`` with
   ``hxmlir.export``, writes the artifact to a file, runs it in a fresh process
   (``python -m hxmlir.tools.cli run``) and checks its outputs are identical to the
   exported function's outputs in this process.

The parts live beside it: the models by name in :mod:`hxmlir.models.registry`, the
report, its terminal line and what it reads off IR text in :mod:`hxmlir.tools.report`.

Every step yields one :class:`Step` (status ``ok``, ``info``, ``failed`` or
``skipped``) with a readable line and its data; :class:`Report` collects them
and is printed as text or JSON. The demo passes only when no step failed or was
skipped. A failing step is one line; set ``HXMLIR_DEBUG=1`` for its traceback.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import jax
import jax.numpy as jnp
import numpy as np

from hxmlir import export as hx_export
from hxmlir import formats
from hxmlir.install_state import current_pipeline, is_installed
from hxmlir.integration import dispatch, installation
from hxmlir.models import _nn, llama, minilm
from hxmlir.models.registry import (
  BUILTIN_MAX_REL_ERR,
  MINILM_SENTENCES,
  MODELS,
  DemoModel,
  QuantFormat,
  build_model,
  rel_err,
)
from hxmlir.tools.npzio import arguments_to_arrays, flatten_values, unflatten_values  # noqa: F401
from hxmlir.tools.report import (
  ProgressLine,
  Report,
  Step,
  StepFailed,
  StepSkipped,
  count_composites,
  count_composites_by_format,
  fmt_counts,
  verify_text,
)
from hxmlir.types.qarray import QArrayTy

EXPORT_PLATFORMS = ("cpu", "cuda", "tpu")
DECODER_MODELS = ("smollm2", "gemma3")
"""Demo models that are GGUF decoders (:class:`_DecoderDemo`), beside :data:`MODELS`."""
DEMO_MODELS = (*MODELS, *DECODER_MODELS)
"""Every ``hxmlir demo --model`` choice."""
DECODER_TEXT = ("The quick brown fox jumps over the lazy dog. The capital of France is Paris, "
                "and the capital of Italy is Rome.")
"""The decoder demo's teacher-forced text (accuracy) and, cut at ``is``, its prompt."""
DECODER_MAX_REL_ERR = 1e-3
DECODER_MIN_TOP1 = 0.99
"""The decoder demo's bars against the JAX f32 decoder on the dequantized weights (the
issue's bars against a float64 reference, which tests/py/models/test_llama.py asserts)."""
ARTIFACT_NAME = "model.hxa"
_CUSTOM_CALL_RE = re.compile(r'stablehlo\.custom_call\s+@([^\s(]+)\(')




# --- the demo ----------------------------------------------------------------

def time_interleaved(fns: dict[str, Callable[[], Any]], repeats: int,
                     progress: Callable[[str], None] | None = None) -> dict[str, list[float]]:
  """Seconds of each call of each ``fns[name]()`` (blocking on its result), per round.

  After one warm-up call each, the functions run in ``repeats`` rounds, each
  round in its own order (a seeded random permutation: each function follows each
  other equally often on average, where rotating one order would put every one
  after the same neighbour every time, and what ran just before -- the cache
  lines it evicted, the allocator's state -- affects a call), so a change in
  machine load affects them all alike and the per-round ratios stay meaningful
  on a shared machine.
  """
  for fn in fns.values():
    jax.block_until_ready(fn())
  ts: dict[str, list[float]] = {k: [] for k in fns}
  names = list(fns)
  order = np.random.default_rng(0)
  for i in range(repeats):
    if progress is not None:
      progress(f"timing round {i + 1}/{repeats}")
    for name in order.permutation(names):
      t0 = time.perf_counter()
      jax.block_until_ready(fns[name]())
      ts[name].append(time.perf_counter() - t0)
  return ts


def ratio_stats(t: Sequence[float], base: Sequence[float]) -> tuple[float, float, float]:
  """``(median, 25th, 75th percentile)`` of the per-round ratios ``t[i] / base[i]``.

  ``t`` and ``base``: seconds of two functions in the same rounds
  (:func:`time_interleaved`). The headline ratio is the median of the same per-round
  ratios the quartiles are of, so it lies between them (a ratio of the two medians
  need not). Raises ``ValueError`` for empty or unequal-length lists.
  """
  if len(t) != len(base) or not len(t):
    raise ValueError(f"expected two equally long non-empty lists of rounds, got {len(t)} "
                     f"and {len(base)}")
  r = np.asarray(t, np.float64) / np.asarray(base, np.float64)
  q1, med, q3 = np.percentile(r, [25, 50, 75])
  return float(med), float(q1), float(q3)


class _Demo:
  def __init__(self, model: str, fmt: QuantFormat, out: Path | None, repeats: int,
               platforms: Sequence[str], pipeline: str | None, emit: Callable[[Step], None],
               progress: Callable[[str], None]):
    self.model_name, self.fmt, self.out, self.repeats = model, fmt, out, repeats
    self.label = fmt.label
    self.platforms = tuple(platforms)
    self.pipeline = pipeline
    self.emit, self.progress = emit, progress
    self.report = Report(model, format=fmt.to_json())
    self.m: DemoModel | None = None
    self.state: dict[str, Any] = {}

  def step(self, name: str, fn: Callable[[], tuple[str, str, dict]], needs: Sequence[str] = ()):
    missing = [n for n in needs if n not in self.state]
    if missing:
      s = Step(name, "skipped", f"skipped: needs the result of step {', '.join(missing)}")
    else:
      t0 = time.perf_counter()
      try:
        status, line, data = fn()
      except StepSkipped as e:
        status, line, data = "skipped", f"skipped: {e}", {}
      except StepFailed as e:
        status, line, data = "failed", str(e), {}
      except Exception as e:  # report, don't crash: the other steps still run
        if os.environ.get("HXMLIR_DEBUG"):
          traceback.print_exc()
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        status, line, data = "failed", f"{type(e).__name__}: {msg}", {}
      data = {**data, "seconds": round(time.perf_counter() - t0, 3)}
      s = Step(name, status, line, data)
    self.report.steps.append(s)
    self.emit(s)

  def _write(self, name: str, content: str | bytes) -> str | None:
    if self.out is None:
      return None
    p = self.out / name
    p.write_bytes(content) if isinstance(content, bytes) else p.write_text(content)
    return str(p)

  # steps -------------------------------------------------------------------

  def load(self):
    try:
      self.m = build_model(self.model_name, self.progress)
    except minilm.ModelNotInstalledError as e:
      raise StepFailed(" ".join(str(e).split())) from None
    self.state["load"] = True
    return "info", self.m.description, {"description": self.m.description}

  def quantize(self):
    m, fmt = self.m, self.fmt
    m.qparams = m.quantize(m.params, fmt.dtype, group_size=fmt.group_size, method=fmt.method)
    jax.block_until_ready(jax.tree.leaves(m.qparams))
    qs = [w for w in jax.tree.leaves(m.qparams) if _nn.is_quantized(w)]
    n = len(qs)
    lim = formats.lookup(fmt.dtype).qmax
    qmax = max((float(np.abs(np.asarray(formats.values_f32(w.qvalue, jax.typeof(w).format))).max()) for w in qs),
               default=0.0)
    types = sorted({str(jax.typeof(w)) for w in qs})
    if n == 0 or qmax > lim:
      raise StepFailed(f"expected {fmt.label} dense weights in [-{lim:g}, {lim:g}], got {n} "
                       f"weights, max |q| {qmax:g}")
    # the IR JAX emits without the plugin: hx.* composites, no passes run yet
    self.progress("lowering without the plugin")
    self.state["before"] = {
        "quantized": jax.jit(m.apply).lower(m.qparams, *m.inputs).as_text(),
        "naive": jax.jit(partial(m.apply, naive=True)).lower(m.qparams, *m.inputs).as_text(),
    }
    # the naive dequantize-then-dot baseline, compiled as plain JAX would
    self.state["naive_plain"] = jax.jit(partial(m.apply, naive=True)).lower(
        m.qparams, *m.inputs).compile()
    self.state["quantize"] = True
    return "ok", f"{n} dense weights -> {fmt.describe()} ({', '.join(types[:2])}" + (
        ", ...)" if len(types) > 2 else ")"), {"weights": n, "types": types}

  def install(self):
    installation.install(self.pipeline)
    self.state["stats0"] = installation.stats()  # the ir step reports the difference
    self.state["install"] = True
    pipe, pipe_x = current_pipeline(), current_pipeline(for_export=True)
    return "ok", f"hx.install(): pipeline {pipe!r} (for export: {pipe_x!r})", {
        "pipeline": pipe, "export_pipeline": pipe_x}

  def jit(self):
    m = self.m
    self.progress(f"lowering and compiling the {self.label} model")
    t0 = time.perf_counter()
    lowered = jax.jit(m.apply).lower(m.qparams, *m.inputs)
    after = lowered.as_text()
    self.state["quantized"] = lowered.compile()
    t_q = time.perf_counter() - t0
    self.progress("lowering the naive model under the pipeline")
    lowered_naive = jax.jit(partial(m.apply, naive=True)).lower(m.qparams, *m.inputs)
    self.state["after"] = {"quantized": after, "naive": lowered_naive.as_text()}
    self.state["naive_folded"] = lowered_naive.compile()
    self.progress("compiling the f32 model")
    self.state["f32"] = jax.jit(m.apply).lower(m.params, *m.inputs).compile()
    self.state["jit"] = True
    return "ok", (f"{self.label} model lowered through the pipeline and compiled in "
                  f"{t_q:.1f} s"), {"quantized_lower_compile_seconds": round(t_q, 3)}

  def ir(self):
    stats = installation.stats
    before, after = self.state["before"], self.state["after"]
    for k in ("quantized", "naive"):
      self._write(f"{k}_before_passes.mlir", before[k])
      self._write(f"{k}_after_passes.mlir", after[k])
    cb, ca = count_composites(before["quantized"]), count_composites(after["quantized"])
    nb, na = count_composites(before["naive"]), count_composites(after["naive"])
    st = _stats_delta(self.state["stats0"], stats())
    fold = st.get("hx-fold-scales", {})
    folds = int(fold.get("scales folded", fold.get("rewrites", 0)))
    counters = ", ".join(f"{int(v)} {k}" for k, v in fold.items()
                         if k not in ("modules", "rewrites", "seconds", "scales folded") and v)
    ver = st.get("hx-verify", {})
    ok_q, probs_q = verify_text(after["quantized"])
    ok_naive, probs_naive = verify_text(after["naive"])
    n_dense = sum(1 for w in jax.tree.leaves(self.m.qparams) if _nn.is_quantized(w))
    data = {"composites_before": cb, "composites_after": ca,
            "naive_composites_before": nb, "naive_composites_after": na,
            "folds_applied": folds, "fold_stats": fold,
            "verify": {"passed": ok_q and ok_naive,
                       "modules_verified_while_installed": int(ver.get("modules", 0)),
                       "problems": probs_q + probs_naive},
            "pipeline_stats": st}
    line = (f"{self.label} model: {fmt_counts(cb)} -> {fmt_counts(ca)}; naive model: "
            f"{fmt_counts(nb)} -> {fmt_counts(na)} ({folds} scales folded"
            f"{', ' + counters if counters else ''}); hx-verify "
            + ("passed" if ok_q and ok_naive else
               f"FAILED ({len(probs_q) + len(probs_naive)} problems)"))
    problems = []
    if ca.get("hx.matmul_q", 0) != n_dense:
      problems.append(f"expected {n_dense} hx.matmul_q after the passes, got "
                      f"{ca.get('hx.matmul_q', 0)}")
    if not (ok_q and ok_naive):
      problems.append("hx-verify failed: " + "; ".join((probs_q + probs_naive)[:3]))
    if problems:
      raise StepFailed(line + " -- " + "; ".join(problems))
    return "ok", line, data

  def accuracy(self):
    m = self.m
    ref = np.asarray(self.state["f32"](m.params, *m.inputs))
    y = np.asarray(self.state["quantized"](m.qparams, *m.inputs))
    self.state["quantized_out"] = y
    data, line, ok = m.compare(y, ref, self.fmt)
    yn = np.asarray(self.state["naive_folded"](m.qparams, *m.inputs))
    mx, rel = rel_err(yn, y)
    data["naive_vs_quantized_relative_error"] = rel
    if not np.isfinite(y).all():
      ok, line = False, line + f"; {self.label} output has non-finite values"
    if rel > 1e-4:
      ok, line = False, line + (f"; naive model under the pipeline differs from the "
                                f"{self.label} model (rel {rel:.3g})")
    self.state["accuracy"] = True
    return ("ok" if ok else "failed"), line, data

  def timing(self):
    m, st, r = self.m, self.state, self.repeats
    # the quantized models through hx.jit (their q8 weights cross the call as arrays,
    # as the f32 model's do); jax.jit's Python dispatch of hi arguments timed too
    quantized, naive_folded = dispatch.jit(m.apply), dispatch.jit(partial(m.apply, naive=True))
    runs = {"f32": lambda: st["f32"](m.params, *m.inputs),
            f"{self.label} hx.matmul_q": lambda: quantized(m.qparams, *m.inputs),
            "naive dequantize+dot": lambda: st["naive_plain"](m.qparams, *m.inputs),
            "naive, folded by the pipeline": lambda: naive_folded(m.qparams, *m.inputs),
            f"{self.label}, jax.jit with QArray arguments":
                lambda: st["quantized"](m.qparams, *m.inputs)}
    rounds = time_interleaved(runs, r, self.progress)
    ms = {k: float(np.median(v)) * 1e3 for k, v in rounds.items()}
    # per model: (median, quartiles) of its per-round ratios to f32
    ratio = {k: ratio_stats(v, rounds["f32"]) for k, v in rounds.items() if k != "f32"}
    line = (f"per step, median of {r} interleaved rounds (ratio to f32: median and quartiles "
            f"of the per-round ratios): f32 {ms['f32']:.2f} ms, " + ", ".join(
                f"{k} {ms[k]:.2f} ms ({med:.2f}x, {lo:.2f}-{hi:.2f})"
                for k, (med, lo, hi) in ratio.items()))
    return "info", line, {"milliseconds": {k: round(v, 4) for k, v in ms.items()},
                          "repeats": r,
                          "relative_to_f32": {"f32": 1.0, **{k: round(med, 4)
                                                             for k, (med, _, _) in ratio.items()}},
                          "relative_to_f32_quartiles": {k: [round(lo, 4), round(hi, 4)]
                                                        for k, (_, lo, hi) in ratio.items()}}

  def kernel(self):
    from hxmlir.lowering.matmul_q.cpu import cpu_kernel_info
    info = cpu_kernel_info()
    backend = jax.default_backend()
    fmt = self.fmt
    line = (f"hx.matmul_q on CPU: {info.describe(fmt.dtype, fmt.group_size)}" if backend == "cpu" else
            f"hx.matmul_q on {backend}: its Pallas kernel (the CPU kernel is not used)")
    return "info", line, {"backend": backend, "cpu_kernel_active": info.active,
                          "cpu_kernel_isa": info.isa, "cpu_kernel_reason": info.reason}

  def weights(self):
    b = _nn.weight_bytes(self.m.qparams)
    q = b["values"] + b["scales"]
    mib = lambda n: f"{n / 2**20:.2f} MiB"
    line = (f"dense weights ({self.label}, on the device): {mib(b['values'])} values + "
            f"{b['scales'] / 2**10:.1f} KiB scales = "
            f"{mib(q)} vs {mib(b['f32_equivalent'])} f32 ({b['f32_equivalent'] / q:.2f}x smaller); "
            f"other f32 parameters {mib(b['other_f32'])}")
    return "info", line, {"bytes": b, "ratio": b["f32_equivalent"] / q}

  def export(self):
    m = self.m
    export = hx_export.export
    leaves, treedef = jax.tree.flatten((m.qparams, m.inputs))

    def flat(*args):
      qparams, inputs = jax.tree.unflatten(treedef, args)
      return m.apply(qparams, *inputs)

    self.progress(f"exporting for {', '.join(self.platforms)}")
    exp = export(jax.jit(flat), platforms=self.platforms)(*leaves)
    blob = exp.serialize()
    module = exp.mlir_module()
    composites = count_composites(module)
    custom_calls = dict(sorted(Counter(_CUSTOM_CALL_RE.findall(module)).items()))
    self._write("exported_module.mlir", module)
    expected = np.asarray(exp.call(*leaves))
    got = self._run_in_fresh_process(blob, leaves, expected)
    same = got.shape == expected.shape and np.array_equal(got, expected)
    vs_jit = rel_err(expected, self.state["quantized_out"])[1] if "quantized_out" in self.state else None
    data = {"platforms": list(self.platforms), "artifact_bytes": len(blob),
            "artifact": str(self.out / ARTIFACT_NAME) if self.out else None,
            "identical": bool(same), "relative_error_vs_jit": vs_jit,
            "composites": composites, "custom_calls": custom_calls}
    where = f" -> {data['artifact']}" if self.out else ""
    calls = "".join(f", {k} x{v}" for k, v in custom_calls.items())
    line = (f"{'/'.join(self.platforms)} artifact, {len(blob) / 2**20:.2f} MiB{where} "
            f"({fmt_counts(composites)}{calls}); "
            f"fresh process output {'identical' if same else 'DIFFERS'} "
            f"({got.dtype}{list(got.shape)})")
    return ("ok" if same else "failed"), line, data

  def _run_in_fresh_process(self, blob: bytes, leaves: list, expected: np.ndarray,
                            arrays: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """Writes the artifact and its inputs (to the output folder, else a temporary one), runs
    ``python -m hxmlir.tools.cli run`` on them and returns its output ``a0``; StepFailed when it
    fails. ``arrays``: the inputs' ``.npz`` arrays when they are not
    ``flatten_values(leaves)`` (arguments that are pytrees)."""
    tmp = None
    out = self.out
    if out is None:
      tmp = tempfile.TemporaryDirectory(prefix="hxmlir-demo-")
      out = Path(tmp.name)
    try:
      art = out / ARTIFACT_NAME
      art.write_bytes(blob)
      np.savez(out / "inputs.npz", **(flatten_values(leaves) if arrays is None else arrays))
      self.progress("running the artifact in a fresh process")
      cmd = [sys.executable, "-m", "hxmlir.tools.cli", "run", str(art), "--inputs",
             str(out / "inputs.npz"), "--output", str(out / "outputs.npz")]
      proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
      if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise StepFailed(f"fresh process failed (exit {proc.returncode}): {tail}")
      with np.load(out / "outputs.npz") as z:
        got = z["a0"]
      np.savez(out / "expected.npz", a0=expected)
    finally:
      if tmp is not None:
        tmp.cleanup()
    return got

  STEPS: tuple[tuple[str, tuple[str, ...]], ...] = (
      ("load", ()), ("quantize", ("load",)), ("install", ()), ("jit", ("quantize", "install")),
      ("ir", ("jit",)), ("accuracy", ("jit",)), ("kernel", ()), ("timing", ("jit",)),
      ("weights", ("quantize",)), ("export", ("quantize", "install")))
  """The steps in order, each the method of its name, with the steps it needs."""

  def run(self) -> Report:
    if self.out is not None:
      self.out.mkdir(parents=True, exist_ok=True)
    installed_before = is_installed()
    try:
      for name, needs in self.STEPS:
        self.step(name, getattr(self, name), needs=needs)
    finally:
      if not installed_before and is_installed():
        installation.uninstall()
    if self.out is not None:
      self._write("report.json", json.dumps(self.report.to_json(), indent=1) + "\n")
    return self.report


class _DecoderDemo(_Demo):
  """The demo's steps on a GGUF decoder (SmolLM2-135M-Instruct): its weights are already
  quantized (the file's Q4_1/Q8_0 blocks as ``u4o``/``q8``), so there is no quantize
  step; the baseline is a plain JAX f32 decoder (:func:`hxmlir.models.llama.forward` on
  :func:`~hxmlir.models.llama.dequantized` weights, ``jnp.einsum`` projections); the
  unit of work is one decode step (one token, the KV cache of ``max_context``
  positions)."""

  STEPS = (("load", ()), ("install", ()), ("jit", ("load", "install")), ("ir", ("jit",)),
           ("accuracy", ("jit",)), ("kernel", ()), ("timing", ("jit",)), ("weights", ("load",)),
           ("export", ("load", "install")))

  MAX_CONTEXT = 128

  def load(self):
    name, path_of = llama.PACKAGED[self.model_name]
    self.progress(f"loading {name}")
    try:
      m = llama.Llama.from_gguf(path_of(), max_context=self.MAX_CONTEXT)
    except llama.ModelNotInstalledError as e:
      raise StepFailed(" ".join(str(e).split())) from None
    self.llm, self.llama = m, llama
    self.f32_params = jax.block_until_ready(llama.dequantized(m.params))
    types = sorted({str(jax.typeof(w).format.prefix) for w in jax.tree.leaves(m.params)
                    if _nn.is_quantized(w)})
    c = m.config
    line = (f"{name} ({os.path.basename(m.path)}): {c.layers} layers, "
            f"{c.heads} heads ({c.kv_heads} KV) of {c.head_dim}, vocab {c.vocab}; weights as "
            f"stored ({', '.join(types)}), KV cache {m.kv_cache} of {m.max_context} positions")
    self.state["load"] = True
    return "info", line, {"path": m.path, "weight_formats": types,
                          "max_context": m.max_context}

  def _step_args(self, params):
    m = self.llm
    ids = m.tokenizer.encode(DECODER_TEXT[:DECODER_TEXT.index(" is ") + 3])
    k, v = m.new_cache()
    return params, jnp.asarray([ids[-1]], "int32"), jnp.int32(
        len(ids) - 1), k, v

  def jit(self):
    from functools import partial as _partial
    m = self.llm
    step = jax.jit(_partial(self.llama.forward, cfg=m.config))
    self.progress("lowering and compiling the decode step")
    t0 = time.perf_counter()
    lowered = step.lower(*self._step_args(m.params))
    self.state["after"] = lowered.as_text()
    self.state["quantized"] = lowered.compile()
    t_q = time.perf_counter() - t0
    self.progress("compiling the f32 decode step")
    self.state["f32"] = step.lower(*self._step_args(self.f32_params)).compile()
    self.state["jit"] = True
    return "ok", (f"decode step (1 token, KV cache of {m.max_context}) lowered through the "
                  f"pipeline and compiled in {t_q:.1f} s"), {
                      "quantized_lower_compile_seconds": round(t_q, 3)}

  def ir(self):
    text = self.state["after"]
    self._write("decode_step_after_passes.mlir", text)
    by_fmt = count_composites_by_format(text)
    ok, problems = verify_text(text)
    # one per quantized weight of the layers (fused ones count once) and the tied head
    want = sum(isinstance(jax.typeof(w), QArrayTy)
               for p in self.llm.params["layers"] for w in p.values()) + 1
    got = count_composites(text).get("hx.matmul_q", 0)
    line = f"decode step: {fmt_counts(by_fmt)}; hx-verify " + (
        "passed" if ok else f"FAILED ({len(problems)} problems)")
    data = {"composites_by_format": by_fmt, "verify": {"passed": ok, "problems": problems}}
    if got != want or not ok:
      raise StepFailed(line + f" -- expected {want} hx.matmul_q, got {got}" * (got != want))
    return "ok", line, data

  def accuracy(self):
    m = self.llm
    ids = m.tokenizer.encode(DECODER_TEXT)
    got = m.logits(ids).astype(np.float64)
    self.progress("teacher-forced logits of the f32 decoder")
    k, v = m.new_cache(len(ids))
    ref, _, _ = jax.jit(lambda p, i, k, v: self.llama.forward(
        p, i, jnp.int32(0), k, v, cfg=m.config))(
        self.f32_params, jnp.asarray(ids, "int32"), k, v)
    ref = np.asarray(ref, np.float64)
    top1 = float(np.mean(got.argmax(-1) == ref.argmax(-1)))
    rel = float(np.abs(got - ref).max() / np.abs(ref).max())
    ok = top1 >= DECODER_MIN_TOP1 and rel <= DECODER_MAX_REL_ERR and np.isfinite(got).all()
    line = (f"teacher-forced over {len(ids)} tokens against the JAX f32 decoder on the "
            f"dequantized weights: top-1 agreement {top1:.3f} (bar {DECODER_MIN_TOP1}), max "
            f"|logit err| / max |logit| {rel:.2e} (bar {DECODER_MAX_REL_ERR:g})")
    self.state["accuracy"] = True
    return ("ok" if ok else "failed"), line, {"tokens": len(ids), "top1_agreement": top1,
                                              "relative_error": rel}

  def timing(self):
    st, r = self.state, self.repeats
    qa, fa = self._step_args(self.llm.params), self._step_args(self.f32_params)
    rounds = time_interleaved({"f32": lambda: st["f32"](*fa),
                               "hx": lambda: st["quantized"](*qa)}, r, self.progress)
    ms = {k: float(np.median(v)) * 1e3 for k, v in rounds.items()}
    med, lo, hi = ratio_stats(rounds["hx"], rounds["f32"])
    line = (f"decode, median of {r} interleaved steps: JAX f32 decoder {1e3 / ms['f32']:.1f} "
            f"tok/s ({ms['f32']:.2f} ms), hx decoder {1e3 / ms['hx']:.1f} tok/s "
            f"({ms['hx']:.2f} ms; {med:.2f}x the f32 time, {lo:.2f}-{hi:.2f})")
    return "info", line, {"milliseconds": {k: round(v, 4) for k, v in ms.items()},
                          "tokens_per_second": {k: round(1e3 / v, 2) for k, v in ms.items()},
                          "repeats": r, "relative_to_f32": round(med, 4),
                          "relative_to_f32_quartiles": [round(lo, 4), round(hi, 4)]}

  def kernel(self):
    from hxmlir.lowering.matmul_q.cpu import cpu_kernel_info
    info, backend = cpu_kernel_info(), jax.default_backend()
    line = (f"hx.matmul_q on CPU (u4o g32 weights, [out, in]): {info.describe('uint4_f16', 32, layout='nk')}"
            if backend == "cpu" else f"hx.matmul_q on {backend}: its Pallas kernel")
    return "info", line, {"backend": backend, "cpu_kernel_active": info.active,
                          "cpu_kernel_isa": info.isa, "cpu_kernel_reason": info.reason}

  def weights(self):
    from hxmlir.gguf import device_bytes
    b = self.llm.weight_bytes()
    f = sum(device_bytes(w) for w in jax.tree.leaves(self.f32_params))
    line = (f"weights on the device: {b / 2**20:.2f} MiB as stored vs {f / 2**20:.2f} MiB "
            f"dequantized to f32 ({f / b:.2f}x smaller); KV cache "
            f"{self.llm.cache_bytes_per_token():,} bytes per token ({self.llm.kv_cache})")
    return "info", line, {"bytes": b, "f32_bytes": f, "ratio": f / b}

  def export(self):
    m = self.llm
    self.progress(f"exporting the decode step for {', '.join(self.platforms)}")
    exp = m.export_step(self.platforms)
    blob = exp.serialize()
    module = exp.mlir_module()
    self._write("exported_module.mlir", module)
    leaves = list(self._step_args(m.params))
    expected = np.asarray(exp.call(*leaves)[0])
    got = self._run_in_fresh_process(blob, leaves, expected,
                                     arguments_to_arrays(exp, leaves))
    same = got.shape == expected.shape and np.array_equal(got, expected)
    composites = count_composites(module)
    line = (f"decode step, {'/'.join(self.platforms)} artifact, {len(blob) / 2**20:.2f} MiB "
            f"({fmt_counts(composites)}); fresh process logits "
            f"{'identical' if same else 'DIFFER'} ({got.dtype}{list(got.shape)})")
    return ("ok" if same else "failed"), line, {
        "platforms": list(self.platforms), "artifact_bytes": len(blob),
        "identical": bool(same), "composites": composites}


def _stats_delta(before: dict, after: dict) -> dict:
  """``hx.stats()`` counters accumulated between two snapshots, per pass."""
  out = {}
  for name, counters in after.items():
    prev = before.get(name, {})
    out[name] = {k: (v - prev.get(k, 0)) if isinstance(v, int | float) else v
                 for k, v in counters.items()}
  return out


def run_demo(model: str = "builtin", *, dtype="int8", group_size: int | None = None,
             method: str = "absmax", out: str | os.PathLike | None = None, repeats: int = 30,
             platforms: Sequence[str] = EXPORT_PLATFORMS, pipeline: str | None = None,
             emit: Callable[[Step], None] | None = None,
             progress: Callable[[str], None] | None = None) -> Report:
  """Runs the demo on ``model`` (``"builtin"``, ``"minilm"`` or ``"smollm2"``) and returns
  its :class:`Report`. ``"smollm2"`` (:class:`_DecoderDemo`) runs the steps on the GGUF
  decoder as stored (``dtype``, ``group_size``, ``method`` do not apply): load, install,
  jit of the decode step, the IR's composites by format, accuracy and decode tok/s against
  a JAX f32 decoder on the dequantized weights, weight bytes, export of the decode step.

  ``dtype``, ``group_size``, ``method``: the weights' format, as :func:`hxmlir.quantize`
  takes it (``"int8"``, ``"int4"``, ``"float8_e4m3fn"`` or the JAX dtypes; groups of
  ``group_size`` along each weight's last axis; ``"absmax"`` or ``"mse"`` scales); the
  report's ``format`` says which, and the accuracy bound is the format's
  (:data:`hxmlir.models.registry.MINILM_MIN_COSINE`, ``BUILTIN_MAX_REL_ERR``).
  ``out``: a directory that keeps the artifact (``model.hxa``), its inputs and
  outputs (``.npz``), the IR before and after the passes (``*_before_passes.mlir``,
  ``*_after_passes.mlir``) and ``report.json``. ``repeats``: timed runs per
  model (median). ``pipeline``: the pass pipeline to install (default:
  ``hx.install()``'s). ``emit(step)`` is called as each step finishes,
  ``progress(message)`` during long steps. Raises ``ValueError`` for an
  unknown model or method and ``TypeError`` for an unknown dtype or a bad group size
  (not a positive even int); every other problem becomes a failed step. hxmlir is
  uninstalled again at the end unless it was installed before (run it with
  hxmlir not installed: the IR "before the passes" is lowered without it).
  """
  if model not in DEMO_MODELS:
    raise ValueError(f"unknown model {model!r}: choose one of {', '.join(DEMO_MODELS)}")
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  fmt = QuantFormat.of(dtype, group_size, method)
  cls = _DecoderDemo if model in DECODER_MODELS else _Demo
  return cls(model, fmt, Path(out) if out is not None else None, repeats, platforms, pipeline,
               emit or (lambda s: None), progress or (lambda m: None)).run()


def main_demo(model: str, *, as_json: bool, out: str | None, repeats: int,
              platforms: Sequence[str], pipeline: str | None = None, dtype="int8",
              group_size: int | None = None, method: str = "absmax",
              stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
  """The ``hxmlir demo`` command: prints each step's line (or, with ``as_json``, the
  report as JSON) and returns the exit status, 0 only when every check passed.
  ``stdout``/``stderr`` default to ``sys.stdout``/``sys.stderr`` at call time; the other
  arguments are :func:`run_demo`'s."""
  stdout = stdout if stdout is not None else sys.stdout
  stderr = stderr if stderr is not None else sys.stderr
  prog = ProgressLine(stderr)

  def emit(step: Step) -> None:
    prog.clear()
    if not as_json:
      print(step.text(), file=stdout, flush=True)

  fmt = QuantFormat.of(dtype, group_size, method)
  if not as_json:
    print(f"hxmlir demo --model {model} {fmt.flags()}".rstrip(), file=stdout, flush=True)
  report = run_demo(model, dtype=fmt.dtype, group_size=fmt.group_size, method=fmt.method,
                    out=out, repeats=repeats, platforms=platforms, pipeline=pipeline,
                    emit=emit,
                    progress=prog)
  prog.clear()
  if as_json:
    json.dump(report.to_json(), stdout, indent=1)
    stdout.write("\n")
  else:
    print(report.summary(), file=stdout)
    if out is not None:
      print(f"files kept in {out}", file=stdout)
  return 0 if report.ok else 1


__all__ = ["Report", "Step", "DemoModel", "QuantFormat", "build_model", "run_demo", "main_demo", "count_composites",
           "flatten_values", "unflatten_values", "MODELS", "EXPORT_PLATFORMS", "BUILTIN_MAX_REL_ERR",
           "MINILM_SENTENCES", "ProgressLine"]
