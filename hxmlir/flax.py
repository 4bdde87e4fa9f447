"""``hxmlir.flax``: a Flax NNX model's weights as hx quantized values, in one call.

``hxmlir.flax.quantize(model)`` returns a copy of an NNX module whose ``nnx.Linear``,
``nnx.LinearGeneral``, ``nnx.Einsum`` and ``nnx.Embed`` submodules are replaced by
quantized twins (:class:`QLinear`, :class:`QLinearGeneral`, :class:`QEinsum`,
:class:`QEmbed`). Each twin keeps the attribute names of the module it replaces
(``kernel``, ``bias``, ``embedding``, ``in_features``, ...) and its call signature, so the
model's own ``__call__`` runs unchanged; the weight is a :class:`hxmlir.QArray` of the
chosen format (:mod:`hxmlir.formats`) held in a :class:`QuantizedParam` variable, and is
applied with ``hx.einsum`` / ``hx.matmul_q`` (rows of an embedding table with
``hx.take_rows``). Biases, norms and every other parameter stay ``nnx.Param`` in f32, so
``nnx.grad`` (which differentiates ``nnx.Param`` by default) reaches them and never the
quantized weights.

Layout and scales. hxmlir quantizes along the *last* axis of the stored array, with one
scale per row (or per group of ``g`` elements of that axis). A Flax kernel is ``[in, out]``
(``x @ kernel``); quantizing it as stored would give one scale per *input* row. The default
``layout="out_in"`` stores the transposed kernel ``q8[out, in]`` instead -- the layout of
PyTorch ``Linear`` and GGUF checkpoints -- so the quantized axis is the contraction:
one scale per *output channel* (``group_size=g``: per output channel and group of ``g``
inputs, GGUF's blocks), the granularity qwix and most post-training quantizers use, and
the product is ``hx.einsum("...k,nk->...n", x, q)``, whose scales multiply the result.
``layout="in_out"`` keeps ``q8[in, out]`` (one scale per input row, groups along the
outputs): the layout the native CPU kernel serves while hxmlir is installed
(``hx.matmul_q``, the scales folded into ``x``). ``nnx.Embed`` tables ``[vocab, features]``
are quantized along ``features`` whatever the layout: one scale per token (and per output
of ``attend``, ``"...d,vd->...v"``).

Formats: every format :func:`hxmlir.quantize` makes: ``jnp.int8``, ``jnp.int4``,
``jnp.float8_e4m3fn`` (``method="absmax"`` or ``"mse"``) and ``"uint4"``, the format with
an offset (``method="minmax"``). The f16-scale formats come from checkpoints only
(:mod:`hxmlir.gguf`); asking for one is ``hx.quantize``'s ``TypeError``, naming the module.

Transformations: ``nnx.jit``, ``nnx.grad``, ``nnx.split``/``merge``/``state``/``update``,
``nnx.vmap`` over a stack of quantized layers (``in_axes`` :data:`STACKED`), ``nnx.scan``
(with ``length=``) and ``nnx.with_partitioning`` work as for the f32 model. For the
fastest calls, jit the forward with ``hx.jit`` on the split state
(``hx.jit(lambda st, x: nnx.merge(graphdef, st)(x))``): with ``jax.jit`` each call checks
every hi argument in Python (``benchmarks/flax_qwix.py``).

Checkpoints: a :class:`~hxmlir.QArray` is one JAX value with two or three components;
:func:`to_arrays` turns a state into a pytree of plain arrays (for ``orbax-checkpoint``)
and :func:`from_arrays` rebuilds it, bit for bit.

Needs the ``flax`` extra (``pip install 'hxmlir[flax]'``); ``import hxmlir`` alone never
imports Flax.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from opt_einsum.parser import parse_einsum_input

try:
  from flax import nnx
except ImportError as e:  # one line with the way out, not a bare "No module named 'flax'"
  raise ImportError(f"hxmlir.flax needs Flax ({e}); install it with: "
                    "pip install 'hxmlir[flax]'") from e

from hxmlir import formats
from hxmlir.models import _nn
from hxmlir.types.einsum import einsum
from hxmlir.types.gather import take_rows
from hxmlir.types.qarray import QArray, QArraySpec, dequantize, make_qarray
from hxmlir.types.qarray import quantize as hx_quantize

KEEP = "keep f32"
"""A rule's value that leaves the matching modules' weights in f32 (``None`` and ``"f32"``
mean the same)."""

LAYOUTS = ("out_in", "in_out")
"""Stored layouts of a dense kernel (see the module docstring)."""

QUANTIZED_TYPES = (nnx.Linear, nnx.LinearGeneral, nnx.Einsum, nnx.Embed)
"""The NNX module types whose weights :func:`quantize` turns into hx values (these classes
exactly, not their subclasses)."""


class QuantizedParam(nnx.Variable):
  """A weight held as a :class:`hxmlir.QArray` (``q8[out, in]``, ``q4[out, in:g32]``, ...).

  Not an ``nnx.Param``: ``nnx.grad``, ``nnx.state(model, nnx.Param)`` and optimizers see
  only the float parameters that remain. Read it with ``.get_value()``; its metadata
  ``out_sharding`` (from ``nnx.with_partitioning``) names the partitions of the stored
  dense shape, so ``nnx.get_partition_spec`` and ``jax.device_put`` place it."""


STACKED = nnx.StateAxes({QuantizedParam: QArraySpec(), ...: 0})
"""``nnx.vmap``'s ``in_axes`` for a stack of quantized layers (made with ``nnx.vmap``, then
:func:`quantize`): every variable mapped along axis 0, the quantized ones with
``hx.QArraySpec()`` (JAX maps hi values with their own spec, never an int).
``nnx.scan`` over such a stack takes ``in_axes=(nnx.Carry, 0)`` and needs ``length=``
(JAX's ``scan`` does not read the length off hi values)."""


# --- rules ------------------------------------------------------------------

def _spec(value, default: dict) -> dict | None:
  """A rule's value as ``hx.quantize`` keyword arguments (``None``: keep f32)."""
  if value is None or (isinstance(value, str) and value in (KEEP, "f32", "float32")):
    return None
  if isinstance(value, Mapping):
    unknown = set(value) - {"dtype", "group_size", "method"}
    if unknown:
      raise TypeError(f"hxmlir.flax.quantize: a rule's dict takes dtype, group_size and "
                      f"method, got {sorted(unknown)}")
    return {**default, **value}
  return {**default, "dtype": value}


def _rule_list(rules) -> list[tuple[str, Any]]:
  if rules is None:
    return []
  items = list(rules.items()) if isinstance(rules, Mapping) else list(rules)
  for item in items:
    if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
      raise TypeError("hxmlir.flax.quantize: rules are {module-path regex: format} or "
                      f"[(regex, format), ...], got {item!r}")
    try:
      re.compile(item[0])
    except re.error as e:
      raise ValueError(f"hxmlir.flax.quantize: rule {item[0]!r} is not a regex: {e}") from None
  return items


def module_path(path: Sequence) -> str:
  """An NNX path (``('layers', 0, 'attn', 'q')``) as rules match it: ``"layers/0/attn/q"``
  (qwix's ``QuantizationRule.module_path`` spelling)."""
  return "/".join(map(str, path))


# --- the quantized twins -----------------------------------------------------

def _value(v):
  return v.get_value() if isinstance(v, nnx.Variable) else v


def _bias(module):
  return module.bias.get_value() if module.bias is not None else None


def _out_dtype(y, dtype):
  return y if dtype is None else y.astype(dtype)


def _matmul(x, q, layout: str):
  """``x: f32[..., k]`` times a stored kernel ``q8[n, k]`` (``"out_in"``) or ``q8[k, n]``
  (``"in_out"``: the leading axes of ``x`` flattened into rows, one 2-D ``hx.matmul_q``,
  exactly as :func:`hxmlir.models._nn.linear` does)."""
  return einsum("...k,nk->...n", x, q) if layout == "out_in" else _nn.linear(x, q)


class QLinear(nnx.Module):
  """``nnx.Linear`` with a quantized kernel: ``f32[..., in] -> f32[..., out]``.

  ``kernel``: a :class:`QuantizedParam` holding ``q8[out, in]`` (``layout="out_in"``,
  applied with ``hx.einsum("...k,nk->...n")``) or ``q8[in, out]`` (``"in_out"``,
  ``hx.matmul_q``); ``bias``: the original ``nnx.Param`` ``f32[out]`` or ``None``. ``x``
  may be f32, bf16 or f16 (the product accumulates in f32); the result has the original
  module's ``dtype`` when it set one, else f32."""

  def __init__(self, src: nnx.Linear, kernel: QuantizedParam, layout: str):
    self.kernel = kernel
    self.bias = src.bias
    self.layout = layout
    self.in_features, self.out_features = src.in_features, src.out_features
    self.use_bias, self.dtype, self.param_dtype = src.use_bias, src.dtype, src.param_dtype

  def __call__(self, inputs, out_sharding=None):
    y = _matmul(inputs, self.kernel.get_value(), self.layout)
    bias = _bias(self)
    if bias is not None:
      y = y + bias
    return _out_dtype(y, self.dtype)


class QLinearGeneral(nnx.Module):
  """``nnx.LinearGeneral`` (no ``batch_axis``) with a quantized kernel: the contracted
  axes ``axis`` of ``x`` (sizes ``in_features``) flattened into one ``k``, the kernel
  stored as ``q8[prod(out_features), k]`` (or ``[k, prod(out)]``, ``layout="in_out"``).
  ``f32[..., *in] -> f32[..., *out_features]``, as the original."""

  def __init__(self, src: nnx.LinearGeneral, kernel: QuantizedParam, layout: str):
    self.kernel = kernel
    self.bias = src.bias
    self.layout = layout
    self.in_features, self.out_features, self.axis = src.in_features, src.out_features, src.axis
    self.use_bias, self.dtype, self.param_dtype = src.use_bias, src.dtype, src.param_dtype

  def __call__(self, inputs, out_sharding=None):
    axis = tuple(a % inputs.ndim for a in self.axis)
    x = jnp.moveaxis(inputs, axis, tuple(range(inputs.ndim - len(axis), inputs.ndim)))
    lead = x.shape[:x.ndim - len(axis)]
    y = _matmul(x.reshape(*lead, -1), self.kernel.get_value(), self.layout)
    y = y.reshape(*lead, *self.out_features)
    bias = _bias(self)
    if bias is not None:
      y = y + bias
    return _out_dtype(y, self.dtype)


def _einsum_parts(einsum_str: str) -> tuple[str, str, str]:
  ins, out = einsum_str.replace(" ", "").split("->")
  lhs, rhs = ins.split(",")
  return lhs, rhs, out


def _einsum_perm(einsum_str: str | None, ndim: int) -> tuple[int, ...]:
  """The kernel axes' order that puts the one contracted kernel axis last (per output
  channel); the stored order when there is no ``einsum_str`` yet, or the kernel has more
  or fewer than one contracted axis (then ``hx.einsum`` decides whether its scales fold)."""
  if einsum_str is None:
    return tuple(range(ndim))
  lhs, rhs, out = _einsum_parts(einsum_str)
  contracted = [i for i, c in enumerate(rhs) if c not in out]
  if len(contracted) != 1 or "." in rhs:
    return tuple(range(ndim))
  (c,) = contracted
  return tuple(i for i in range(ndim) if i != c) + (c,)


class QEinsum(nnx.Module):
  """``nnx.Einsum`` with a quantized kernel: the kernel's axes permuted by ``perm`` so that
  its one contracted axis is last (one scale per output channel), applied with
  ``hx.einsum`` on the subscripts permuted alike. ``kernel_shape`` stays the original's."""

  def __init__(self, src: nnx.Einsum, kernel: QuantizedParam, perm: tuple[int, ...]):
    self.kernel = kernel
    self.bias = src.bias
    self.perm = perm
    self.einsum_str, self.kernel_shape, self.bias_shape = (src.einsum_str, src.kernel_shape,
                                                           src.bias_shape)
    self.dtype, self.param_dtype = src.dtype, src.param_dtype

  def __call__(self, inputs, einsum_str=None, out_sharding=None):
    einsum_str = einsum_str if einsum_str is not None else self.einsum_str
    if einsum_str is None:
      raise ValueError("QEinsum: no einsum_str, neither as an argument nor as an attribute")
    lhs, rhs, out = _einsum_parts(einsum_str)
    if "." not in rhs:
      if len(rhs) != len(self.perm):
        raise ValueError(f"QEinsum: {einsum_str!r} has {len(rhs)} kernel indices, the kernel "
                         f"{len(self.perm)} axes")
      rhs = "".join(rhs[i] for i in self.perm)
    y = einsum(f"{lhs},{rhs}->{out}", inputs, self.kernel.get_value())
    bias = _bias(self)
    if bias is not None:
      # nnx.Einsum's rule: the bias spans the output indices that come from the kernel
      shapes = (SimpleNamespace(shape=inputs.shape), SimpleNamespace(shape=self.kernel_shape))
      ins, out_full, _ = parse_einsum_input((einsum_str.replace(" ", ""), *shapes))
      k_idx = ins.split(",")[1]
      y = y + jnp.reshape(bias, [self.kernel_shape[k_idx.index(c)] if c in k_idx else 1
                                 for c in out_full])
    return _out_dtype(y, self.dtype)


class QEmbed(nnx.Module):
  """``nnx.Embed`` with a quantized table ``q8[num_embeddings, features]`` (one scale per
  row: per token). ``__call__(ids: int[*b]) -> f32[*b, features]`` gathers the selected
  rows only (``hx.take_rows``; ids outside ``[0, num_embeddings)`` are clamped, where
  ``nnx.Embed`` gives NaN); ``attend(query: f32[..., features]) -> f32[...,
  num_embeddings]`` is ``hx.einsum("...d,vd->...v")``."""

  def __init__(self, src: nnx.Embed, embedding: QuantizedParam):
    self.embedding = embedding
    self.num_embeddings, self.features = src.num_embeddings, src.features
    self.dtype, self.param_dtype = src.dtype, src.param_dtype

  def __call__(self, inputs, out_sharding=None):
    if not jnp.issubdtype(inputs.dtype, jnp.integer):
      raise ValueError(f"QEmbed: ids must be integers, got {inputs.dtype}")
    table = self.embedding.get_value()
    if self.num_embeddings == 1:
      y = jnp.broadcast_to(dequantize(table)[0], (*inputs.shape, self.features))
    else:
      y = take_rows(table, inputs)
    return _out_dtype(y, self.dtype)

  def attend(self, query, out_sharding=None):
    return _out_dtype(einsum("...d,vd->...v", query, self.embedding.get_value()), self.dtype)


# --- quantize ----------------------------------------------------------------

def _stored(module, layout: str):
  """``(f32 array to quantize, axes, extra)`` for ``module``'s weight in the stored layout:
  ``axes`` lists, per stored axis, the weight's axes it is made of (for the sharding).
  Leading axes beyond the module's own (a stack of layers made with ``nnx.vmap``) of an
  ``nnx.Linear`` kernel or ``nnx.Embed`` table stay leading axes."""
  if isinstance(module, nnx.Embed):
    w = _value(module.embedding)
    return w, tuple((a,) for a in range(w.ndim)), None
  w = _value(module.kernel)
  if isinstance(module, nnx.Einsum):
    if w.ndim != len(module.kernel_shape):
      raise TypeError(f"a kernel of shape {w.shape} for kernel_shape {module.kernel_shape} "
                      "(stacked layers): keep it f32 with a rule")
    perm = _einsum_perm(module.einsum_str, w.ndim)
    return jnp.transpose(w, perm), tuple((p,) for p in perm), perm
  if isinstance(module, nnx.LinearGeneral):
    n_in = len(module.in_features)
    if module.batch_axis or w.ndim != n_in + len(module.out_features):
      raise TypeError("nnx.LinearGeneral with batch_axis or stacked kernels is not "
                      "supported; keep it f32 with a rule")
    lead, ins, outs = (), tuple(range(n_in)), tuple(range(n_in, w.ndim))
    w = w.reshape(int(np.prod(module.in_features)), int(np.prod(module.out_features)))
  else:
    lead, ins, outs = tuple((a,) for a in range(w.ndim - 2)), (w.ndim - 2,), (w.ndim - 1,)
  if layout == "out_in":
    return jnp.swapaxes(w, -1, -2), (*lead, outs, ins), None
  return w, (*lead, ins, outs), None


def _stored_spec(spec, axes) -> PartitionSpec | None:
  """The kernel's partition names ``spec`` (one per kernel axis) for the stored layout:
  a stored axis made of several kernel axes takes the one sharded name among them."""
  if spec is None:
    return None
  names = tuple(spec) + (None,) * (max(max(a) for a in axes) + 1 - len(spec))
  out = []
  for group in axes:
    sharded = [names[a] for a in group if names[a] is not None]
    if len(sharded) > 1:
      return None
    out.append(sharded[0] if sharded else None)
  return PartitionSpec(*out)


def quantize(model: nnx.Module, dtype=jnp.int8, group_size: int | None = None,
             method: str = "absmax", rules=None, *, layout: str = "out_in") -> nnx.Module:
  """A copy of NNX ``model`` whose dense and embedding weights are hx quantized values.

  Every ``nnx.Linear``, ``nnx.LinearGeneral``, ``nnx.Einsum`` and ``nnx.Embed`` submodule
  (``model`` itself included; these classes exactly: a subclass such as
  ``nnx.LoRALinear`` has a call of its own, which a twin would drop, so it stays f32)
  becomes its quantized twin (:class:`QLinear`, ...), its
  weight ``hx.quantize(w, dtype, group_size=group_size, method=method)`` in the stored
  layout of the module docstring (``layout="out_in"``: ``q8[out, in]``, one scale per
  output channel; ``"in_out"``: ``q8[in, out]``, the native CPU kernel's). Called like
  ``model``; ``model`` is left as it was (the copy shares its float arrays).

  ``rules``: ``{module-path regex: value}`` or ``[(regex, value), ...]``; the first regex
  that matches a module's path (:func:`module_path`, ``re.fullmatch``, like qwix's
  ``QuantizationRule(module_path=...)``) decides: a dtype or format name (with the
  call's ``group_size`` and ``method``), a dict of ``dtype``/``group_size``/``method``, or
  :data:`KEEP` (also ``None``, ``"f32"``) for an f32 module. Modules no rule matches take
  the call's format.

  The weights are quantized in one jitted computation; a weight placed with a
  ``NamedSharding`` keeps its partitions (permuted to the stored layout). Raises
  ``TypeError``/``ValueError`` naming the module path when a format cannot hold its
  weight (``hx.quantize``'s message: an odd ``in`` for int4, a group size that does not
  divide it, a format that comes from checkpoints only), for a bad rule or ``layout``,
  and when ``model`` is not an ``nnx.Module``.
  """
  if not isinstance(model, nnx.Module):
    raise TypeError(f"hxmlir.flax.quantize expects an nnx.Module, got {type(model).__name__}")
  if layout not in LAYOUTS:
    raise ValueError(f"hxmlir.flax.quantize: layout must be one of {LAYOUTS}, got {layout!r}")
  rules_ = _rule_list(rules)
  default = {"dtype": dtype, "group_size": group_size, "method": method}
  graphdef, state = nnx.split(model)
  model = nnx.merge(graphdef, state)  # a new graph sharing the arrays
  todo = []
  for path, module in nnx.iter_modules(model):
    if type(module) not in QUANTIZED_TYPES:  # exactly these: a subclass has its own call
      continue
    name = module_path(path)
    spec = next((_spec(v, default) for r, v in rules_ if re.fullmatch(r, name)), default)
    if spec is None:
      continue
    try:
      w, axes, extra = _stored(module, layout)
      jax.eval_shape(lambda a, spec=spec: quantize_weight(a, **spec), w)
    except (TypeError, ValueError) as e:
      raise type(e)(f"hxmlir.flax.quantize: module {name!r} ({type(module).__name__}): "
                    f"{e}") from None
    todo.append((path, module, w, axes, extra, spec))
  if not todo:
    return model
  specs = [t[-1] for t in todo]
  qs = jax.jit(lambda ws: [quantize_weight(w, **s) for w, s in zip(ws, specs)])(
      [t[2] for t in todo])
  twins = {}
  for (_, module, w, axes, extra, _), q in zip(todo, qs):
    old = module.embedding if isinstance(module, nnx.Embed) else module.kernel
    meta = {k: v for k, v in old.get_metadata().items()
            if k not in ("hijax", "ref", "eager_sharding", "out_sharding")}
    pspec = _stored_spec(old.get_metadata("out_sharding", None), axes)
    sharding = getattr(w, "sharding", None)
    if pspec is not None:
      meta["out_sharding"] = tuple(pspec)
      if isinstance(sharding, NamedSharding):
        q = jax.device_put(q, NamedSharding(sharding.mesh, pspec))
    var = QuantizedParam(q, eager_sharding=False, **meta)
    if isinstance(module, nnx.Embed):
      twins[id(module)] = QEmbed(module, var)
    elif isinstance(module, nnx.Einsum):
      twins[id(module)] = QEinsum(module, var, extra)
    elif isinstance(module, nnx.LinearGeneral):
      twins[id(module)] = QLinearGeneral(module, var, layout)
    else:
      twins[id(module)] = QLinear(module, var, layout)
  if id(model) in twins:
    return twins[id(model)]
  # every reference to a quantized module (a module shared by two attributes, tied
  # embeddings) now points to its one twin
  for _, parent in list(nnx.iter_modules(model)):
    for key, child in list(nnx.iter_children(parent)):
      if id(child) in twins:
        if isinstance(key, int):
          parent[key] = twins[id(child)]
        else:
          setattr(parent, key, twins[id(child)])
  return model


def quantize_weight(w, dtype=jnp.int8, group_size: int | None = None,
                    method: str = "absmax") -> QArray:
  """``hx.quantize(w, dtype, group_size=..., method=...)`` of one stored weight; the format
  is looked up first, so a bad ``dtype`` raises ``hx.quantize``'s ``TypeError``."""
  return hx_quantize(w, formats.lookup(dtype).name, group_size=group_size, method=method)


# --- checkpoints ---------------------------------------------------------------

_PARTS = ("qvalue", "scale", "offset")


def to_arrays(state) -> Any:
  """``state`` (an ``nnx.State`` or any pytree) with each :class:`~hxmlir.QArray` leaf
  replaced by the dict of its components ``{"qvalue", "scale"[, "offset"]}``: plain
  arrays that ``orbax-checkpoint`` (or any array store) saves as they are, bit for bit."""
  def parts(x):
    if isinstance(x, QArray):
      return dict(zip(_PARTS, x.components))
    return x
  return jax.tree.map(parts, state, is_leaf=lambda x: isinstance(x, QArray))


def from_arrays(state) -> Any:
  """:func:`to_arrays`' inverse: every ``{"qvalue", "scale"[, "offset"]}`` dict of arrays
  becomes the :class:`~hxmlir.QArray` of those components (``hx.make_qarray``'s type
  rule: the format is read off the components' dtypes). Raises ``TypeError`` naming the
  components when no format has them."""
  def is_parts(x):
    return isinstance(x, Mapping) and set(x) in ({"qvalue", "scale"}, set(_PARTS))

  def build(x):
    if not is_parts(x):
      return x
    comps = [x[p] for p in _PARTS if p in x]
    if any(isinstance(c, jax.core.Tracer) for c in comps):
      return make_qarray(*comps)
    return QArray(*comps)
  return jax.tree.map(build, state, is_leaf=is_parts)


__all__ = ["KEEP", "LAYOUTS", "STACKED", "QEinsum", "QEmbed", "QLinear", "QLinearGeneral",
           "QuantizedParam", "from_arrays", "module_path", "quantize",
           "quantize_weight", "to_arrays"]
