"""``hx.attention``: grouped-query attention over a KV cache with a causal position bound --
the native CPU kernel ``hx_attention_cpu_v1`` (``csrc/attention.h``) on every ISA this CPU
runs, and the composite's reference decomposition, against float64.

Numbers. The float64 reference takes the same f32 operands: ``s_c = scale (q . k_c)`` over
the positions ``c < n = clamp(start + t + 1, 0, C)`` (all ``C`` with equal weights when
``n = 0``), ``w_c = softmax(s)_c``, ``out = sum_c w_c v_c``. An f32 evaluation in any order:

- each score is a dot of ``d`` terms and the scale: ``|ds_c| <= a_c = gamma_{d+1} scale
  sum|q k_c|`` (``tests/py/numerics.py``);
- ``p_c = exp(fl(s_c - m))``: the max ``m`` is one score, its error common to every term
  of the row, which cancels in ``p_c / sum p``; what remains is ``a_c``, the subtraction's
  rounding ``eps |s_c - m|`` and exp's error ``ulps * eps`` (the kernel's: at most 1.01 ulp,
  measured over every f32 argument, ``csrc/attention.inc``; XLA's: taken as 4 ulp), so
  each ``p_c`` is within a relative ``e = max_c (a_c + eps |s_c - m|) + ulps eps`` (over the
  row: the max of those) and each weight ``w_c`` within ``2 e + gamma_{n+2}`` (the sum of
  the ``p`` and the division);
- the weighted sum of ``n`` terms adds ``gamma_{n+1}``.

So ``|out - exact| <= (2 e + 2 gamma_{n+2} + 2 eps) sum_c w_c |v_c| + n tiny max|v|`` (the
last term: exp's floor at exp(-87) and underflow). A wrong position (one more or one
less), a wrong head or query, or a missing normalisation is an error of the order of a
term and fails it (:func:`test_bound_catches_an_off_by_one_position`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numerics import EPS, TINY, assert_within, gamma
from test_matmul_q_formats_native import _with_isa  # (select_isa picks this kernel's copy too)

import hxmlir as hx
from hxmlir.lowering import reference
from hxmlir.lowering.attention import cpu as attention_cpu

INFO = hx.cpu_kernel_info()
needs_native = pytest.mark.skipif(not attention_cpu.ACTIVE,
                                  reason=f"native kernel inactive: {attention_cpu.REASON}")
SCALE = float(np.float32(0.125))
KERNEL_EXP_ULPS = 2  # csrc/attention.inc: measured at most 1.01 ulp
XLA_EXP_ULPS = 4


def _operands(rng, t, kv, g, d, c):
  q = rng.standard_normal((t, kv, g, d)).astype(np.float32)
  k = rng.standard_normal((kv, c, d)).astype(np.float32)
  v = rng.standard_normal((kv, d, c)).astype(np.float32)
  return q, k, v


def attention64(q, k, v, start: int, scale: float, exp_ulps: int):
  """(float64 attention, its f32 error bound) from the same f32 operands (module docstring)."""
  q64, k64, v64 = (np.asarray(a, np.float64) for a in (q, k, v))
  t_len, kv, g, d = q.shape
  c_len = k.shape[1]
  out = np.zeros(q.shape)
  bound = np.zeros(q.shape)
  for t in range(t_len):
    n = int(np.clip(start + t + 1, 0, c_len))
    for h in range(kv):
      kh, vh = k64[h, :max(n, 1) if n else c_len], v64[h, :, :n if n else c_len]
      for j in range(g):
        if n == 0:  # no position: every score equal (the reference's row masked everywhere)
          s, a = np.zeros(c_len), np.zeros(c_len)
        else:
          s = scale * (kh @ q64[t, h, j])
          a = gamma(d + 1) * scale * (np.abs(kh) @ np.abs(q64[t, h, j])) + d * TINY
        m = s.max()
        w = np.exp(s - m)
        w /= w.sum()
        out[t, h, j] = vh @ w
        nn = len(s)
        e = np.max(a + EPS * np.abs(s - m)) + exp_ulps * EPS
        bound[t, h, j] = ((2 * e + 2 * gamma(nn + 2) + 2 * EPS) * (np.abs(vh) @ w)
                          + nn * TINY * np.abs(vh).max())
  return out, bound


KERNEL = jax.jit(lambda q, k, v, s: attention_cpu.attention_native(q, k, v, s, scale=SCALE))
DECOMPOSITION = jax.jit(lambda q, k, v, s: hx.attention(q, k, v, s, scale=SCALE))  # not installed

CASES = [(t, c, start, g, d) for t in (1, 5) for c in (8, 64, 512)
         for start in (0, (c - t) // 2, c - t) for g in (1, 3) for d in (64, 24)]


def _id(case):
  t, c, start, g, d = case
  return f"T{t}-C{c}-start{start}-g{g}-d{d}"


@needs_native
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_kernel_matches_float64_on_every_isa_and_never_reads_past_the_bound(case):
  t, c, start, g, d = case
  rng = np.random.default_rng(hash(case) % 2**32)
  q, k, v = _operands(rng, t, 3, g, d, c)
  want, bound = attention64(q, k, v, start, SCALE, KERNEL_EXP_ULPS)
  # positions no query reads (c > start + T - 1) hold NaN: the kernel never reads them
  k_nan, v_nan = k.copy(), v.copy()
  k_nan[:, start + t:, :] = np.nan
  v_nan[:, :, start + t:] = np.nan
  got = {}
  for isa in INFO.supported_isas:
    got[isa] = _with_isa(isa, KERNEL, q, k_nan, v_nan, np.int32(start))
    assert_within(got[isa], want, bound, f"{isa}: ")
    # and the values it reads are the same with the unread positions finite
    np.testing.assert_array_equal(got[isa], _with_isa(isa, KERNEL, q, k, v, np.int32(start)))
  if "avx512" in got and "avx2" in got:  # one order of operations, FMA in both: same bits
    np.testing.assert_array_equal(got["avx512"], got["avx2"])


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_reference_decomposition_matches_float64(case):
  # the composite without install: its decomposition is the reference (a mask over all C
  # positions, v read as 0 past the last query's bound). Unread positions hold NaN and
  # infinities, as the kernel's test has them: they never reach the result either way.
  t, c, start, g, d = case
  rng = np.random.default_rng(hash(case) % 2**32 + 1)
  q, k, v = _operands(rng, t, 3, g, d, c)
  want, bound = attention64(q, k, v, start, SCALE, XLA_EXP_ULPS)
  k[:, start + t:, :] = np.nan
  v[:, :, start + t:] = np.inf
  got = DECOMPOSITION(q, k, v, np.int32(start))
  assert_within(got, want, bound)


@needs_native
def test_bound_catches_an_off_by_one_position():
  # the bound is tight enough to see one position too many or too few
  rng = np.random.default_rng(7)
  q, k, v = _operands(rng, 5, 3, 3, 64, 64)
  got = np.asarray(KERNEL(q, k, v, np.int32(20)))
  for wrong in (19, 21):
    want, bound = attention64(q, k, v, wrong, SCALE, KERNEL_EXP_ULPS)
    with pytest.raises(AssertionError, match="error .* > bound"):
      assert_within(got, want, bound)


@needs_native
@pytest.mark.parametrize("start", [-3, 62, 200], ids=["before-0", "past-C", "far-past-C"])
def test_kernel_clamps_start_as_the_reference_masks(start):
  # start + t < 0: no position, the mean of v over all C (every score equal, as the
  # reference's row masked everywhere); start + t >= C: all C positions, never beyond
  rng = np.random.default_rng(11)
  q, k, v = _operands(rng, 5, 3, 3, 24, 64)
  want, bound = attention64(q, k, v, start, SCALE, KERNEL_EXP_ULPS)
  for isa in INFO.supported_isas:
    assert_within(_with_isa(isa, KERNEL, q, k, v, np.int32(start)), want, bound, f"{isa}: ")
  want, bound = attention64(q, k, v, start, SCALE, XLA_EXP_ULPS)
  assert_within(DECOMPOSITION(q, k, v, np.int32(start)), want, bound)


@needs_native
def test_nan_in_a_read_position_makes_its_queries_nan():
  # a NaN the queries may read shows up in their outputs, never as finite garbage
  rng = np.random.default_rng(3)
  q, k, v = _operands(rng, 5, 3, 3, 64, 64)
  k[1, 12, 5] = np.nan  # position 12, head 1: read by queries at 10 + t >= 12, t >= 2
  got = np.asarray(KERNEL(q, k, v, np.int32(10)))
  assert np.isnan(got[2:, 1]).all() and np.isfinite(got[:2]).all()
  assert np.isfinite(got[:, [0, 2]]).all()


@needs_native
def test_prefill_runs_on_the_pool_with_the_serial_numbers():
  # T = 128 over C = 512: above the serial threshold, the (t, head) blocks go to XLA's
  # intra-op pool; each output is computed by one thread in the same order
  rng = np.random.default_rng(5)
  q, k, v = _operands(rng, 128, 3, 3, 64, 512)
  got = np.asarray(KERNEL(q, k, v, np.int32(100)))
  want, bound = attention64(q[:8], k, v, 100, SCALE, KERNEL_EXP_ULPS)
  assert_within(got[:8], want, bound)
  one = np.asarray(KERNEL(q[7:8], k, v, np.int32(107)))  # T = 1: the calling thread alone
  np.testing.assert_array_equal(got[7:8], one)


def test_installed_calls_the_kernel_and_exports_stay_portable():
  q, k, v = _operands(np.random.default_rng(0), 2, 3, 3, 64, 16)

  def f(q, k, v, s):
    return hx.attention(q, k, v, s, scale=SCALE)
  with hx.installed():
    text = jax.jit(f).lower(q, k, v, np.int32(3)).as_text()
    exported = jax.export.export(jax.jit(f))(q, k, v, np.int32(3)).mlir_module()
  assert text.count('stablehlo.composite "hx.attention"') == 1
  assert ("hx_attention_cpu_v1" in text) == attention_cpu.ACTIVE
  assert "hx_attention_cpu_v1" not in exported and '"hx.attention"' in exported


@pytest.mark.parametrize("operands,message", [
    (((1, 3, 3, 64), (3, 8, 32), (3, 32, 8), "int32"),
     "q: f32[1,3,3,64], k: f32[3,8,32], v: f32[3,32,8], start: i32[]"),
    (((1, 3, 3, 64), (3, 8, 64), (3, 8, 64), "int32"),
     "q: f32[1,3,3,64], k: f32[3,8,64], v: f32[3,8,64], start: i32[]"),
    (((1, 3, 64), (3, 8, 64), (3, 64, 8), "int32"),
     "q: f32[1,3,64], k: f32[3,8,64], v: f32[3,64,8], start: i32[]"),
    (((1, 3, 3, 64), (3, 8, 64), (3, 64, 8), "float32"),
     "q: f32[1,3,3,64], k: f32[3,8,64], v: f32[3,64,8], start: f32[]"),
])
def test_bad_operands_are_a_type_error_naming_them(operands, message):
  qs, ks, vs, sd = operands
  args = [np.zeros(s, np.float32) for s in (qs, ks, vs)] + [np.zeros((), sd)]
  with pytest.raises(TypeError) as e:
    jax.jit(lambda *a: hx.attention(*a, scale=0.125)).lower(*args)
  assert str(e.value) == ("hx.attention expects (q: f32[T, kv, g, d], k: f32[kv, C, d], v: "
                          "f32[kv, d, C], start: i32[]) -> f32[T, kv, g, d], got " + message)


def test_traced_scale_is_a_type_error():
  q, k, v = _operands(np.random.default_rng(0), 1, 3, 3, 8, 8)
  with pytest.raises(TypeError, match=r"hx\.attention: scale must be a static float \(a Python "
                     r"or NumPy number\), got .*Tracer"):
    jax.jit(lambda q, s: hx.attention(q, k, v, 0, scale=s))(q, np.float32(0.5))


@needs_native
def test_kernel_refuses_bad_operands_naming_their_types():
  out = jax.ShapeDtypeStruct((1, 3, 3, 64), jnp.float32)
  call = jax.ffi.ffi_call(attention_cpu.TARGET, out)
  q = np.zeros((1, 3, 3, 64), np.float32)
  k, v = np.zeros((3, 8, 64), np.float32), np.zeros((3, 64, 9), np.float32)
  with pytest.raises(Exception, match=r"hx_attention_cpu_v1 expects q: f32\[T, kv, g, d\], k: "
                     r"f32\[kv, C, d\], v: f32\[kv, d, C\], start: s32\[\] -> f32\[T, kv, g, d\], "
                     r"got f32\[1,3,3,64\], f32\[3,8,64\], f32\[3,64,9\], s32\[\] -> f32\[1,3,3,64\]"):
    jax.block_until_ready(jax.jit(lambda *a: call(*a, scale=np.float32(1)))(
        q, k, v, np.int32(0)))


def test_vmap_and_jvp_are_the_references():
  rng = np.random.default_rng(2)
  q, k, v = _operands(rng, 2, 3, 3, 24, 16)
  qs = np.stack([q, -q, 2 * q])
  starts = np.asarray([0, 5, 14], np.int32)
  f = jax.jit(jax.vmap(lambda q, s: hx.attention(q, k, v, s, scale=SCALE)))
  got = np.asarray(f(qs, starts))
  for i in range(3):
    want, bound = attention64(qs[i], k, v, int(starts[i]), SCALE, XLA_EXP_ULPS)
    assert_within(got[i], want, bound, f"vmap element {i}: ")
  tq, tk, tv = _operands(rng, 2, 3, 3, 24, 16)

  def ref(q, k, v):
    return reference.attention(q, k, v, np.int32(7), scale=SCALE)

  def hxa(q, k, v):
    return hx.attention(q, k, v, np.int32(7), scale=SCALE)
  with hx.installed():
    out, tangent = jax.jit(lambda *a: jax.jvp(hxa, a[:3], a[3:]))(q, k, v, tq, tk, tv)
    grads = jax.jit(jax.grad(lambda q, k, v: jnp.sum(hxa(q, k, v) * tq), argnums=(0, 1, 2)))(
        q, k, v)
  want_out, want_tangent = jax.jit(lambda *a: jax.jvp(ref, a[:3], a[3:]))(q, k, v, tq, tk, tv)
  want_grads = jax.jit(jax.grad(lambda q, k, v: jnp.sum(ref(q, k, v) * tq), argnums=(0, 1, 2)))(
      q, k, v)
  # the tangent and the gradients (of a loss linear in the output, so that they do not
  # depend on the primal's numbers) are the reference's own: the same computation
  np.testing.assert_array_equal(tangent, want_tangent)
  for g, w in zip(grads, want_grads):
    np.testing.assert_array_equal(g, w)
  want, bound = attention64(q, k, v, 7, SCALE, KERNEL_EXP_ULPS)
  assert_within(out, want, bound)


def attention64_windowed(q, k, v, start: int, scale: float, window: int, softcap: float,
                         exp_ulps: int):
  """(float64 ``hx.attention`` version 2, its f32 error bound): positions ``start + t -
  window < c <= start + t`` (``window > 0``), scores capped to ``softcap tanh(s / softcap)``
  (``softcap > 0``). The bound is :func:`attention64`'s with each score's error ``a_c``
  carried through the cap (whose slope is at most 1) plus the cap's own roundings (the
  division, tanh within 2 ulp, the product: ``4 eps |s'|``). Queries with a position only."""
  q64, k64, v64 = (np.asarray(a, np.float64) for a in (q, k, v))
  t_len, kv, g, d = q.shape
  out, bound = np.zeros(q.shape), np.zeros(q.shape)
  for t in range(t_len):
    n = int(np.clip(start + t + 1, 0, k.shape[1]))
    lo = max(0, start + t + 1 - window) if window else 0
    for h in range(kv):
      kh, vh = k64[h, lo:n], v64[h, :, lo:n]
      for j in range(g):
        s = scale * (kh @ q64[t, h, j])
        a = gamma(d + 1) * scale * (np.abs(kh) @ np.abs(q64[t, h, j])) + d * TINY
        if softcap:
          s = softcap * np.tanh(s / softcap)
          a = a + 4 * EPS * np.abs(s)
        m = s.max()
        w = np.exp(s - m)
        w /= w.sum()
        out[t, h, j] = vh @ w
        e = np.max(a + EPS * np.abs(s - m)) + exp_ulps * EPS
        bound[t, h, j] = ((2 * e + 2 * gamma(len(s) + 2) + 2 * EPS) * (np.abs(vh) @ w)
                          + len(s) * TINY * np.abs(vh).max())
  return out, bound


WINDOWED = [(t, start, window, cap) for t in (1, 5) for start in (0, 3, 40)
            for window in (0, 1, 8) for cap in (0.0, 0.5) if window or cap]


@needs_native
@pytest.mark.parametrize("case", WINDOWED, ids=lambda c: "T{}-start{}-window{}-cap{}".format(*c))
def test_windowed_and_capped_kernel_and_reference_match_float64(case):
  # hx.attention version 2 (hx_attention_cpu_v2 and the reference decomposition): the
  # kernel reads only the window's positions (NaN before and after it never reaches the
  # result); the cap of 0.5 binds (scores of q, k ~ N(0, 1) reach several units)
  t, start, window, cap = case
  rng = np.random.default_rng(sum(map(int, (t, start, window, cap * 10))))
  q, k, v = _operands(rng, t, 3, 2, 24, 64)
  kernel = jax.jit(lambda q, k, v, s: attention_cpu.attention_native(
      q, k, v, s, scale=SCALE, window=window, softcap=cap))
  decomposition = jax.jit(lambda q, k, v, s: hx.attention(q, k, v, s, scale=SCALE,
                                                          window=window, softcap=cap))
  want, bound = attention64_windowed(q, k, v, start, SCALE, window, cap, KERNEL_EXP_ULPS)
  k_nan, v_nan = k.copy(), v.copy()
  k_nan[:, start + t:, :] = np.nan
  v_nan[:, :, start + t:] = np.nan
  if window and start + 1 - window > 0:  # before every query's window
    k_nan[:, :start + 1 - window, :] = np.nan
    v_nan[:, :, :start + 1 - window] = np.nan
  for isa in INFO.supported_isas:
    got = _with_isa(isa, kernel, q, k_nan, v_nan, np.int32(start))
    assert_within(got, want, bound, f"{isa}: ")
  want, bound = attention64_windowed(q, k, v, start, SCALE, window, cap, XLA_EXP_ULPS)
  assert_within(decomposition(q, k, v, np.int32(start)), want, bound)


@needs_native
def test_window_bound_catches_one_position_too_many():
  rng = np.random.default_rng(9)
  q, k, v = _operands(rng, 5, 3, 2, 24, 64)
  got = np.asarray(attention_cpu.attention_native(q, k, v, np.int32(30), scale=SCALE, window=8))
  assert_within(got, *attention64_windowed(q, k, v, 30, SCALE, 8, 0.0, KERNEL_EXP_ULPS))
  for wrong in (7, 9):
    with pytest.raises(AssertionError, match="error .* > bound"):
      assert_within(got, *attention64_windowed(q, k, v, 30, SCALE, wrong, 0.0, KERNEL_EXP_ULPS))


def test_window_and_softcap_make_version_2_and_bad_values_are_type_errors():
  q, k, v = (np.zeros(s, np.float32) for s in ((1, 1, 1, 8), (1, 4, 8), (1, 8, 4)))
  text = lambda **kw: jax.jit(lambda q, k, v: hx.attention(q, k, v, 0, scale=1.0, **kw)).lower(
      q, k, v).as_text()
  assert ("composite_attributes = {scale = 1.000000e+00 : f32, softcap = 0.000000e+00 : f32, "
          "window = 2 : i64}, decomposition = @hx.attention.impl, version = 2 : i32") in text(
              window=2)
  assert ("composite_attributes = {scale = 1.000000e+00 : f32}, decomposition = "
          "@hx.attention.impl, version = 1 : i32") in text()  # as before either existed
  for kw, msg in [(dict(window=-1), "window must be a static int >= 0"),
                  (dict(softcap=float("nan")), "softcap must be a static finite number")]:
    with pytest.raises(TypeError, match=msg):
      hx.attention(q, k, v, 0, scale=1.0, **kw)


# hx.attention version 3: jax.vmap of it is one batched op; on CPU while installed one call of
# hx_attention_cpu_v3 for the whole batch, each element at its own start. (B, T, window, cap,
# shared: one cache for every element, k and v not mapped)
BATCHED = [(1, 1, 0, 0.0, False), (5, 1, 0, 0.0, False), (5, 4, 0, 0.0, False),
           (3, 1, 8, 0.5, False), (3, 4, 8, 0.0, False), (5, 4, 0, 0.5, True),
           (3, 1, 8, 0.0, True)]


def _batched_operands(b, t, shared, seed, c=64):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((b, t, 3, 2, 24)).astype(np.float32)
  nk = 1 if shared else b
  k = rng.standard_normal((nk, 3, c, 24)).astype(np.float32)
  v = rng.standard_normal((nk, 3, 24, c)).astype(np.float32)
  starts = np.asarray([(7 * i + 3 * i * i) % (c - t + 1) for i in range(b)], np.int32)
  starts[-1] = c - t  # the last element reads the whole cache
  return q, k, v, starts


def _vmapped(b_shared, window, cap):
  def one(q, k, v, s):
    return hx.attention(q, k, v, s, scale=SCALE, window=window, softcap=cap)
  if b_shared:
    return lambda q, k, v, s: jax.vmap(one, in_axes=(0, None, None, 0))(q, k[0], v[0], s)
  return jax.vmap(one)


@needs_native
@pytest.mark.parametrize("case", BATCHED, ids=lambda c: "B{}-T{}-window{}-cap{}-shared{}".format(
    *c))
def test_batched_kernel_matches_float64_on_every_isa_and_each_element_alone(case):
  b, t, window, cap, shared = case
  q, k, v, starts = _batched_operands(b, t, shared, sum(map(int, case)))
  f = jax.jit(_vmapped(shared, window, cap))
  # positions no query of an element reads hold NaN (its own cache; a shared cache: past
  # the largest bound), and so do those before a window: the kernel never reads them
  k_nan, v_nan = k.copy(), v.copy()
  for i in range(len(k)):
    end = int(starts.max() if shared else starts[i]) + t
    k_nan[i, :, end:] = np.nan
    v_nan[i, :, :, end:] = np.nan
    first = int(starts.min() if shared else starts[i]) + 1 - window
    if window and first > 0:
      k_nan[i, :, :first] = np.nan
      v_nan[i, :, :, :first] = np.nan
  with hx.installed():
    assert "hx_attention_cpu_v3" in f.lower(q, k, v, starts).as_text()
    got = {isa: _with_isa(isa, f, q, k_nan, v_nan, starts) for isa in INFO.supported_isas}
  alone = jax.jit(lambda q, k, v, s: attention_cpu.attention_native(
      q, k, v, s, scale=SCALE, window=window, softcap=cap))
  for i in range(b):
    kb, vb = (k[0], v[0]) if shared else (k[i], v[i])
    want, bound = attention64_windowed(q[i], kb, vb, int(starts[i]), SCALE, window, cap,
                                       KERNEL_EXP_ULPS)
    for isa, out in got.items():
      assert_within(out[i], want, bound, f"{isa}, element {i}: ")
    # each element is the unbatched kernel's call on it: the same blocks, the same order
    np.testing.assert_array_equal(got[INFO.isa][i], alone(q[i], kb, vb, starts[i]))
  if "avx512" in got and "avx2" in got:
    np.testing.assert_array_equal(got["avx512"], got["avx2"])
  # not installed: version 3's decomposition, the reference under vmap
  want_all = [attention64_windowed(q[i], *((k[0], v[0]) if shared else (k[i], v[i])),
                                   int(starts[i]), SCALE, window, cap, XLA_EXP_ULPS)
              for i in range(b)]
  ref = np.asarray(f(q, k, v, starts))
  for i, (want, bound) in enumerate(want_all):
    assert_within(ref[i], want, bound, f"reference, element {i}: ")


@needs_native
def test_batched_bound_catches_another_elements_start():
  q, k, v, starts = _batched_operands(3, 1, False, 5)
  with hx.installed():
    got = np.asarray(jax.jit(_vmapped(False, 0, 0.0))(q, k, v, starts))
  assert_within(got[1], *attention64_windowed(q[1], k[1], v[1], int(starts[1]), SCALE, 0, 0.0,
                                              KERNEL_EXP_ULPS))
  with pytest.raises(AssertionError, match="error .* > bound"):
    assert_within(got[1], *attention64_windowed(q[1], k[1], v[1], int(starts[0]), SCALE, 0,
                                                0.0, KERNEL_EXP_ULPS))


def _main_of(text: str) -> str:
  return text.split("func.func public @main", 1)[1].split("\n  }\n", 1)[0]


@needs_native
@pytest.mark.parametrize("axes", [(0, 0, 0, 0), (1, 0, 2, None), (0, None, None, 0),
                                  (None, 0, 0, 0)], ids=str)
def test_vmap_lowers_to_one_batched_kernel_call_not_a_loop_of_dots(axes):
  # any mapped axis, unmapped start (broadcast), an unmapped query (broadcast) or a cache
  # shared by every element (not copied: k and v keep their rank)
  q, k, v, starts = _batched_operands(4, 2, False, 11, c=32)
  args = [a[0] if ax is None else np.moveaxis(a, 0, ax) for a, ax in zip((q, k, v, starts), axes)]
  f = jax.jit(jax.vmap(lambda q, k, v, s: hx.attention(q, k, v, s, scale=SCALE), in_axes=axes))
  with hx.installed():
    text = f.lower(*args).as_text()
    got = np.asarray(f(*args))
  assert text.count('stablehlo.composite "hx.attention"') == 1
  assert "version = 3 : i32" in text and text.count("hx_attention_cpu_v3") == 1
  assert "dot_general" not in text and "stablehlo.while" not in text
  if axes[1] is None:  # the shared cache stays one f32[kv, C, d]: no broadcast copy of it
    assert "tensor<4x3x32x24xf32>" not in text
  for i in range(4):
    one = [a if ax is None else np.take(a, i, axis=ax) for a, ax in zip(args, axes)]
    want, bound = attention64(*one[:3], int(one[3]), SCALE, KERNEL_EXP_ULPS)
    assert_within(got[i], want, bound, f"element {i}: ")


@needs_native
def test_vmap_of_the_models_attention_on_f32_caches_calls_the_batched_kernel():
  from hxmlir.models import forward
  q, k, v, starts = _batched_operands(3, 1, False, 12)
  f = jax.jit(jax.vmap(lambda q, k, v, s: forward.attention(q, k, v, s, scale=SCALE,
                                                            window=8)))
  with hx.installed():
    text = f.lower(q, k, v, starts).as_text()
    got = np.asarray(f(q, k, v, starts))
  assert "hx_attention_cpu_v3" in text and "dot_general" not in text
  for i in range(3):
    want, bound = attention64_windowed(q[i], k[i], v[i], int(starts[i]), SCALE, 8, 0.0,
                                       KERNEL_EXP_ULPS)
    assert_within(got[i], want, bound, f"element {i}: ")


def test_batched_operands_are_a_type_error_naming_them():
  q = np.zeros((2, 1, 3, 2, 8), np.float32)
  k, v = np.zeros((2, 3, 16, 8), np.float32), np.zeros((3, 3, 8, 16), np.float32)
  with pytest.raises(TypeError) as e:
    jax.jit(lambda *a: hx.lowering.attention.hx_attention_p.bind(
        *a, scale=0.125, window=0, softcap=0.0)).lower(q, k, v, np.zeros((2,), np.int32))
  assert str(e.value) == (
      "hx.attention expects (q: f32[B, T, kv, g, d], k: f32[B, kv, C, d] or f32[kv, C, d], v: "
      "f32[B, kv, d, C] or f32[kv, d, C] (as k), start: i32[B]) -> f32[B, T, kv, g, d], got "
      "q: f32[2,1,3,2,8], k: f32[2,3,16,8], v: f32[3,3,8,16], start: i32[2]")


@needs_native
def test_batched_kernel_refuses_bad_operands_naming_their_types():
  out = jax.ShapeDtypeStruct((2, 1, 3, 2, 8), jnp.float32)
  call = jax.ffi.ffi_call(attention_cpu.TARGET_V3, out)
  q = np.zeros((2, 1, 3, 2, 8), np.float32)
  k, v = np.zeros((2, 3, 16, 8), np.float32), np.zeros((2, 3, 8, 16), np.float32)
  with pytest.raises(Exception, match=r"hx_attention_cpu_v3 expects q: f32\[B, T, kv, g, d\], "
                     r"k: f32\[B, kv, C, d\] \(or f32\[kv, C, d\]\), .* got f32\[2,1,3,2,8\], "
                     r"f32\[2,3,16,8\], f32\[2,3,8,16\], s32\[3\] -> f32\[2,1,3,2,8\]"):
    jax.block_until_ready(jax.jit(lambda *a: call(*a, scale=np.float32(1), window=np.int64(0),
                                                  softcap=np.float32(0)))(
        q, k, v, np.zeros((3,), np.int32)))


def test_gradients_under_vmap_and_nested_vmap_are_the_references():
  # the batched op's JVP is the batched reference's (the primal stays one batched op); a
  # vmap of an already batched op is the reference under vmap
  q, k, v, starts = _batched_operands(3, 2, False, 13, c=16)
  hxa = lambda q, k, v, s: hx.attention(q, k, v, s, scale=SCALE, window=4)  # noqa: E731
  ref = lambda q, k, v, s: reference.attention(q, k, v, s, scale=SCALE, window=4)  # noqa: E731

  w = np.random.default_rng(14).standard_normal(q.shape).astype(np.float32)

  def grads(att):  # of a loss linear in the output: independent of the primal's numbers
    return jax.jit(jax.grad(lambda q, k, v: jnp.sum(jax.vmap(att)(q, k, v, starts) * w),
                            argnums=(0, 1, 2)))(q, k, v)
  with hx.installed():
    got = grads(hxa)
    nested = np.asarray(jax.jit(jax.vmap(jax.vmap(hxa)))(q[None], k[None], v[None],
                                                         starts[None]))
  for g, w in zip(got, grads(ref)):
    np.testing.assert_array_equal(g, w)
  np.testing.assert_array_equal(nested[0], jax.jit(jax.vmap(ref))(q, k, v, starts))
