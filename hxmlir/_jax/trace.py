"""Tracing and types: JAX's core names hxmlir's hi types and hi primitives build on
(mapping helpers, staging values, zeros, type matching, manual axes, ``hx.jit``'s
lowered trace). Changes nothing of JAX's.

Part of the JAX seam (:mod:`hxmlir._jax`).
"""

from __future__ import annotations

import sys as _sys

from jax._src import ad_util as _ad_util
from jax._src import core as core
from jax._src.hijax import MappingSpec as MappingSpec

# --- hi types: mapping helpers for component types (vmap / scan) ------------
mapped_aval = core.mapped_aval
unmapped_aval = core.unmapped_aval


# --- hi primitives: values a to_lojax rule passes through (hiprim.py) ---------
def stage_value(x):
  """``x`` lifted into the current trace: a constant of the jaxpr being built, or
  ``x`` itself when evaluating eagerly. JAX's ``lower_jaxpr`` expects every lo value
  a ``to_lojax`` rule returns to be a tracer of its trace, also a closed-over constant."""
  return core.trace_ctx.trace.stage_value(x)


def is_hi_level_tracer(x) -> bool:
  """Whether ``x`` is a tracer of a trace that takes hi primitives as they are.

  ``jit`` tracing, ``grad``, ``vmap`` and ``scan`` bodies (``requires_low`` false)
  see a hi value as one tracer of a hi type, so a value class (``hx.QArray``)
  holding such tracers was built by hand in traced code. Traces that run hi
  primitives through their ``to_lojax`` rules at once (lowering, an un-jitted
  ``shard_map``) legitimately build value classes holding their own tracers."""
  return isinstance(x, core.Tracer) and not x._trace.requires_low


# --- hi types: where a plain PartitionSpec for a hi value came from (hiprim.py) --

from jax._src import pmap as _pmap  # noqa: E402
from jax._src import shard_map as _shard_map  # noqa: E402


def plain_spec_origin() -> str | None:
  """Why a hi type's ``shard``/``unshard`` is being handed a plain ``PartitionSpec``.

  ``"eager"`` inside JAX's un-jitted ``shard_map`` (``_shard_map_impl``, which
  reshards with plain specs whatever the user wrote), ``"pmap"`` inside
  ``jax.pmap`` (built on ``shard_map`` with plain specs), else ``None``: the
  user's own spec. Read off the Python stack: only called to word an error.
  """
  f = _sys._getframe(1)
  while f is not None:
    file, name = f.f_code.co_filename, f.f_code.co_name
    if file == _pmap.__file__:
      return "pmap"
    if file == _shard_map.__file__ and name == "_shard_map_impl":
      return "eager"
    f = f.f_back
  return None


# --- lowering: lo primitives --------------------------------------------------
from jax._src import dispatch as _dispatch  # noqa: E402

apply_primitive = _dispatch.apply_primitive


# --- hi rules: zeros of a type, as JAX makes them (hiprim.zeros) --------------

zeros_like_aval = _ad_util.zeros_like_aval
"""Zeros of an aval exactly as JAX's AD makes them: a hi type's ``vspace_zero()``; an
array of the aval's sharding, also on no mesh under ``jax.set_mesh``, varying over
its manual axes."""


typematch = core.typematch
"""JAX's type equivalence (``core.typematch``): arrays match up to weak type, and up to
sharding when either is on no mesh; what its AD accepts as a cotangent's type."""


# --- hi types: manual-axis (shard_map check_vma) type component ---------------
ManualAxisType = core.ManualAxisType
empty_mat = core.empty_mat
from jax._src.interpreters import ad as _hi_ad  # noqa: E402

GradAccum = _hi_ad.GradAccum
"""What a hi primitive's ``transpose`` receives for its linear operands (``.accum(ct)``)."""


# --- hx.jit: a function traced with its hi equations lowered (dispatch.py) ---------
import jax as _jax_api  # noqa: E402
from jax._src.interpreters import partial_eval as _pe  # noqa: E402


def at_top_level() -> bool:
  """Whether no transformation is tracing (``jit``, ``grad``, ``vmap``, ...): values here
  are concrete, and a jitted call is dispatched rather than staged."""
  return core.trace_state_clean()


def trace_lowered(fun, *args, **kwargs):
  """``fun(*args, **kwargs)`` staged into the current trace with every hi equation
  replaced by its lo equations (their ``to_lojax`` rules, as ``jax.jit`` lowers a hi
  jaxpr before compiling it).

  ``args``/``kwargs`` and the results are pytrees of lo values (hi values only in
  between). A ``jax.jit`` of a function whose jaxpr holds hi equations is dispatched
  from Python on every call (JAX 0.10.2's ``pjit._infer_params`` keeps no parameters
  for it, so the C++ cache never holds it); one whose equations are all lo, as here,
  takes JAX's C++ cache and dispatch.
  """
  closed, shape = _jax_api.make_jaxpr(fun, return_shape=True)(*args, **kwargs)
  if closed.jaxpr.is_high:
    closed = _pe.lower_jaxpr2(closed)
  outs = core.eval_jaxpr(closed.jaxpr, closed.consts, *_jax_api.tree.leaves((args, kwargs)))
  return _jax_api.tree.unflatten(_jax_api.tree.structure(shape), outs)

