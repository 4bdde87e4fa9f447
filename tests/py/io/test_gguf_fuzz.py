"""A fuzzer for hxmlir.gguf: corrupted GGUF files are either loaded exactly or refused with a
GGUFError naming the file; never another exception, a hang or a silently wrong number.

Hypothesis (``derandomize=True``: the same examples on every run, so CI is reproducible)
mutates a small GGUF file (tests/py/io/gguf_files.py: metadata of every kind the decoder
reads, one tensor per quantized type) with 1 to 3 of: a numeric header field set to an
edge value (counts, lengths, value types, tensor dimensions, type ids, offsets), a byte
flipped, bytes inserted or deleted in the header, a tensor's type id set to another
GGUF type (its bytes then run into the next tensor's, or fall short), the file cut short, bytes of the data
section overwritten. Each mutated file goes through :func:`hxmlir.gguf.load` and
:func:`hxmlir.gguf.inspect`. A load that succeeds must give every tensor's numbers as
``gguf.quants.dequantize`` reads the same bytes (an independent decoder), and the metadata
as the ``gguf`` package's reader reads it.
"""

import collections
import os
import signal
import struct

import numpy as np
import pytest
from gguf_files import field_map, write_small

import hxmlir as hx
from hxmlir import gguf as hg

gguf = pytest.importorskip("gguf", reason="pip install 'hxmlir[gguf]'")
hypothesis = pytest.importorskip("hypothesis", reason="pip install 'hxmlir[test]'")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = 300
SECONDS = 20  # one file's check, load and comparison; past it the test fails as a hang
OUTCOMES = collections.Counter()  # what the fuzzer saw (printed at the module's end with -s)

EDGE = [0, 1, 2, 3, 7, 8, 9, 12, 13, 31, 32, 33, 255, 256, 1 << 15, (1 << 31) - 1, 1 << 31,
        (1 << 32) - 1, 1 << 32, 1 << 62, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  path = write_small(tmp_path_factory.mktemp("fuzz") / "base.gguf")
  fields, data_start = field_map(path)
  yield _Base((path.read_bytes(), fields, data_start))
  print(f"\ngguf fuzz: {sum(OUTCOMES.values())} files: " + ", ".join(
      f"{k} {v}" for k, v in sorted(OUTCOMES.items())))


class _Base(tuple):
  def __repr__(self):
    return f"<base GGUF file: {len(self[0])} bytes, {len(self[1])} fields>"


@st.composite
def mutation(draw, base):
  data, fields, data_start = base
  kind = draw(st.sampled_from(["field", "field", "retype", "flip", "splice", "cut", "data", "data"]))
  if kind == "retype":  # a tensor's type id set to another known type: its size changes
    f = draw(st.sampled_from([f for f in fields if f.what.startswith("tensor ")
                              and f.what.endswith("part 4[0]")]))
    v = int(draw(st.sampled_from(list(gguf.GGMLQuantizationType))))
    return kind, f.what, lambda b: b[:f.offset] + v.to_bytes(4, "little") + b[f.offset + 4:]
  if kind == "field":
    f = draw(st.sampled_from(fields))
    v = draw(st.one_of(st.sampled_from(EDGE), st.integers(0, (1 << (8 * f.size)) - 1)))
    v &= (1 << (8 * f.size)) - 1
    return kind, f.what, lambda b: b[:f.offset] + v.to_bytes(f.size, "little") + b[f.offset + f.size:]
  if kind == "flip":
    at = draw(st.integers(0, data_start - 1))
    x = draw(st.integers(1, 255))
    return kind, at, lambda b: b[:at] + bytes([b[at] ^ x]) + b[at + 1:] if at < len(b) else b
  if kind == "splice":
    at = draw(st.integers(4, data_start))
    cut = draw(st.integers(0, 16))
    new = draw(st.binary(max_size=16))
    return kind, at, lambda b: b[:at] + new + b[at + cut:]
  if kind == "cut":
    keep = draw(st.integers(0, len(data) - 1))
    return kind, keep, lambda b: b[:keep]
  at = draw(st.integers(data_start, len(data) - 1))
  new = draw(st.binary(min_size=1, max_size=64))
  return kind, at, lambda b: b[:at] + new[:len(b) - at] + b[at + len(new):]


def _timeout(signum, frame):
  raise TimeoutError(f"one GGUF file took more than {SECONDS} s: a hang")


def _same_numbers(got, want, what):
  """``got`` (hxmlir's f32) equals ``want`` (gguf.quants.dequantize's f32): the same NaN and
  infinity positions; finite values within the one or two f32 roundings of ``q * d + m``
  (either side may fuse the multiply-add): ``eps (|want| + |m|)``, ``m`` the offset term."""
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32).reshape(got.shape)
  assert np.array_equal(np.isnan(got), np.isnan(want)), what
  inf = np.isinf(want)
  assert np.array_equal(got[inf], want[inf]) and not np.isinf(got[~inf]).any(), what
  fin = np.isfinite(want)
  return got[fin], want[fin]


def _check_loaded(path, ck):
  """Every tensor of ``ck`` against ``gguf.quants.dequantize`` of the same file's bytes."""
  r = gguf.GGUFReader(os.fspath(path))
  np.testing.assert_equal(ck.metadata, {k: f.contents() for k, f in r.fields.items()
                                        if not k.startswith("GGUF.")})  # NaN equals NaN
  assert sorted(ck.tensors) == sorted(t.name for t in r.tensors)
  eps = np.finfo(np.float32).eps
  for t in r.tensors:
    v = ck.tensors[t.name]
    if t.tensor_type.name in ("I8", "I16", "I32", "I64", "F64"):  # the reader's own dtype
      want = np.asarray(t.data)
      assert np.array_equal(np.asarray(v).reshape(want.shape), want,
                            equal_nan=want.dtype.kind == "f"), t.name
      continue
    with np.errstate(all="ignore"):  # corrupted scales: inf * 0 is a NaN the reference warns of
      want = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    if isinstance(v, hx.QArray):
      got = np.asarray(hx.dequantize(v))
      off = 0.0
      if v.offset is not None:  # per-group offsets, broadcast over their groups
        o = np.abs(np.asarray(v.offset, np.float32))
        off = np.repeat(o, got.shape[-1] // o.shape[-1], axis=-1)
        off = off[np.isfinite(np.asarray(want).reshape(got.shape))]
      g, w = _same_numbers(got, want, t.name)
      assert np.all(np.abs(g - w) <= eps * (np.abs(w) + off)), t.name
    else:
      got = np.asarray(v)
      g, w = _same_numbers(got.astype(np.float32), np.asarray(want, np.float32), t.name)
      assert np.array_equal(g, w), t.name


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_corrupted_files_load_exactly_or_are_a_gguf_error(base, tmp_path, data):
  raw = base[0]
  steps = data.draw(st.lists(mutation(base), min_size=1, max_size=3), label="mutations")
  for _, _, f in steps:
    raw = f(raw)
  path = tmp_path / "fuzzed.gguf"
  path.write_bytes(raw)
  old = signal.signal(signal.SIGALRM, _timeout)
  signal.setitimer(signal.ITIMER_REAL, SECONDS)
  try:
    try:
      info = hg.inspect(path)
    except hg.GGUFError as e:
      assert str(e).startswith(f"{path}: "), e
      assert all(line.startswith(f"{path}: ") for line in str(e).splitlines()), e
      OUTCOMES["refused: " + _reason(str(e))] += 1
      with pytest.raises(hg.GGUFError):
        hg.load(path)
      return
    assert len(info["tensors"]) == len(hg.read_header(path).reader.tensors)
    unsupported = data.draw(st.booleans(), label="dequantize_unsupported")
    try:
      ck = hg.load(path, dequantize_unsupported=unsupported)
    except hg.GGUFError as e:  # a file sound as a whole, with a tensor hxmlir cannot hold
      assert "cannot hold exactly" in str(e) or "cannot dequantize" in str(e), e
      OUTCOMES["refused at load: unsupported type"] += 1
      return
    _check_loaded(path, ck)
    OUTCOMES["loaded, numbers equal gguf.quants.dequantize"] += 1
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


def _reason(message: str) -> str:
  """A short class of a GGUFError message, for the fuzzer's tally."""
  for words in ("not valid UTF-8", "runs into", "truncated data section", "truncated or malformed",
                "type id", "value type", "expected a token id", "alignment", "dimensions",
                "appears twice", "not a multiple", "GGUF version", "header's own", "bool",
                "array of arrays", "expected an integer", "expected a", "entries", "empty",
                "reader failed", "no elements", "not a GGUF file"):
    if words in message:
      return words
  return message.split(": ", 1)[1][:40]


def test_the_mutations_reach_the_fields_they_name(base):
  """The field map is right: setting the first tensor's type id to 99 is reported for it."""
  raw, fields, _ = base
  f = next(f for f in fields if f.what == "tensor t.Q8_0 part 4[0]")
  assert struct.unpack_from("<I", raw, f.offset)[0] == gguf.GGMLQuantizationType.Q8_0
