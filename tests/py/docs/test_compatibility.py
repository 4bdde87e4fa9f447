"""docs/compatibility.md's tables are the code's: every ``hx.*`` composite version
(``lowering/schema.py``) and every kernel hxmlir registers (``hxmlir/targets.py``), with the
hxmlir version that introduced it.

A new composite or kernel version fails this test until it has a row in :data:`SINCE` (and
so an hxmlir version: bump ``hxmlir/_version.py`` and say it in CHANGELOG.md). Regenerate
the page's tables with ``python tests/py/docs/test_compatibility.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hxmlir as hx
from hxmlir import targets
from hxmlir.lowering import schema

PAGE = Path(__file__).resolve().parents[3] / "docs" / "compatibility.md"
BEGIN, END = "<!-- BEGIN generated tables -->", "<!-- END generated tables -->"

# (composite, version) or kernel IR name -> the hxmlir version that introduced it
SINCE = {
    ("hx.quantize", 1): "0.1.0", ("hx.quantize", 2): "0.2.0", ("hx.quantize", 3): "0.3.0",
    ("hx.dequantize", 1): "0.1.0", ("hx.dequantize", 2): "0.2.0", ("hx.dequantize", 3): "0.3.0",
    ("hx.matmul_q", 1): "0.1.0", ("hx.matmul_q", 2): "0.2.0", ("hx.matmul_q", 3): "0.2.0",
    ("hx.matmul_q", 4): "0.3.0",
    ("hx.outer", 1): "0.1.0", ("hx.matmul_r1", 1): "0.1.0", ("hx.attention", 1): "0.4.0",
    "hx_matmul_q_v1": "0.1.0", "hx_matmul_q_v2": "0.2.0", "hx_matmul_q_nk_v1": "0.3.0",
    "hx_matmul_q_cpu_v1": "0.2.0", "hx_matmul_q_cpu_v2": "0.2.0", "hx_matmul_q_cpu_v3": "0.3.0",
    "hx_matmul_q_cpu_i8x_v1": "0.4.0", "hx_attention_cpu_v1": "0.4.0",
    ("hx.dequantize", 4): "0.5.0", ("hx.matmul_q", 5): "0.5.0", ("hx.attention", 2): "0.5.0",
    "hx_matmul_q_cpu_v4": "0.5.0", "hx_attention_cpu_v2": "0.5.0",
    "hx_matmul_q_cpu_nkt_v1": "0.6.0", "hx_matmul_q_cpu_i8x_v2": "0.6.0",
    ("hx.attention", 3): "0.7.0", "hx_attention_cpu_v3": "0.7.0",
    "hx_matmul_q_nk_blocks_v1": "0.8.5",
    # a kernel name that gained a target later: (name, target) -> that target's version
    ("hx_matmul_q_nk_blocks_v1", targets.TRITON): "0.8.6",
}


def _v(s: str) -> tuple[int, ...]:
  return tuple(int(p) for p in s.split("."))


def render() -> str:
  """The two Markdown tables, from the schema and the kernel registry."""
  rows = ["| composite | version | emitted for | since hxmlir |", "|---|---|---|---|"]
  for op in schema.SCHEMAS.values():
    for v in op.versions:
      if v == op.version:
        emitted = "every new lowering"
        if op.legacy_version is not None:
          emitted = "formats with f16 scales or an offset"
      elif v == op.legacy_version:
        emitted = "formats with f32 scales and no offset"
      else:
        emitted = "read only (older artifacts)"
      emitted = op.emitted_for.get(v, emitted)
      rows.append(f"| `{op.name}` | {v} | {emitted} | {SINCE[(op.name, v)]} |")
  rows += ["", "| kernel (custom call) | target | platforms | since hxmlir |", "|---|---|---|---|"]
  by_name: dict[str, tuple[str, list[str]]] = {}
  for k in targets.registered_kernels():
    if k.owner != "hxmlir":
      continue
    tgts, plats = by_name.setdefault(k.ir_name, ([], []))
    tgts.append(k.target)
    plats.extend(k.platforms)
  for name in sorted(by_name):
    tgts, plats = by_name[name]
    tgt = ", ".join(f"`{t}`" for t in dict.fromkeys(tgts))
    later = [f"{SINCE[(name, t)]} (`{t}`)" for t in dict.fromkeys(tgts) if (name, t) in SINCE]
    rows.append(f"| `{name}` | {tgt} | {', '.join(plats)} | "
                f"{', '.join([SINCE[name], *later])} |")
  return "\n".join(rows) + "\n"


def test_every_version_has_a_since_entry_not_newer_than_this_hxmlir():
  keys = {(op.name, v) for op in schema.SCHEMAS.values() for v in op.versions}
  keys |= {k.ir_name for k in targets.registered_kernels() if k.owner == "hxmlir"}
  missing = keys - set(SINCE)
  keys |= {k for k in SINCE if isinstance(k, tuple) and k[0] in keys}
  assert not missing, f"no SINCE entry (and version) for {sorted(map(str, missing))}"
  newest = max(_v(SINCE[k]) for k in keys)
  assert newest <= _v(hx.__version__), (newest, hx.__version__)


def test_page_tables_are_generated_from_the_code():
  text = PAGE.read_text()
  assert BEGIN in text and END in text, f"{PAGE} lost its {BEGIN} / {END} markers"
  body = text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
  assert body == render(), ("docs/compatibility.md is out of date: run "
                            "python tests/py/docs/test_compatibility.py\n" + render())


if __name__ == "__main__":
  text = PAGE.read_text()
  head, rest = text.split(BEGIN, 1)
  tail = rest.split(END, 1)[1]
  PAGE.write_text(f"{head}{BEGIN}\n{render()}{END}{tail}")
  sys.exit(0)
