"""A fuzzer for ``hxmlir run --inputs NPZ``: a corrupted or mistyped ``.npz`` either runs and
gives the results of the file's own arrays, or is one error line with status 1; never a
traceback, another status or a hang.

(Artifacts themselves are fuzzed in tests/py/integration/test_export.py: every single bit
flip of an ``.hxa`` is refused.) Hypothesis (``derandomize=True``: the same examples on every
run) mutates an ``.npz`` holding a function's inputs (``f32``, a ``q8`` value's ``i8`` and
``f32`` components): bytes of the zip flipped or cut, arrays saved with another dtype or
shape, arrays dropped or added, an ``.npy`` header's shape rewritten.
"""

from __future__ import annotations

import collections
import io
import signal
import textwrap
import zipfile

import numpy as np
import pytest

from hxmlir.tools import cli

hypothesis = pytest.importorskip("hypothesis", reason="pip install 'hxmlir[test]'")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = 60
SECONDS = 60
OUTCOMES = collections.Counter()

MODULE = textwrap.dedent('''\
    import hxmlir as hx
    def mm(x, w):
      return hx.matmul_q(x, w)
    ''')


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  d = tmp_path_factory.mktemp("runfuzz")
  (d / "fm.py").write_text(MODULE)
  art = d / "mm.hxa"
  assert cli.main(["export", f"{d}/fm.py:mm", "--arg", "f32[2,4]", "--arg", "q8[4,3]",
                   "-o", str(art)]) == 0
  rng = np.random.default_rng(5)
  arrays = {"a0": rng.standard_normal((2, 4)).astype(np.float32),
            "a1.qvalue": rng.integers(-127, 128, (4, 3)).astype(np.int8),
            "a1.scale": rng.uniform(0.01, 0.1, 4).astype(np.float32)}
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  out = d / "good_out.npz"
  np.savez(d / "good.npz", **arrays)
  assert cli.main(["run", str(art), "--inputs", str(d / "good.npz"), "--output", str(out)]) == 0
  with np.load(out) as z:
    want = z["a0"]
  yield _Files((art, buf.getvalue(), arrays, want))
  print(f"\nrun --inputs fuzz: {sum(OUTCOMES.values())} files: "
        + ", ".join(f"{k} {v}" for k, v in sorted(OUTCOMES.items())))


class _Files(tuple):
  def __repr__(self):
    return f"<artifact {self[0].name} and its inputs>"


def _savez(arrays) -> bytes:
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  return buf.getvalue()


@st.composite
def mutated(draw, files):
  _, blob, arrays, _ = files
  kind = draw(st.sampled_from(["flip", "cut", "dtype", "shape", "drop", "add", "header"]))
  if kind == "flip":
    at = draw(st.integers(0, len(blob) - 1))
    return kind, blob[:at] + bytes([blob[at] ^ draw(st.integers(1, 255))]) + blob[at + 1:]
  if kind == "cut":
    return kind, blob[:draw(st.integers(0, len(blob) - 1))]
  key = draw(st.sampled_from(sorted(arrays)))
  new = dict(arrays)
  if kind == "dtype":
    dt = draw(st.sampled_from(["float16", "float64", "int8", "uint8", "int32", "bool",
                               "complex64", "<U3"]))
    new[key] = arrays[key].astype(dt)
  elif kind == "shape":
    new[key] = np.resize(arrays[key], draw(st.lists(st.integers(0, 5), max_size=3)))
  elif kind == "drop":
    del new[key]
  elif kind == "add":
    new[draw(st.sampled_from(["a2", "a1.offset", "x", "a0.qvalue"]))] = arrays[key]
  else:  # the .npy header claims another shape (the data stays)
    shape = tuple(draw(st.lists(st.integers(0, 1 << 40), max_size=3)))
    return kind, _zip({k: _npy(v, shape if k == key else None) for k, v in arrays.items()})
  return kind, _savez(new)


def _npy(a: np.ndarray, shape=None) -> bytes:
  """``a`` as ``.npy`` bytes; with ``shape``, a header that claims that shape instead."""
  buf = io.BytesIO()
  np.lib.format.write_array(buf, a)
  raw = buf.getvalue()
  if shape is None:
    return raw
  head = np.lib.format.header_data_from_array_1_0(a) | {"shape": shape}
  out = io.BytesIO()
  np.lib.format.write_array_header_1_0(out, head)
  return out.getvalue() + raw[raw.index(b"\n") + 1:]


def _zip(members: dict[str, bytes]) -> bytes:
  """A zip of ``NAME.npy`` members, as ``np.savez`` writes them (stored)."""
  out = io.BytesIO()
  with zipfile.ZipFile(out, "w") as z:
    for k, raw in members.items():
      z.writestr(k + ".npy", raw)
  return out.getvalue()


def _timeout(signum, frame):
  raise TimeoutError(f"hxmlir run took more than {SECONDS} s: a hang")


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_corrupted_inputs_run_exactly_or_are_one_error_line(files, tmp_path, capsys, data):
  art, _, arrays, want = files
  kind, blob = data.draw(mutated(files), label="inputs")
  path = tmp_path / "in.npz"
  path.write_bytes(blob)
  out = tmp_path / "out.npz"
  out.unlink(missing_ok=True)
  capsys.readouterr()
  old = signal.signal(signal.SIGALRM, _timeout)
  signal.setitimer(signal.ITIMER_REAL, SECONDS)
  try:
    rc = cli.main(["run", str(art), "--inputs", str(path), "--output", str(out)])
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)
  err = capsys.readouterr().err
  if rc == 0:
    # it ran: then the file held exactly the inputs (zip CRCs guard the data), and the
    # results are the good inputs' results
    with np.load(path) as z:
      assert sorted(z.files) == sorted(arrays)
      for k, v in arrays.items():
        assert z[k].dtype == v.dtype and np.array_equal(z[k], v), k
    with np.load(out) as z:
      assert np.array_equal(z["a0"], want)
    OUTCOMES[f"{kind}: ran, results equal"] += 1
    return
  assert rc == 1, (rc, err)
  lines = err.splitlines()
  assert len(lines) == 1 and lines[0].startswith("hxmlir run: error: "), err
  assert "Traceback" not in err
  OUTCOMES[f"{kind}: {lines[0].split(': ')[2]}"] += 1
