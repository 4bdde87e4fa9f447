"""hxmlir.export: hi signatures, calls, grad, serialization, bad artifacts; hxmlir.targets."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jaxlib.mlir import ir
from numerics import assert_within, matmul_grad_bounds, sum_bound

import hxmlir as hx
from hxmlir import _jax, targets
from hxmlir import export as hxe
from hxmlir.export import _artifact as hxe_artifact


@pytest.fixture(scope="module")
def data():
  x = jnp.arange(6.0, dtype="float32").reshape(2, 3) - 2.5
  w = jnp.arange(12.0, dtype="float32").reshape(3, 4) / 7 - 0.8
  return x, w, hx.quantize(w)


@pytest.fixture(scope="module")
def mm(data):
  x, _, qw = data
  return hxe.export(hx.matmul_q)(x, qw)


@pytest.fixture(scope="module")
def mm_blob(mm):
  return bytes(mm.serialize())


def _assert_same(a, b):
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# --- hi signatures and calls ---------------------------------------------------------

def test_plain_jax_export_loses_the_hi_signature(data):
  # The problem this module solves, pinned so a JAX upgrade that fixes it is noticed.
  x, w, qw = data
  exp = jax.export.export(jax.jit(hx.matmul_q))(x, qw)
  with pytest.raises(ValueError, match="same pytree structure"):
    exp.call(x, qw)
  assert isinstance(jax.export.export(jax.jit(hx.quantize))(w).call(w), list)


def test_plain_jax_export_calling_convention_is_the_readmes(data):
  # docs/limits.md: one list of lo components per argument (dense ones too),
  # a hi result as the list of its components
  x, w, qw = data
  exp = jax.export.export(jax.jit(hx.matmul_q))(x, qw)
  _assert_same(exp.call([x], [qw.qvalue, qw.scale]), hx.matmul_q(x, qw))
  for flat in ((x, qw.qvalue, qw.scale), (x, (qw.qvalue, qw.scale))):
    with pytest.raises(ValueError, match="same pytree structure"):
      exp.call(*flat)
  a = jnp.arange(3.0)
  tup = jax.export.export(jax.jit(lambda t: hx.get_tuple_element(t, 0) * 2))(hx.make_tup(a, qw))
  _assert_same(tup.call([a, qw.qvalue, qw.scale]), a * 2)
  r = hx.outer(jnp.ones(6), jnp.arange(5.0))
  r1 = jax.export.export(jax.jit(lambda r, y: hx.matmul_r1(y, r)))(r, jnp.ones((2, 6)))
  _assert_same(r1.call(list(hx.factors(r)), [jnp.ones((2, 6))]),
               hx.matmul_r1(jnp.ones((2, 6)), r))
  qv, s = jax.export.export(jax.jit(hx.quantize))(w).call(w)
  _assert_same(qv, qw.qvalue)
  _assert_same(s, qw.scale)


def test_matmul_q_signature_and_call(data, mm):
  x, _, qw = data
  assert [t.str_short() for t in mm.in_types] == ["float32[2,3]", "q8[3,4]"]
  assert mm.signature() == "(f32[2,3], q8[3,4]) -> (f32[2,4])"
  assert mm.platforms == ("cpu",)
  want = hx.matmul_q(x, qw)
  _assert_same(mm.call(x, qw), want)
  _assert_same(jax.jit(mm.call)(x, qw), want)
  _assert_same(jax.jit(lambda x, qw: mm.call(x, qw) * 2)(x, qw), want * 2)


def test_quantize_returns_a_qarray(data):
  _, w, qw = data
  exp = hxe.export(hx.quantize)(w)
  assert exp.signature() == "(f32[3,4]) -> (q8[3,4])"
  for out in (exp.call(w), jax.jit(exp.call)(w)):
    assert isinstance(out, hx.QArray)
    _assert_same(out.qvalue, qw.qvalue)
    _assert_same(out.scale, qw.scale)


def test_containers_tuples_and_rank1(data):
  x, w, qw = data

  def f(t, r, *, scale):
    a, q = hx.get_tuple_element(t, 0), hx.get_tuple_element(t, 1)
    return {"y": hx.matmul_q(a, q) * scale, "pair": [r, hx.make_tup(q, a)], "none": None}

  t = hx.make_tup(x, qw)
  r = hx.outer(jnp.arange(6.0), jnp.arange(5.0) - 1)
  exp = hxe.export(f)(t, r, scale=jnp.float32(3))
  assert exp.signature() == ("(Tup{f32[2,3],q8[3,4]}, r1[6,5], f32[]) -> "
                             "(r1[6,5], Tup{q8[3,4],f32[2,3]}, f32[2,4])")
  out = hxe.deserialize(exp.serialize()).call(t, r, scale=jnp.float32(3))
  assert set(out) == {"y", "pair", "none"} and out["none"] is None
  _assert_same(out["y"], hx.matmul_q(x, qw) * 3)
  r2, t2 = out["pair"]
  assert isinstance(r2, hx.Rank1) and isinstance(t2, hx.HiTup)
  _assert_same(r2.col, r.col)
  _assert_same(r2.row, r.row)
  _assert_same(t2.elts[0].qvalue, qw.qvalue)
  _assert_same(t2.elts[1], x)


def test_call_with_wrong_types_names_both(mm, data):
  x, w, qw = data
  with pytest.raises(TypeError, match=r"exported for \(f32\[2,3\], q8\[3,4\]\) -> "
                     r"\(f32\[2,4\]\); argument 1 has type f32\[3,4\], expected q8\[3,4\]"):
    mm.call(x, w)
  with pytest.raises(TypeError, match=r"argument 0 has type f32\[3,3\], expected f32\[2,3\]"):
    mm.call(jnp.ones((3, 3)), qw)
  with pytest.raises(TypeError, match="arguments structured as"):
    mm.call(x)


def test_vmap_of_a_call_names_the_signature_and_the_mapped_arguments(mm, data):
  # as jax.export's own call_exported, no batching rule; the message says what to do instead
  x, _, qw = data
  xs = jnp.stack([x, x])
  with pytest.raises(NotImplementedError,
                     match=r"jax\.vmap of matmul_q, an exported call, is not supported: it was "
                           r"exported for \(f32\[2,3\], q8\[3,4\]\) -> \(f32\[2,4\]\) and vmap "
                           r"maps argument 0 \(f32\[2,3\]\); export the vmapped function"):
    jax.vmap(mm.call, in_axes=(0, None))(xs, qw)
  with pytest.raises(NotImplementedError, match=r"maps argument 0 \(f32\[2,3\]\), argument 1 "
                                                r"\(q8\[3,4\]\)"):
    qs = jax.vmap(hx.quantize, out_axes=hx.QArraySpec())(jnp.stack([data[1], data[1]]))
    jax.vmap(mm.call, in_axes=(0, hx.QArraySpec()))(xs, qs)


def test_unsupported_containers_are_refused(data):
  x, _, _ = data
  with pytest.raises(TypeError, match="may hold tuples, lists, dicts and None"):
    hxe.export(lambda d: d)(jax.tree_util.Partial(lambda: 0, x))
  Pair = collections.namedtuple("Pair", "a b")
  with pytest.raises(TypeError, match="not Pair"):
    hxe.export(lambda d: d)(Pair(x, x))


# --- grad ------------------------------------------------------------------------------

def test_grad_through_call(data, mm):
  x, _, qw = data
  want_x, want_w = jax.grad(lambda x, q: (hx.matmul_q(x, q) ** 2).sum(), argnums=(0, 1))(x, qw)
  got_x, got_w = jax.grad(lambda x, q: (mm.call(x, q) ** 2).sum(), argnums=(0, 1))(x, qw)
  bx, bw = matmul_grad_bounds(x, hx.dequantize(qw), lambda y: 2 * y, lipschitz=2)
  assert_within(got_x, want_x, bx)
  assert_within(got_w, want_w, bw)  # dense f32[3,4] tangent of q8[3,4]
  assert got_w.shape == (3, 4) and got_w.dtype == jnp.float32


def test_grad_after_deserialize_needs_vjp_order(data, mm, mm_blob):
  x, _, qw = data
  loss = lambda e: (lambda x: e.call(x, qw).sum())  # noqa: E731
  with pytest.raises(ValueError, match="no VJP is available; serialize with vjp_order=1"):
    jax.grad(loss(hxe.deserialize(mm_blob)))(x)
  e1 = hxe.deserialize(mm.serialize(vjp_order=1))
  wd = np.asarray(hx.dequantize(qw))
  assert_within(jax.grad(loss(e1))(x), jax.grad(loss(mm))(x), 2 * sum_bound(wd, 1, extra=1))
  # and the reference, computed another way: d/dx sum(x @ W) = row sums of W
  assert_within(jax.grad(loss(e1))(x), wd.astype(np.float64).sum(1), sum_bound(wd, 1, extra=1))


# --- serialization -----------------------------------------------------------------------

def test_bytes_are_a_standard_jax_export_artifact(data, mm_blob):
  x, _, qw = data
  lo = jax.export.deserialize(bytearray(mm_blob))
  assert [str(a) for a in lo.in_avals] == ["float32[2,3]", "int8[3,4]", "float32[3]"]
  _assert_same(lo.call(x, qw.qvalue, qw.scale)[0], hx.matmul_q(x, qw))
  text = lo.mlir_module()
  assert 'hx.signature = "' in text and "hx.matmul_q" in text


def test_round_trip_keeps_the_signature(data, mm, mm_blob):
  x, _, qw = data
  back = hxe.deserialize(mm_blob)
  assert back.signature() == mm.signature()
  assert back.in_types == tuple(mm.in_types) and back.out_types == tuple(mm.out_types)
  assert back.hxmlir_version == hx.__version__
  _assert_same(back.call(x, qw), hx.matmul_q(x, qw))
  assert bytes(back.serialize()) == mm_blob  # re-sealing is deterministic


def test_fresh_process_restores_and_runs(tmp_path, data, mm_blob):
  x, _, qw = data
  (tmp_path / "mm.bin").write_bytes(mm_blob)
  np.savez(tmp_path / "in.npz", x=x, q=qw.qvalue, s=qw.scale)
  script = textwrap.dedent("""
      import sys, numpy as np, hxmlir.export as hxe, hxmlir as hx
      exp = hxe.deserialize(open(sys.argv[1] + "/mm.bin", "rb").read())
      d = np.load(sys.argv[1] + "/in.npz")
      y = exp.call(d["x"], hx.QArray(d["q"], d["s"]))
      np.save(sys.argv[1] + "/out.npy", np.asarray(y))
      print(exp.signature())
  """)
  res = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                       text=True, timeout=300, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin"})
  assert res.returncode == 0, res.stderr[-2000:]
  assert res.stdout.strip() == "(f32[2,3], q8[3,4]) -> (f32[2,4])"
  _assert_same(np.load(tmp_path / "out.npy"), hx.matmul_q(x, qw))


def test_multi_platform_export_runs_here(data):
  x, _, qw = data
  exp = hxe.export(hx.matmul_q, platforms=("cpu", "cuda", "tpu"))(x, qw)
  back = hxe.deserialize(exp.serialize())
  assert back.platforms == ("cpu", "cuda", "tpu")
  _assert_same(back.call(x, qw), hx.matmul_q(x, qw))
  _assert_same(jax.jit(back.call)(x, qw), hx.matmul_q(x, qw))


def test_sharded_signature_round_trip(data, mesh_2x4):
  _, w, _ = data
  mesh = mesh_2x4
  with jax.set_mesh(mesh):
    xs = jax.device_put(jnp.arange(24.0, dtype="float32").reshape(8, 3),
                        NamedSharding(mesh, P("i")))
    qs = hx.quantize(jax.device_put(w, NamedSharding(mesh, P())))
    exp = hxe.export(hx.matmul_q)(xs, qs)
    back = hxe.deserialize(exp.serialize())
    assert back.signature() == "(f32[8@i,3], q8[3,4]) -> (f32[8@i,4])"
    y = back.call(xs, qs)
    assert jax.typeof(y).str_short(short_dtypes=True) == "f32[8@i,4]"
    _assert_same(y, hx.matmul_q(xs, qs))


# --- bad artifacts ---------------------------------------------------------------------------

def _reseal(blob: bytes, edit) -> bytes:
  """Re-seals ``blob`` after ``edit(module, signature_dict)``: a well-formed artifact
  whose content was changed on purpose (as a buggy or newer writer would)."""
  lo = jax.export.deserialize(bytearray(blob))
  with _jax.make_ir_context():
    module = lo.mlir_module(serialized=False)
    sig = json.loads(ir.StringAttr(module.operation.attributes[hxe.SIGNATURE_ATTR]).value)
    edit(module, sig)
    lo = dataclasses.replace(lo, mlir_module_serialized=_jax.module_to_portable_bytecode(module))
  return bytes(hxe_artifact.seal(lo, {hxe.SIGNATURE_ATTR: json.dumps(sig)}))


def test_reseal_without_edits_is_accepted(data, mm_blob):
  x, _, qw = data
  _assert_same(hxe.deserialize(_reseal(mm_blob, lambda m, s: None)).call(x, qw), hx.matmul_q(x, qw))


@pytest.mark.parametrize("cut", [0, 3, 15, 16, 100, 1000, -200, -1])
def test_truncated(mm_blob, cut):
  with pytest.raises(hxe.ArtifactError, match="truncated"):
    hxe.deserialize(mm_blob[:cut])


def test_corrupted_module_bytes_are_caught_before_mlir_reads_them(mm_blob):
  module_bytes = jax.export.deserialize(bytearray(mm_blob)).mlir_module_serialized
  start = mm_blob.find(module_bytes)
  assert start > 0
  for off in (0, len(module_bytes) // 3, len(module_bytes) // 2, len(module_bytes) - 1):
    bad = bytearray(mm_blob)
    bad[start + off] ^= 0x10
    with pytest.raises(hxe.ArtifactError, match=r"artifact is truncated or corrupted: its "
                       rf"{len(mm_blob)} bytes do not match the SHA-256 digest it was sealed with"):
      hxe.deserialize(bytes(bad))


def _flips(blob: bytes, positions):
  for pos in positions:
    for bit in range(8):
      bad = bytearray(blob)
      bad[pos] ^= 1 << bit
      yield pos, bit, bytes(bad)


def _assert_refused_with_artifact_error(blob: bytes, positions) -> None:
  accepted, other = [], []
  for pos, bit, bad in _flips(blob, positions):
    try:
      hxe.deserialize(bad)
    except hxe.ArtifactError:
      continue
    except Exception as e:  # noqa: BLE001 -- any other exception is the bug
      other.append((pos, bit, f"{type(e).__name__}: {e}"))
    else:
      accepted.append((pos, bit))
  assert not accepted and not other, (accepted[:10], other[:10])


def test_every_single_bit_flip_is_refused(data):
  # the bug: a digest of canonical fields let 2,693 of 21,888 flips through, some to fail
  # deep in JAX (out_avals float32<any>, a letter in a shape, dtype 'key<urbg>')
  x, _, qw = data
  blob = bytes(hxe.export(jax.jit(hx.matmul_q))(x, qw).serialize())
  _assert_refused_with_artifact_error(blob, range(len(blob)))


def test_bit_flips_in_an_artifact_with_its_vjp_are_refused(data):
  # larger (the VJP artifact rides base64 in the module): the header region and a sample
  x, _, qw = data
  blob = bytes(hxe.export(hx.matmul_q)(x, qw).serialize(vjp_order=1))
  rng = np.random.default_rng(0)
  sample = rng.choice(len(blob), size=min(len(blob), 600), replace=False)
  _assert_refused_with_artifact_error(blob, sorted({*range(256), *map(int, sample)}))


def test_the_digest_covers_the_bytes_and_the_bytes_are_plain_jax(data, mm_blob):
  x, _, qw = data
  lo = jax.export.deserialize(bytearray(mm_blob))  # a standard jax.export serialization
  (seal,) = [c.is_custom_call() for c in lo.disabled_safety_checks
             if (c.is_custom_call() or "").startswith(hxe.DIGEST_PREFIX)]
  hexd = seal[len(hxe.DIGEST_PREFIX):]
  at = mm_blob.index(seal.encode()) + len(hxe.DIGEST_PREFIX)
  zeroed = mm_blob[:at] + b"0" * 64 + mm_blob[at + 64:]
  assert hashlib.sha256(zeroed).hexdigest() == hexd
  assert json.loads(_signature_text(mm_blob))["format"] == hxe.ARTIFACT_FORMAT == 2
  _assert_same(lo.call(x, qw.qvalue, qw.scale)[0], hx.matmul_q(x, qw))


def _signature_text(blob: bytes) -> str:
  with _jax.make_ir_context():
    module = jax.export.deserialize(bytearray(blob)).mlir_module(serialized=False)
    return ir.StringAttr(module.operation.attributes[hxe.SIGNATURE_ATTR]).value


@pytest.mark.parametrize("blob", [b"hello\n", b"x" * 15, b"\x00" * 100, b"PK\x03\x04" * 100,
                                  b"not an artifact at all, just a text file\n" * 10])
def test_other_files_are_not_hxmlir_artifacts(blob):
  with pytest.raises(hxe.ArtifactError, match="not an hxmlir artifact|not a readable jax.export"):
    hxe.deserialize(blob)


def test_plain_jax_artifact_is_not_an_hxmlir_artifact(data):
  x, _, _ = data
  blob = jax.export.export(jax.jit(jnp.sin))(x).serialize()
  with pytest.raises(hxe.ArtifactError, match="was not written by hxmlir.export"):
    hxe.deserialize(blob)
  with pytest.raises(hxe.ArtifactError, match="expected the bytes"):
    hxe.deserialize("not bytes")


def test_newer_artifact_format(mm_blob):
  def edit(m, sig):
    sig["format"], sig["hxmlir"] = hxe.ARTIFACT_FORMAT + 1, "9.0.0"
  n = hxe.ARTIFACT_FORMAT
  with pytest.raises(hxe.ArtifactError, match=rf"written by hxmlir 9.0.0 in artifact format "
                     rf"{n + 1}; this hxmlir .* reads formats <= {n}: upgrade hxmlir"):
    hxe.deserialize(_reseal(mm_blob, edit))


def test_format_and_digest_kind_must_agree(mm_blob):
  # format 1 artifacts (tests/py/integration/backcompat) carry the old field digest; a format-2 digest
  # on a format-1 signature is not something hxmlir writes
  def edit(m, sig):
    sig["format"] = 1
  with pytest.raises(hxe.ArtifactError, match="artifact format 1 but sealed with the format-2 "
                     "digest"):
    hxe.deserialize(_reseal(mm_blob, edit))


def test_newer_type_schema(mm_blob):
  def edit(m, sig):
    sig["in"][1]["v"] = 5
  with pytest.raises(hxe.ArtifactError, match=r"argument 1: type 'q8' has schema version 5"):
    hxe.deserialize(_reseal(mm_blob, edit))


def test_newer_composite_version(mm_blob):
  def edit(m, sig):
    def visit(op):
      if op.name == "stablehlo.composite":
        op.attributes["version"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 99)
      return ir.WalkResult.ADVANCE
    m.operation.walk(visit)
  with pytest.raises(hxe.ArtifactError, match=r"uses composite hx.matmul_q version 99 at .* "
                     r"does not accept \(accepted versions \[1, 2, 3, 4, 5\]\): upgrade hxmlir"):
    hxe.deserialize(_reseal(mm_blob, edit))


def test_signature_not_matching_the_module(mm_blob):
  def edit(m, sig):
    sig["in"][1]["shape"] = [3, 5]
  with pytest.raises(hxe.ArtifactError, match=r"hi signature arguments \(f32\[2,3\], "
                     r"q8\[3,5\]\) do not match the module's arguments \(float32\[2,3\], "
                     r"int8\[3,4\], float32\[3\]\)"):
    hxe.deserialize(_reseal(mm_blob, edit))

  def swap(m, sig):
    sig["out"], sig["in"] = sig["in"], sig["out"]
  with pytest.raises(hxe.ArtifactError, match="do not match"):
    hxe.deserialize(_reseal(mm_blob, swap))


def test_missing_or_broken_signature(mm_blob):
  def drop(m, sig):
    sig.clear()
  with pytest.raises(hxe.ArtifactError, match="has no integer 'format'"):
    hxe.deserialize(_reseal(mm_blob, drop))

  def unknown(m, sig):
    sig["in"][0] = {"type": "q2", "v": 1}
  with pytest.raises(hxe.ArtifactError, match="argument 0: unknown type name 'q2'"):
    hxe.deserialize(_reseal(mm_blob, unknown))


# --- export-stable kernels ------------------------------------------------------------------

def _triton_fn(name: str):
  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2

  def f(x):
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), name=name,
                          compiler_params=pltriton.CompilerParams())(x)
  return jax.jit(f)


@pytest.fixture
def clean_targets():
  before = _jax.export_allowed_custom_call_targets()
  yield
  for k in targets.registered_kernels():
    if k.owner == "test":
      targets.unregister_kernel(k)
  assert _jax.export_allowed_custom_call_targets() == before


def test_register_kernel_checks_its_arguments(clean_targets):
  k = targets.register_kernel(targets.TRITON, "hx_test_double", 1, ("cuda",), owner="test")
  assert k.ir_name == "hx_test_double_v1"
  assert targets.register_kernel(targets.TRITON, "hx_test_double", 1, "cuda", owner="test") is k
  with pytest.raises(ValueError, match="already registered .* bump the version"):
    targets.register_kernel(targets.TRITON, "hx_test_double", 1, ("cuda", "rocm"), owner="test")
  with pytest.raises(ValueError, match="must be an identifier"):
    targets.register_kernel(targets.TRITON, "bad name", 1, ("cuda",))
  with pytest.raises(ValueError, match="version must be an int >= 1"):
    targets.register_kernel(targets.TRITON, "k", 0, ("cuda",))
  with pytest.raises(ValueError, match=r"kernel platforms must be a non-empty list of cpu, "
                                       r"cuda, rocm, tpu, got \('gpu',\) \(unknown: 'gpu'\)"):
    targets.register_kernel(targets.TRITON, "k", 1, ("gpu",))
  assert targets.lookup(targets.TRITON, "hx_test_double_v1") is k
  assert targets.lookup(targets.TRITON, "hx_test_double_v2") is None
  assert targets.lookup(targets.TRITON, "hx_test_double") is None


def test_install_widens_the_allow_list_only_where_installed(clean_targets):
  """``jax.export`` accepts a registered Triton kernel only in a thread where hxmlir is
  installed; a thread without hxmlir, while another sits inside ``hx.installed()``,
  exports against JAX's own list (an unregistered kernel is refused there, as before
  and after), and nothing is left on JAX's list afterwards."""
  x = jnp.ones((8, 128), "float32")
  ours, theirs = _triton_fn("hx_test_double_v1"), _triton_fn("not_registered")
  refused = "custom calls whose targets have no compatibility"
  targets.register_kernel(targets.TRITON, "hx_test_double", 1, ("cuda",), owner="test")
  assert targets.TRITON in targets.registered_targets()
  assert targets.TRITON not in targets.jax_stable_targets()
  with pytest.raises(ValueError, match=refused):
    jax.export.export(ours, platforms=["cuda"])(x)
  inside, done, seen = threading.Event(), threading.Event(), {}

  def installed_thread():
    with hx.installed():
      seen["allowed"] = targets.TRITON in _jax.export_allowed_custom_call_targets()
      seen["ours"] = jax.export.export(ours, platforms=["cuda"])(x).mlir_module()
      inside.set()
      done.wait(60)

  t = threading.Thread(target=installed_thread)
  t.start()
  try:
    assert inside.wait(60)
    assert seen["allowed"] and "hx_test_double_v1" in seen["ours"]
    assert targets.TRITON not in _jax.export_allowed_custom_call_targets()  # this thread
    with pytest.raises(ValueError, match=refused):
      jax.export.export(theirs, platforms=["cuda"])(x)
    with pytest.raises(ValueError, match=refused):
      jax.export.export(ours, platforms=["cuda"])(x)
  finally:
    done.set()
    t.join()
  with pytest.raises(ValueError, match=refused):
    jax.export.export(theirs, platforms=["cuda"])(x)
  assert targets.TRITON not in _jax.export_allowed_custom_call_targets()


def test_check_export_pass_tells_registered_from_user_kernels(clean_targets):
  from hxmlir.passes import parsing
  from hxmlir.passes.base import Diagnostics
  from hxmlir.passes.check_export import CheckExportPass

  targets.register_kernel(targets.TRITON, "hx_test_double", 1, ("cuda",), owner="test")
  x = jnp.ones((8, 128), "float32")

  def check(fn):
    text = fn.trace(x).lower(lowering_platforms=("cuda",)).as_text()
    with parsing.make_context():
      module = parsing.parse_module(text, parsing.make_context(), "m.mlir")
      diags = Diagnostics()
      CheckExportPass().apply(module, diags)
    return diags.errors

  assert check(_triton_fn("hx_test_double_v1")) == []
  errs = check(jax.jit(lambda x: _triton_fn("hx_test_double_v1")(_triton_fn("mine")(x))))
  assert len(errs) == 1
  assert "1 custom call is not export-stable" in errs[0].message
  assert "kernel 'mine' is not registered; registered on this target: " in errs[0].message
  assert "hx_test_double_v1" in errs[0].message.split("registered on this target: ")[1]
  assert "hxmlir.targets.register_kernel" in errs[0].message


def test_install_refuses_user_triton_kernels_in_exports(clean_targets, data):
  x, _, qw = data
  targets.register_kernel(targets.TRITON, "hx_test_double", 1, ("cuda",), owner="test")

  def f(x, mine):
    y = _triton_fn("mine" if mine else "hx_test_double_v1")(jnp.ones((8, 128), "float32"))
    return hx.matmul_q(x, qw) + y[:2, :4]

  hx.install()
  try:
    jax.export.export(jax.jit(lambda x: f(x, False)), platforms=["cuda"])(x)
    with pytest.raises(hx.VerificationError, match="kernel 'mine' is not registered"):
      jax.export.export(jax.jit(lambda x: f(x, True)), platforms=["cuda"])(x)
  finally:
    hx.uninstall()
  assert targets.TRITON not in _jax.export_allowed_custom_call_targets()


def test_install_refuses_user_triton_kernels_without_hx_ops(clean_targets):
  targets.register_kernel(targets.TRITON, "hx_test_double", 1, ("cuda",), owner="test")
  hx.install()
  try:
    with pytest.raises(hx.VerificationError, match="kernel 'mine' is not registered"):
      jax.export.export(_triton_fn("mine"), platforms=["cuda"])(jnp.ones((8, 128), "float32"))
  finally:
    hx.uninstall()


@pytest.mark.parametrize("platforms, unknown", [(("cpu", "tpuu"), "'tpuu'"), ("gpu", "'gpu'"),
                                                (("CPU",), "'CPU'"), ((), None)])
def test_every_platform_list_is_checked_against_the_known_platforms(data, platforms, unknown):
  # jax.export exports for a misspelt platform as if it existed; hxmlir's entry points
  # (hxmlir.export.export, hxmlir.testing.lowered_text, register_kernel) refuse it
  from hxmlir.testing import lowered_text
  x, _, qw = data
  tail = r" \(unknown: " + unknown + r"\)" if unknown else "$"
  with pytest.raises(ValueError, match=r"hxmlir\.export\.export platforms must be a non-empty "
                                       r"list of cpu, cuda, rocm, tpu, got .*" + tail):
    hxe.export(jax.jit(hx.matmul_q), platforms=platforms)
  with pytest.raises(ValueError, match=r"lowered_text platforms must be a non-empty list .*" + tail):
    lowered_text(hx.matmul_q, x, qw, platforms=platforms)
  with pytest.raises(ValueError, match=r"kernel platforms must be a non-empty list .*" + tail):
    targets.register_kernel(targets.TRITON, "hx_test_platforms", 1, platforms, owner="test")
  assert hxe.export(jax.jit(hx.matmul_q), platforms=("cpu", "tpu"))(x, qw).platforms == \
      ("cpu", "tpu")


@pytest.mark.parametrize("arg", [jax.ShapeDtypeStruct((2, 128), np.float64),
                                 jax.core.ShapedArray((2, 128), np.float64)],
                         ids=["ShapeDtypeStruct", "ShapedArray"])
def test_a_type_x64_would_need_is_recorded_as_jax_computes_it(arg):
  # with x64 off an f64 argument type is f32 in the module: the hi signature records f32
  # too (it recorded f64, and the artifact could not be loaded: "hi signature arguments
  # (f64[2,128], ...) do not match the module's arguments")
  assert not jax.config.jax_enable_x64
  q = hx.quantize(jnp.asarray(np.linspace(-1, 1, 64 * 128, dtype=np.float32).reshape(64, 128)))
  exp = hxe.export(jax.jit(lambda x, q: hx.einsum("...k,nk->...n", x, q)))(arg, q)
  assert [str(t) for t in exp.in_types] == ["float32[2,128]", "q8[64,128]"]
  back = hxe.deserialize(exp.serialize())
  x = np.random.default_rng(0).standard_normal((2, 128)).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(back.call(x, q)), np.asarray(exp.call(x, q)))
  dense = hxe.export(jax.jit(lambda x: x * 2))(arg)
  assert [str(t) for t in hxe.deserialize(dense.serialize()).in_types] == ["float32[2,128]"]
