"""The native CPU kernels' format table (``csrc/matmul_q_format_table.h``) against
:data:`hxmlir.formats.FORMATS`.

The extension exports what its decoders take (``native_formats()``: one
``(dtype, layout, weight layout, scale dtype, offset)`` per accepted combination;
``i8x_formats()``: the dtypes of the integer-activation kernel). Every format of
:mod:`hxmlir.formats` that claims a weight layout in ``native_cpu`` must be decodable there,
and every value decoder of the C++ side must belong to such a format (no decoder that
no Python format reaches, no Python format whose claim the kernel would refuse).
"""

from __future__ import annotations

import pytest

from hxmlir import formats

ext = pytest.importorskip("hxmlir._matmul_q_cpu", reason="native extension not built")


def _python_claims() -> set[tuple[str, str, str, str, bool]]:
  # the dtype attribute: the values' dtype, or a block format's own name (hx_matmul_q_cpu_v4)
  return {(f.name if f.block else f.value_dtype.name, f.layout, wl, f.scale_mlir, bool(f.offset))
          for f in formats.FORMATS.values() for wl in f.native_cpu}


def test_every_claimed_format_is_decoded():
  missing = _python_claims() - set(ext.native_formats())
  assert not missing, f"formats claiming native_cpu that the C++ table lacks: {sorted(missing)}"


@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_value_decoders_equal_claimed_formats(layout):
  cpp = {(d, lay) for d, lay, wl, _, _ in ext.native_formats() if wl == layout}
  py = {(d, lay) for d, lay, wl, _, _ in _python_claims() if wl == layout}
  assert cpp == py


def test_i8x_formats_are_native_integer_formats():
  i8x = set(ext.i8x_formats())
  nk = {d for d, _, wl, _, _ in ext.native_formats() if wl == "nk"}
  assert i8x and i8x <= nk
  # every integer-valued format taken in [out, in] has the integer-activation path
  ints = {f.value_dtype.name for f in formats.FORMATS.values()
          if "nk" in f.native_cpu and f.integer and not f.block}
  assert ints == i8x


def test_table_rows_are_well_formed():
  # each row once, a weight layout of WEIGHT_LAYOUTS, a scale dtype the formats use
  rows = ext.native_formats()
  assert len(rows) == len(set(rows))
  assert {wl for _, _, wl, _, _ in rows} <= set(formats.WEIGHT_LAYOUTS)
  assert {sd for _, _, _, sd, _ in rows} <= {"f32", "f16"}
