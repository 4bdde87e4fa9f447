"""``jax.jit`` of hi code on JAX's C++ dispatch path: a jaxpr with hi equations lowered
before JAX caches its executable, and hi values flattened to their components by the
C++ path.

Why JAX 0.10.2 refuses the C++ path: a jitted function's first call (a C++ cache miss)
runs ``pjit``'s ``cache_miss``, which traces (``_infer_params``) and runs the jaxpr
(``_run_python_pjit``). A jaxpr that holds a hi equation, or has hi arguments or results,
is not run there: it is bound as ``jit_p`` on the eval trace, whose ``to_lojax`` rule
lowers it and binds ``jit_p`` again with the lo jaxpr. That inner call compiles and runs
the program, but ``cache_miss`` gets no executable back, so ``_get_fastpath_data``
returns nothing and the C++ cache keeps no entry: every later call misses again and goes
through Python (``_infer_params`` does not even keep the traced parameters of a hi
jaxpr). And the C++ path flattens arguments with ``tree_util.dispatch_registry``, in
which a hi value is a leaf it cannot take (only arrays and scalars), so a call with a
``q8`` argument would miss even with an entry.

What :func:`install_fastpath` changes, both undone by :func:`uninstall_fastpath`:

- ``pjit._run_python_pjit`` (looked up by attribute by ``cache_miss``, and by nothing
  else): where ``active()`` (hxmlir installed in the calling thread), no transformation
  traces, and the jaxpr is hi but holds no mutable hi state (no ``has_qdd`` type, no
  hoisted constants), the wrapper lowers the jaxpr and its parameters exactly as
  ``jit_p.to_lojax`` does (``pe.lower_jaxpr`` on the argument components' types,
  ``pjit._lojax_expand_params``: donation, shardings and layouts per component) and runs
  JAX's own ``_run_python_pjit`` on the lo jaxpr and the arguments' components. JAX then
  compiles the program its ``to_lojax`` path compiles, gets the executable, and hands
  ``_get_fastpath_data`` what it needs; the results are raised back to hi values. Anything
  else goes to JAX's function unchanged.
- ``tree_util.dispatch_registry`` (JAX's registry for "types we want to teach the fast
  dispatch path how to flatten", as for PRNG key arrays): a node for each class given
  (``hx.QArray``, ``hx.Rank1``, ``hx.HiTup``), registered the first time and never removed
  (a ``PyTreeRegistry`` has no removal), whose flattening reads ``active()`` on each call:
  while active, the value's components in its type's ``lower_val`` order (a tuple's
  elements, flattened in turn); otherwise one opaque leaf holding the value, which the C++
  path refuses as it refused the value itself (its fallback is ``cache_miss``, as before).
  No other JAX code flattens with this registry but ``_get_fastpath_data``'s outputs, and
  ``jax.device_get`` of extended-dtype arrays.

Part of the JAX seam (:mod:`hxmlir._jax`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from jax._src import config as _config
from jax._src import core
from jax._src import dispatch as _dispatch
from jax._src import pjit as _pjit
from jax._src import tree_util as _tree_util
from jax._src.interpreters import partial_eval as _pe

from hxmlir._jax.lowering import exclude_from_tracebacks as _exclude_from_tracebacks


def _plain_hi(jaxpr) -> bool:
  """Whether closed jaxpr ``jaxpr`` is hi (a hi equation, argument or result) without
  mutable hi state: no argument, result or constant of a type with ``has_qdd``
  (``jit_p.to_lojax`` moves such constants to arguments and writes state back)."""
  return (jaxpr.jaxpr.is_high
          and not any(a.has_qdd for a in jaxpr.in_avals)
          and not any(a.has_qdd for a in jaxpr.out_avals)
          and not any(core.typeof(c).has_qdd for c in jaxpr.consts))


def _lowered(p, args_flat: list):
  """``(p_lo, lo_args, out_avals)``: pjit parameters ``p`` with their jaxpr lowered to lo
  equations over the components of ``args_flat`` (as ``jit_p.to_lojax`` lowers them), the
  components, and the lo results' ``FlatTree`` of types (one entry per hi result)."""
  # as ``jit_p.to_lojax``: its move of closed-over mutables (none here: ``_plain_hi``)
  # rebuilds the jaxpr, which drops its argument and result names from the module
  jaxpr, moved = _pe.convert_const_himutables(p.params["jaxpr"])
  assert not moved
  lo_lol = [a.lower_val(x) for a, x in zip(jaxpr.in_avals, args_flat)]
  lo_args = [x for xs in lo_lol for x in xs]
  in_avals = _tree_util.FlatTree.flatten(([[core.typeof(x) for x in xs] for xs in lo_lol], {}))
  lo_jaxpr, out_avals = _pe.lower_jaxpr(jaxpr, in_avals)
  params = {k: v for k, v in p.params.items() if k != "jaxpr"}
  # ``jaxpr``: the hi jaxpr, which hxmlir's wrapper of ``_lojax_expand_params`` reads to
  # expand jit shardings by component (JAX's passes it through in ``params``)
  params = _pjit._lojax_expand_params(in_avals, out_avals, jaxpr=jaxpr, **params)
  params["jaxpr"] = lo_jaxpr
  names = p.arg_names
  if names is not None and len(names) == len(lo_lol):
    names = tuple(n for n, xs in zip(names, lo_lol) for _ in xs)
  p_lo = p._replace(params=params, in_avals=tuple(core.typeof(x) for x in lo_args),
                    out_tree=_tree_util.tree_structure(list(range(len(lo_jaxpr.out_avals)))),
                    arg_names=names)
  return p_lo, lo_args, out_avals


def _wrap_run_python_pjit(jax_rule, active: Callable[[], bool]):
  def _run_python_pjit(p, args_flat, fun, args, kwargs):
    jaxpr = p.params["jaxpr"]
    if (p.consts or not jaxpr.jaxpr.is_high or not active() or not core.trace_state_clean()
        or _config.debug_key_reuse.value or not _plain_hi(jaxpr)):
      return jax_rule(p, args_flat, fun, args, kwargs)
    for arg in args_flat:
      _dispatch.check_arg(arg)  # JAX's first check, on the values the user passed
    p_lo, lo_args, out_avals = _lowered(p, args_flat)
    (_, lo_out_flat, _, lo_args, lo_jaxpr, compiled, profiler,
     const_args) = jax_rule(p_lo, lo_args, fun, args, kwargs)
    _, lo_outs = out_avals.update(lo_out_flat).unpack()
    out_flat = [a.raise_val2(y) for a, y in zip(jaxpr.out_avals, lo_outs.unpack())]
    # the results as the user's tree of hi values; ``_get_fastpath_data`` re-flattens
    # them by the dispatch registry (to the lo arrays the executable returns)
    outs = _tree_util.tree_unflatten(p.out_tree, out_flat)
    return outs, out_flat, p.out_tree, lo_args, lo_jaxpr, compiled, profiler, const_args
  _run_python_pjit._hx_wraps = jax_rule
  return _run_python_pjit


class _Opaque:
  """A hi value the C++ path is not to flatten (hxmlir not installed in this thread): a
  leaf it refuses, so that the call goes to ``cache_miss`` with the value itself."""

  __slots__ = ("value",)

  def __init__(self, value):
    self.value = value


_registered: set[type] = set()
_lock = threading.Lock()


def _register_dispatch_node(cls: type, components: Callable, build: Callable,
                            active: Callable[[], bool]) -> None:
  """A ``dispatch_registry`` node for value class ``cls``: while ``active()``, its children
  are ``components(v)`` (a tuple, aux data ``None``; ``build(aux, children)`` rebuilds
  it); otherwise one ``_Opaque`` leaf."""

  def flatten(v):
    if active():
      return components(v)
    return (_Opaque(v),), _Opaque

  def unflatten(aux, children):
    if aux is _Opaque:
      return children[0].value
    return build(aux, children)

  _tree_util.dispatch_registry.register_node(cls, flatten, unflatten)


_wrapper = None  # hxmlir's wrapper of ``pjit._run_python_pjit`` while it is installed


def install_fastpath(nodes: dict[type, tuple[Callable, Callable]],
                     active: Callable[[], bool]) -> None:
  """Puts ``jax.jit`` calls of hi code on JAX's C++ dispatch path where ``active()``.

  ``nodes``: for each hi value class, ``(flatten, build)``: ``flatten(v) -> (children,
  aux)`` with the children in the order of its type's ``lower_val`` (hi elements stay
  hi: they are flattened in turn), ``build(aux, children) -> v``. Wraps
  ``pjit._run_python_pjit`` (once; undone by :func:`uninstall_fastpath`) and registers the
  classes not yet registered in ``tree_util.dispatch_registry`` (for the process's life;
  inert where ``active()`` is false).
  """
  global _wrapper
  with _lock:
    for cls, (flatten, build) in nodes.items():
      if cls not in _registered:
        _register_dispatch_node(cls, flatten, build, active)
        _registered.add(cls)
    if _wrapper is None:
      _wrapper = _wrap_run_python_pjit(_pjit._run_python_pjit, active)
      _pjit._run_python_pjit = _wrapper


def uninstall_fastpath() -> None:
  """Puts back the ``pjit._run_python_pjit`` hxmlir wrapped (JAX's). When someone wrapped
  it after hxmlir, their wrapper stays, with hxmlir's in its chain: it passes every call
  through where hxmlir is not installed."""
  global _wrapper
  with _lock:
    if _wrapper is not None and _pjit._run_python_pjit in (_wrapper, _wrapper._hx_wraps):
      _pjit._run_python_pjit = _wrapper._hx_wraps  # (JAX's already in a jax_python_dispatch)
      _wrapper = None


@contextlib.contextmanager
def jax_python_dispatch():
  """Within the block, ``jax.jit`` runs hi code as JAX 0.10.2 does (its own
  ``_run_python_pjit``: the Python path on every call), process-wide; hxmlir's wrapper is
  back on exit. For comparisons in tests and benchmarks."""
  with _lock:
    wrapper = _wrapper
    if wrapper is not None and _pjit._run_python_pjit is wrapper:
      _pjit._run_python_pjit = wrapper._hx_wraps
  try:
    yield
  finally:
    with _lock:
      if wrapper is not None and _wrapper is wrapper:
        _pjit._run_python_pjit = wrapper


def current_run_python_pjit():
  """The ``pjit._run_python_pjit`` JAX's ``cache_miss`` calls now."""
  return _pjit._run_python_pjit


jax_run_python_pjit = _pjit._run_python_pjit
"""JAX's own ``pjit._run_python_pjit``, as imported."""


# the wrapper runs inside JAX's dispatch of every nested jit: its frame is JAX's, kept out
# of IR locations and filtered tracebacks as JAX's own files are
_exclude_from_tracebacks(__file__)
