"""hx-fold-scales preserves semantics: compile before and after, compare on random inputs.

The family: a dequantized operand ``D = q * s`` (``q: i8[..., n]`` quantized along
its last axis, ``s: f32[...]``), as the ``hx.dequantize`` composite or open-coded
the way JAX emits it (either multiply operand order), feeding ``dot_general`` on
either side, with random batch / contracting / free axis counts, random axis
placements in both operands, and random sizes (including 1). The expected rewrite
is derived independently here from the axis roles: the scale varies along the
non-last axes of ``D``; contracting only -> into the other operand (or
``hx.matmul_q`` in its exact form), free only -> into the result, batch only ->
the smaller side, contracting and free -> left alone.

Tolerance: each output element is ``sum_k x_k q_k s_k`` in f32. The rewrite
reassociates each product (``(x s) q`` vs ``x (q s)``: at most 2 roundings of
relative size 2^-24 each) and XLA may order the sum differently, so the error is
bounded by about ``(K + 2) * 2^-24 * sum_k |x_k q_k s_k|`` with ``K <= 30`` terms
here, i.e. below ``2e-6`` of the sum of magnitudes; the test allows ``1e-5`` of it
(plus ``1e-6`` absolute), computed per element in float64.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hx_testing import compile_and_run
from numerics import assert_within, dot_bound

from hxmlir.passes import ops, parse_pipeline, parsing
from hxmlir.passes import shardings as pass_shardings

RTOL = 1e-5


def _t(shape, dtype="f32"):
  return f"tensor<{'x'.join(map(str, shape))}{'x' if shape else ''}{dtype}>"


class Case:
  """One generated dot: D's axes and X's axes with roles, sizes, side and form."""

  def __init__(self, rng: np.random.Generator, idx: int):
    nb = int(rng.integers(0, 2))
    nc = int(rng.integers(0, 3))
    nfd = int(rng.integers(0, 3))
    nfx = int(rng.integers(0, 2))
    if nb + nc + nfd == 0:
      nfd = 1
    sizes = [1, 2, 3, 5]
    self.b = [int(rng.choice(sizes)) for _ in range(nb)]
    self.c = [int(rng.choice(sizes)) for _ in range(nc)]
    fd = [int(rng.choice(sizes)) for _ in range(nfd)]
    fx = [int(rng.choice(sizes)) for _ in range(nfx)]
    # axis roles, in a random order for each operand
    d_roles = [("b", i) for i in range(nb)] + [("c", i) for i in range(nc)] + \
              [("f", i) for i in range(nfd)]
    x_roles = [("b", i) for i in range(nb)] + [("c", i) for i in range(nc)] + \
              [("f", i) for i in range(nfx)]
    self.d_roles = [d_roles[i] for i in rng.permutation(len(d_roles))]
    self.x_roles = [x_roles[i] for i in rng.permutation(len(x_roles))]
    self.fd, self.fx = fd, fx
    self.side = int(rng.integers(0, 2))  # 0: D is the lhs
    self.form = ["composite", "open", "open_swapped"][idx % 3]
    rank = len(self.d_roles)
    # D reaches the dot through a transpose (dot operand axis k = D axis perm[k])
    self.perm = rng.permutation(rank).tolist() if idx % 4 == 3 and rank >= 2 else None
    self.name = f"case{idx}"

  @classmethod
  def fixed(cls, name, b, c, fd, fx, d_roles, x_roles, side, form):
    self = cls.__new__(cls)
    self.b, self.c, self.fd, self.fx = b, c, fd, fx
    self.d_roles, self.x_roles, self.side, self.form, self.name = \
        d_roles, x_roles, side, form, name
    self.perm = None
    return self

  def size(self, role, which):
    kind, i = role
    return {"b": self.b, "c": self.c, "f": self.fd if which == "d" else self.fx}[kind][i]

  @property
  def d_shape(self):
    return [self.size(r, "d") for r in self.d_roles]

  @property
  def q_shape(self):
    """Shape of the quantized values (before the transpose, if any)."""
    if self.perm is None:
      return self.d_shape
    return [self.d_shape[self.perm.index(a)] for a in range(len(self.perm))]

  def scaled_axes(self):
    """Axes of the dot operand along which the scale varies (q's non-last axes)."""
    r = len(self.d_roles)
    src = self.perm or list(range(r))
    return [k for k in range(r) if src[k] != r - 1 and self.d_shape[k] != 1]

  @property
  def x_shape(self):
    return [self.size(r, "x") for r in self.x_roles]

  def dims(self, roles, kind):
    return [roles.index((kind, i)) for i in range(len(self.b if kind == "b" else self.c))]

  def result_shape(self):
    lhs, rhs = (self.d_roles, self.x_roles) if self.side == 0 else (self.x_roles, self.d_roles)
    lw, rw = ("d", "x") if self.side == 0 else ("x", "d")
    shape = list(self.b)
    shape += [self.size(r, lw) for r in lhs if r[0] == "f"]
    shape += [self.size(r, rw) for r in rhs if r[0] == "f"]
    return shape

  def expected(self) -> str:
    """The rewrite this case must get, from the axis roles alone."""
    scaled = {self.d_roles[a][0] for a in self.scaled_axes()}
    if "c" in scaled and "f" in scaled:
      return "none"
    if "c" in scaled:
      return "matmul_q formed" if self.matmul_q_form() else "into operand"
    if "f" in scaled:
      return "into result"
    if np.prod(self.x_shape) <= np.prod(self.result_shape()):
      return "matmul_q formed" if self.matmul_q_form() else "into operand"
    return "into result"

  def matmul_q_form(self) -> bool:
    r = len(self.d_roles)
    nb = len(self.b)
    if (self.side == 1 and self.perm is None and self.d_roles == [("c", 0), ("f", 0)]
        and self.x_roles[-1] == ("c", 0) and all(a[0] == "f" for a in self.x_roles[:-1])):
      return True  # f32[..., k] x q[k, n]: several free dims on the dense side
    return (self.side == 1 and self.perm is None and len(self.x_roles) == r and r >= 2 and len(self.c) == 1
            and self.d_roles[:nb] == [("b", i) for i in range(nb)]
            and self.x_roles[:nb] == [("b", i) for i in range(nb)]
            and self.d_roles[r - 2] == ("c", 0) and self.x_roles[r - 1] == ("c", 0))

  def mlir(self) -> str:
    ds, xs, rs = self.q_shape, self.x_shape, self.result_shape()
    r = len(ds)
    ss = ds[:-1]
    lines = [f"func.func @main(%q: {_t(ds, 'i8')}, %s: {_t(ss)}, %x: {_t(xs)}) -> {_t(rs)} {{"]
    if self.form == "composite":
      lines.append(f'  %d = stablehlo.composite "hx.dequantize" %q, %s {{decomposition = @deq, '
                   f'version = 1 : i32}} : ({_t(ds, "i8")}, {_t(ss)}) -> {_t(ds)}')
    else:
      one = [*ss, 1]
      lines += [
          f"  %qf = stablehlo.convert %q : ({_t(ds, 'i8')}) -> {_t(ds)}",
          f"  %s1 = stablehlo.broadcast_in_dim %s, dims = {list(range(r - 1))} : "
          f"({_t(ss)}) -> {_t(one)}",
          f"  %s2 = stablehlo.broadcast_in_dim %s1, dims = {list(range(r))} : "
          f"({_t(one)}) -> {_t(ds)}",
          "  %d = stablehlo.multiply " + ("%qf, %s2" if self.form == "open" else "%s2, %qf")
          + f" : {_t(ds)}"]
    if self.perm is not None:
      lines[-1] = lines[-1].replace("%d = ", "%d0 = ")
      lines.append(f"  %d = stablehlo.transpose %d0, dims = {self.perm} : ({_t(ds)}) -> "
                   f"{_t(self.d_shape)}")
    qs, ds = ds, self.d_shape
    lhs, rhs = ("%d", "%x") if self.side == 0 else ("%x", "%d")
    lr, rr = (self.d_roles, self.x_roles) if self.side == 0 else (self.x_roles, self.d_roles)
    lt, rt = (_t(ds), _t(xs)) if self.side == 0 else (_t(xs), _t(ds))
    batch = ""
    if self.b:
      batch = f"batching_dims = {self.dims(lr, 'b')} x {self.dims(rr, 'b')}, "
    lines.append(f"  %r = stablehlo.dot_general {lhs}, {rhs}, {batch}contracting_dims = "
                 f"{self.dims(lr, 'c')} x {self.dims(rr, 'c')} : ({lt}, {rt}) -> {_t(rs)}")
    lines += [f"  return %r : {_t(rs)}", "}"]
    if self.form == "composite":
      lines += [
          f"func.func private @deq(%q: {_t(qs, 'i8')}, %s: {_t(ss)}) -> {_t(qs)} {{",
          f"  %0 = stablehlo.convert %q : ({_t(qs, 'i8')}) -> {_t(qs)}",
          f"  %1 = stablehlo.broadcast_in_dim %s, dims = {list(range(r - 1))} : "
          f"({_t(ss)}) -> {_t(qs)}",
          f"  %2 = stablehlo.multiply %0, %1 : {_t(qs)}",
          f"  return %2 : {_t(qs)}", "}"]
    return "\n".join(lines) + "\n"

  def inputs(self, rng):
    q = rng.integers(-127, 128, self.q_shape).astype(np.int8)
    s = rng.uniform(0.25, 2.0, self.q_shape[:-1]).astype(np.float32)
    x = rng.standard_normal(self.x_shape).astype(np.float32)
    return [q, s, x]

  def magnitude(self, q, s, x):
    """Per output element, ``sum |x q s|`` in float64 (the error scale)."""
    d = np.abs(q.astype(np.float64) * s[..., None].astype(np.float64))
    if self.perm is not None:
      d = np.transpose(d, self.perm)
    letters = iter("abcdefghijklmnop")
    names = {}
    for role in itertools.chain(self.d_roles, self.x_roles):
      key = role if role[0] != "f" else None
      if key is not None and key not in names:
        names[key] = next(letters)
    d_sub = "".join(names.get(r) or f"{next(letters)}" for r in self.d_roles)
    x_sub = "".join(names.get(r) if r[0] != "f" else next(letters) for r in self.x_roles)
    fd = "".join(ch for ch, r in zip(d_sub, self.d_roles) if r[0] == "f")
    fx = "".join(ch for ch, r in zip(x_sub, self.x_roles) if r[0] == "f")
    out = "".join(names[("b", i)] for i in range(len(self.b)))
    out += fd + fx if self.side == 0 else fx + fd
    return np.einsum(f"{d_sub},{x_sub}->{out}", d, np.abs(x.astype(np.float64)))


def _cases():
  rng = np.random.default_rng(20261129)
  gen = [Case(rng, i) for i in range(45)]
  # The exact hx.matmul_q forms, so every run covers them (composite and open-coded).
  for form in ("composite", "open", "open_swapped"):
    gen.append(Case.fixed(f"matmul_q_{form}", [3], [4], [5], [2], [("b", 0), ("c", 0), ("f", 0)],
                          [("b", 0), ("f", 0), ("c", 0)], 1, form))
    gen.append(Case.fixed(f"matmul_2d_{form}", [], [6], [5], [4], [("c", 0), ("f", 0)],
                          [("f", 0), ("c", 0)], 1, form))
  return gen


CASES = _cases()


def test_family_covers_every_rewrite():
  kinds = {c.expected() for c in CASES}
  assert kinds == {"none", "into operand", "into result", "matmul_q formed"}
  assert {c.side for c in CASES} == {0, 1}
  assert {c.form for c in CASES} == {"composite", "open", "open_swapped"}
  assert {c.expected() for c in CASES if c.perm is not None} >= {"into operand", "into result"}
  assert any(c.b for c in CASES) and any(len(c.c) == 2 for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_fold_preserves_semantics(case):
  text = case.mlir()
  module = parsing.parse_module(text, parsing.make_context(), case.name)
  result = parse_pipeline("hx-fold-scales,hx-verify").run(module)
  stats = result.stats["hx-fold-scales"]
  want = case.expected()
  if want == "none":
    assert not result.changed, text
    return
  assert stats["scales folded"] == 1 and stats[want] == 1, (want, stats, text)
  folded = module.get_asm()
  dots = [op for op in ops.walk(module) if op.name == "stablehlo.dot_general"]
  for dot in dots:  # no dot consumes a dequantized value any more
    for v in dot.operands:
      op = v.owner.operation if hasattr(v.owner, "operation") else None
      assert op is None or op.name != "stablehlo.composite", folded
  rng = np.random.default_rng(len(text))
  args = case.inputs(rng)
  (before,) = compile_and_run(text, args)
  (after,) = compile_and_run(folded, args)
  assert before.shape == after.shape == tuple(case.result_shape())
  bound = RTOL * case.magnitude(*args) + 1e-6
  err = np.abs(after.astype(np.float64) - before.astype(np.float64))
  assert (err <= bound).all(), f"max error {err.max()} vs bound {bound.min()}\n{folded}"


def test_fold_on_modules_lowered_by_jax():
  import jax
  import jax.numpy as jnp

  import hxmlir as hx

  def f(x, w, v):
    qw, qv = hx.quantize(w), hx.quantize(v)
    return x @ hx.dequantize(qw), x @ hx.dequantize(qv).T, x @ (w.astype(jnp.int8) * 0.5)

  rng = np.random.default_rng(7)
  args = [rng.standard_normal(s).astype(np.float32) for s in ((3, 6), (6, 5), (4, 6))]
  text = jax.jit(f).lower(*args).as_text()
  module = parsing.parse_module(text, parsing.make_context(), "jax")
  result = parse_pipeline("hx-verify,hx-fold-scales,hx-verify").run(module)
  stats = result.stats["hx-fold-scales"]
  # matmul_q; a scale along the transposed weight's columns; a scalar scale (result is
  # smaller than x here)
  assert (stats["matmul_q formed"], stats["into result"], stats["scales folded"]) == (1, 2, 3)
  folded = module.get_asm()
  before = compile_and_run(text, args)
  after = compile_and_run(folded, args)
  x, w, v = args  # two evaluations of each product, scales applied before or after the sum
  wd, vd = (np.asarray(hx.dequantize(hx.quantize(a))) for a in (w, v))
  w8 = w.astype(np.int8).astype(np.float32) * np.float32(0.5)
  bounds = [dot_bound("mk,kn->mn", x, wd, extra=1), dot_bound("mk,nk->mn", x, vd, extra=1),
            dot_bound("mk,kn->mn", x, w8, extra=1)]
  for b, a, bound in zip(before, after, bounds):
    assert_within(a, b, 2 * bound)


# (weight shape, dtype, group size, the scale's sharding): int8 per row; int4 with groups
# of 8 along the columns, 32 columns over j = 4 (one group per shard: the group axis is
# sharded like the columns)
@pytest.mark.parametrize("shape,fmt,group,s_sharding", [
    ((6, 8), "int8", None, ((),)), ((64, 32), "int4", 8, ((), ("j",)))])
def test_fold_keeps_jax_shardings(mesh_2x4, shape, fmt, group, s_sharding):
  import jax
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P

  import hxmlir as hx

  with jax.set_mesh(mesh_2x4):
    x = jax.device_put(jnp.ones((4, shape[0]), jnp.float32), P("i", None))
    qw = hx.quantize(jax.device_put(jnp.ones(shape, jnp.float32), P(None, "j")), fmt,
                     group_size=group)
    module = jax.jit(lambda x, qw: x @ hx.dequantize(qw)).lower(x, qw).compiler_ir("stablehlo")
  result = parse_pipeline("hx-fold-scales,hx-verify").run(module)
  assert result.stats["hx-fold-scales"]["matmul_q formed"] == 1
  (op,) = ops.hx_composites(module.operation)
  assert ops.composite_name(op) == "hx.matmul_q"
  assert str(op.attributes["sdy.sharding"]) == \
      '#sdy.sharding_per_value<[<@mesh, [{"i"}, {"j"}]>]>'
  assert [pass_shardings.value_sharding(v) for v in op.operands] == [
      (("i",), ()), ((), ("j",)), s_sharding]


RANGE_CASE = """
func.func @main(%x: tensor<1x2xf32>, %q: tensor<2x1xi8>, %s: tensor<2xf32>) -> tensor<1x1xf32> {
  %0 = stablehlo.convert %q : (tensor<2x1xi8>) -> tensor<2x1xf32>
  %1 = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<2xf32>) -> tensor<2x1xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<2x1xf32>
  %3 = stablehlo.dot_general %x, %2, contracting_dims = [1] x [0] : (tensor<1x2xf32>, tensor<2x1xf32>) -> tensor<1x1xf32>
  return %3 : tensor<1x1xf32>
}
"""


def test_fold_reassociation_keeps_values_but_not_range_as_documented():
  # the scale moves onto x: (q s) x -> q (x s). In range, rounding only; where x s
  # overflows (x = 1e10, s = 1e30 on a zero weight) the rewrite gives NaN where the
  # original gives 1.0, as the pass docstring states.
  module = parsing.parse_module(RANGE_CASE, parsing.make_context(), "range")
  assert parse_pipeline("hx-fold-scales{form-matmul-q=false}").run(module).changed
  folded = module.get_asm()
  q = np.array([[0], [1]], np.int8)
  x = np.array([[1e10, 1.0]], np.float32)
  s = np.array([1e30, 1.0], np.float32)
  (before,) = compile_and_run(RANGE_CASE, [x, q, s])
  (after,) = compile_and_run(folded, [x, q, s])
  assert before[0, 0] == 1.0 and np.isnan(after[0, 0])
  x = np.array([[3.0, -2.0]], np.float32)
  (before,) = compile_and_run(RANGE_CASE, [x, q, s])
  (after,) = compile_and_run(folded, [x, q, s])
  np.testing.assert_array_equal(after, before)  # one term: no reordering, one rounding each


# --- every quantization format (hxmlir/formats.py), on modules lowered by JAX ---------------

# (dtype, group_size): every format but int8 per row, which the family above covers
FORMATS = [("int8", 16), ("int4", None), ("int4", 16), ("float8_e4m3fn", None),
           ("float8_e4m3fn", 32)]
# name: (function of x: f32[3, 64] and the weight, the weight's dense shape, the einsum it
# computes with x and the dequantized weight)
LAYOUTS = {
    "in_out": (lambda x, q: x @ _hx().dequantize(q), (64, 32), "mk,kn->mn"),
    "out_in": (lambda x, q: x @ _hx().dequantize(q).T, (32, 64), "mk,nk->mn"),
    "out_in_lhs": (lambda x, q: _hx().dequantize(q) @ x.T, (32, 64), "nk,mk->nm"),
}


def _hx():
  import hxmlir as hx
  return hx


def _format_case(fmt, group, layout):
  """The lowered module text of one layout (not installed: the dot reads the
  ``hx.dequantize`` composite), its arguments and the f64 dequantized weight."""
  import jax
  import jax.numpy as jnp

  hx = _hx()
  f, shape, _ = LAYOUTS[layout]
  rng = np.random.default_rng(15)
  x = rng.standard_normal((3, 64)).astype(np.float32)
  q = hx.quantize(jnp.asarray(rng.standard_normal(shape).astype(np.float32)), fmt,
                  group_size=group)
  text = jax.jit(f).lower(x, q).as_text()
  values, scale = (np.asarray(a) for a in hx.qarray_parts(q))
  wd = np.asarray(hx.dequantize(q)).astype(np.float64)
  return text, [x, values, scale], wd


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt,group", FORMATS, ids=lambda v: str(v))
def test_fold_every_format_forms_matmul_q(fmt, group, layout):
  # The dot becomes hx.matmul_q with the dequantize's format (and a transpose of its
  # result where the dot's layout differs), which hx-verify accepts, and computes the
  # same values. Both sum 64 products x * q * s, the scale applied to x, to the weight,
  # to a group's partial sum or to the result: at most 2 roundings per term beyond the
  # sum's own, so each is within dot_bound(extra=2) of the exact value.
  text, args, wd = _format_case(fmt, group, layout)
  module = parsing.parse_module(text, parsing.make_context(), layout)
  result = parse_pipeline("hx-verify,hx-fold-scales,hx-verify").run(module)
  assert result.stats["hx-fold-scales"]["matmul_q formed"] == 1
  (op,) = ops.hx_composites(module.operation)
  assert ops.composite_name(op) == "hx.matmul_q"
  attrs = str(op.attributes["composite_attributes"])
  assert f'dtype = "{fmt}"' in attrs and f"group_size = {group or 0} : i64" in attrs
  folded = module.get_asm()
  (before,) = compile_and_run(text, args)
  (after,) = compile_and_run(folded, args)
  _, _, subscripts = LAYOUTS[layout]
  operands = (args[0], wd) if subscripts.startswith("mk") else (wd, args[0])
  bound = 2 * dot_bound(subscripts, *operands, extra=2)
  assert_within(after, before, bound)


def test_fold_format_bound_catches_per_row_folding():
  # A fold that treated group scales as per-row ones (group 0's scale for the whole
  # row) would be wrong by far more than the bound above.
  text, (x, values, scale), wd = _format_case("int4", 16, "out_in")
  (before,) = compile_and_run(text, [x, values, scale])
  per_row = wd / np.repeat(scale, 16, axis=1) * scale[:, :1]
  wrong = x.astype(np.float64) @ per_row.T
  with pytest.raises(AssertionError, match="bound"):
    assert_within(wrong, before, 2 * dot_bound("mk,nk->mn", x, wd, extra=2))


def test_fold_format_refusals_are_left_alone():
  # form-matmul-q=false: other formats never fold open-coded (their scales vary along
  # the quantized axis, or the values need unpacking); the module is unchanged.
  text, _, _ = _format_case("int4", 16, "out_in")
  module = parsing.parse_module(text, parsing.make_context(), "nomq")
  assert not parse_pipeline("hx-fold-scales{form-matmul-q=false}").run(module).changed
