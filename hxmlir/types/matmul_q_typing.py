"""``hx.matmul_q``'s typing rule, written once.

``y = dot_general(x, dequantize(w), dimension_numbers)`` for a dense ``x`` and a quantized
weight ``w`` of any format (:mod:`hxmlir.formats`): :func:`result_type` takes the operand
types -- ``x``'s shape and dtype, the weight's dense shape and whether its scales are per
group, the dimension numbers -- and returns the result's dims, shape and dtype, or raises
:class:`MatmulQTypeError` naming both operand types. Three places ask it, each with the
operand types it has:

- the hi primitive's check (:func:`hxmlir.types.qarray.matmul_q_result_type`, and
  ``hx.einsum`` through it), on ``x`` and the ``q8`` type: ``x`` of
  :data:`DENSE_DTYPES`;
- the lo primitive's abstract eval (:mod:`hxmlir.lowering.matmul_q.primitive`), on ``x``
  and the weight's components, after the hi-to-lo rule converted ``x`` to f32:
  :data:`LO_DENSE_DTYPES`;
- the composite schema (``hx-verify``, :mod:`hxmlir.lowering.schema`), on the
  ``stablehlo.composite "hx.matmul_q"``'s operand types, the same contract.

The arithmetic of the dimension numbers (result layout, where the scales go) is
:mod:`hxmlir.types.dotdims`'s; the result's sharding is
:func:`hxmlir.types.dotdims.result_parts`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax.numpy as jnp
from jax.experimental.hijax import ShapedArray

from hxmlir.types import dotdims
from hxmlir.types.dotdims import DotDims

F32 = jnp.dtype("float32")

DENSE_DTYPES = (F32, jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
"""The dtypes of the dense operand ``x`` that :func:`hxmlir.types.qarray.matmul_q` and
:func:`hxmlir.types.einsum.einsum` accept: f32, and bf16/f16 activations, which the op
converts to f32 (exactly) before its ``hx.matmul_q`` composite (``lowering/to_lojax.py``),
whose contract is :data:`LO_DENSE_DTYPES`; f32 accumulation, result dtype
:func:`matmul_q_dtype`. ``hx.einsum`` and the jaxpr stage of ``hx-fold-scales`` ask
:func:`dense_dtype`."""

LO_DENSE_DTYPES = (F32,)
"""The dtypes of ``x`` in the lo primitive ``hx_matmul_q_p`` and the composite
``hx.matmul_q`` (``lowering/schema.py``): what every kernel takes."""


def dense_dtype(aval) -> jnp.dtype | None:
  """``aval``'s dtype when it is a dense operand :func:`hxmlir.types.qarray.matmul_q` accepts
  (:data:`DENSE_DTYPES`), else ``None``."""
  dtype = getattr(aval, "dtype", None) if isinstance(aval, ShapedArray) else None
  return dtype if dtype in DENSE_DTYPES else None


def matmul_q_dtype(x_dtype) -> jnp.dtype:
  """The result dtype of a product of a dense ``x_dtype`` operand and a quantized one:
  JAX's dot of ``x`` with the dequantized f32 weight (``jnp.result_type``): ``float32``."""
  return jnp.result_type(x_dtype, F32)


def dense_dtype_hint(aval) -> str:
  """What an error about a refused dense operand ``aval`` suggests: for a floating array
  of another dtype (``f64``), the conversion to f32 that makes it acceptable."""
  dtype = getattr(aval, "dtype", None)
  if (isinstance(aval, ShapedArray) and jnp.issubdtype(dtype, jnp.floating)
      and dtype not in DENSE_DTYPES):
    return "; convert it with .astype(jnp.float32)"
  return ""


class MatmulQTypeError(TypeError):
  """Operand types ``hx.matmul_q`` does not take: ``problem`` (what is wrong, a phrase),
  ``operands`` (both operand types, as the caller names them: ``f32[2,5] @ q8[3,4]``),
  ``kind`` (``"dtype"``: ``x``'s dtype; ``"layout"``: the default dims' ranks, batch or
  contracting sizes; ``"dims"``: the dimension numbers, :func:`hxmlir.types.dotdims.problems`)
  and ``hint`` (the way out, or empty). The message is the schema's form
  (``<problem>, got <operands>`` for a dtype, ``<problem>: <operands>`` otherwise);
  :meth:`for_caller` is the hi primitive's, which names the caller first."""

  def __init__(self, problem: str, operands: str | Callable[[], str], kind: str, hint: str = ""):
    operands = operands() if callable(operands) else operands  # named when it fails only
    self.problem, self.operands, self.kind, self.hint = problem, operands, kind, hint
    sep = ", got " if kind == "dtype" else ": "
    super().__init__(f"{problem}{sep}{operands}{hint}")

  def for_caller(self, who: str) -> str:
    """The message with ``who`` (``hx.matmul_q``, ``hx.einsum('mk,nk->mn')``) first:
    ``<who> <problem>: <operands>``, for the dimension numbers
    ``<who>: <operands>: <problem>``."""
    if self.kind == "dims":
      return f"{who}: {self.operands}: {self.problem}{self.hint}"
    return f"{who} {self.problem}: {self.operands}{self.hint}"


def dtype_names(dtypes: Sequence = DENSE_DTYPES) -> str:
  """``dtypes`` as messages name them: ``"f32, bf16 or f16"``."""
  names = [jnp.dtype(d).name.replace("float", "f") for d in dtypes]  # f32, bf16, f16
  return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def check_dense_dtype(x_dtype, operands: str | Callable[[], str], dtypes: Sequence = DENSE_DTYPES,
                      hint: str = "") -> None:
  """Raises :class:`MatmulQTypeError` (kind ``"dtype"``) unless ``x_dtype`` (a dtype, or
  ``None`` for one that is no array dtype) is one of ``dtypes``."""
  if x_dtype is None or x_dtype not in dtypes:
    raise MatmulQTypeError(f"expects a dense {dtype_names(dtypes)} operand", operands,
                           "dtype", hint)


def result_type(x_shape: Sequence[int], x_dtype, dense_shape: Sequence[int], grouped: bool,
                dims: DotDims | None = None, *, operands: str | Callable[[], str],
                dtypes: Sequence = DENSE_DTYPES, dtype_hint: str = ""):
  """The result of ``dot_general(x, dequantize(w), dims)``: ``(dims, shape, dtype)``.

  ``x``: ``x_shape`` and ``x_dtype`` (one of ``dtypes``, :data:`DENSE_DTYPES` or
  :data:`LO_DENSE_DTYPES`; ``None``: no array dtype); the weight: its ``dense_shape``
  (quantized along the last axis) and ``grouped`` (scales per group of the last axis,
  not per row); ``dims``: ``lax.dot_general``'s dimension numbers, or ``None`` for
  ``hx.matmul_q(x, w)``'s layouts (:func:`hxmlir.types.dotdims.matmul_dims`:
  ``f32[..., k] @ q8[k, n]``, ``f32[*b, m, k] @ q8[*b, k, n]``). ``dims`` in the result is
  the one used; ``shape`` is ``dot_general``'s (batch dims, ``x``'s free dims, the
  weight's); ``dtype`` :func:`matmul_q_dtype`.

  Raises :class:`MatmulQTypeError` naming ``operands`` (how the caller names both operand
  types; a function returning it, called when the types are refused) for a dtype outside ``dtypes`` (with ``dtype_hint`` appended), default layouts whose
  ranks, batch or contracting sizes do not fit, and dimension numbers that are out of
  range, pair dims of other sizes, or have no place for the scales.
  """
  check_dense_dtype(x_dtype, operands, dtypes, dtype_hint)
  if dims is None:
    dims = dotdims.matmul_dims(len(x_shape), len(dense_shape))
    if dims is None:
      raise MatmulQTypeError("expects f32[..., k] @ q8[k, n] or f32[*b, m, k] @ q8[*b, k, n] "
                             "of equal rank >= 2", operands, "layout",
                             " (hx.einsum takes other layouts)")
    (lc, rc), (lb, rb) = dims
    if [x_shape[d] for d in lb] != [dense_shape[d] for d in rb]:
      raise MatmulQTypeError("batch dimensions differ", operands, "layout")
    if x_shape[lc[0]] != dense_shape[rc[0]]:
      raise MatmulQTypeError(f"contracting dimensions differ ({x_shape[lc[0]]} vs "
                             f"{dense_shape[rc[0]]})", operands, "layout")
  problems = dotdims.problems(x_shape, dense_shape, dims, grouped)
  if problems:
    raise MatmulQTypeError(problems[0], operands, "dims")
  return dims, dotdims.result_shape(x_shape, dense_shape, dims), matmul_q_dtype(x_dtype)
