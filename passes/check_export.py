"""``hx-check-export``: every custom call is export-stable, or the module is refused.

A ``stablehlo.custom_call`` passes when

- its ``call_target_name`` is on JAX's own list of stable targets (the list
  ``jax.export`` checks, without the targets ``hx.install()`` adds),
  for example ``tpu_custom_call`` or ``lapack_sgetrf_ffi``; or
- its target *and* kernel name are a kernel registered in
  :mod:`hxmlir.targets` (the name, ``<name>_v<version>``, carries the version;
  it is read with :func:`hxmlir.targets.kernel_name_of`); or
- its target is in the pass's ``allow_targets`` option.

Everything else -- for example a user's own Pallas Triton kernel, which shares
the ``__gpu$xla.gpu.triton`` target with hxmlir's registered Triton kernels --
is reported in ONE error, at the first offending call, that lists every
offending call with its location, target and kernel name, and the ways to allow
it. Modelled on ``jax.export``'s ``_check_module`` (one walk, one error with
every offender). ``hx.install()`` runs this pass last on every lowering for
``jax.export``. The module is never modified.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from jaxlib.mlir import ir

from hxmlir import targets
from hxmlir.passes import locations, ops
from hxmlir.passes.base import HxPass, PassContext, PassResult


@dataclass(frozen=True)
class CheckExportPass(HxPass):
  """Refuses custom calls that are neither JAX-stable nor registered hxmlir kernels.

  Options:
    allow_targets: ``;``-separated custom-call targets accepted without a
      kernel check (``hx-check-export{allow-targets=my_ffi;other_ffi}``), the
      pass's counterpart of ``jax.export.DisabledSafetyCheck.custom_call``.
      ``;``, not ``,`` (which separates passes); a ``,`` in the value is an
      error, and ``--list-passes`` shows the separator.
  """
  name: ClassVar[str] = "hx-check-export"
  summary: ClassVar[str] = ("refuse custom calls that are neither on JAX's stable list nor "
                            "registered hxmlir kernels (hxmlir.targets)")
  analysis: ClassVar[bool] = True
  allow_targets: str = field(default="", metadata={"separator": ";"})

  def apply(self, module: ir.Operation, diags: PassContext) -> PassResult:
    stable = targets.jax_stable_targets() | {t for t in self.allow_targets.split(";") if t}
    offenders: list[tuple[ir.Operation, str, str | None]] = []
    checked = 0
    for op in ops.ops_named(module, "stablehlo.custom_call"):
      checked += 1
      target = ir.StringAttr(op.attributes["call_target_name"]).value
      if target in stable:
        continue
      kernel_name = targets.kernel_name_of(op)
      if targets.lookup(target, kernel_name) is None:
        offenders.append((op, target, kernel_name))
    if offenders:
      diags.error(offenders[0][0], _message(offenders))
    return PassResult(changed=False, stats={"custom calls checked": checked})


def _describe(op: ir.Operation, target: str, kernel_name: str | None) -> str:
  where = locations.location_str(op.location)
  if kernel_name is None:
    return f"  {where}: custom call @{target} (no kernel name)"
  registered = [k for k in targets.registered_kernels() if k.target == target]
  known = (f"; registered on this target: {', '.join(k.ir_name for k in registered)}"
           if registered else "")
  return f"  {where}: custom call @{target}, kernel {kernel_name!r} is not registered{known}"


def _message(offenders) -> str:
  n = len(offenders)
  lines = [f"{n} custom call{'s are' if n > 1 else ' is'} not export-stable "
           "(neither on jax.export's stable list nor a registered hxmlir kernel):"]
  lines += [_describe(*o) for o in offenders]
  lines.append(
      "  to allow a kernel, register it with hxmlir.targets.register_kernel(target, name, "
      "version, platforms) and emit it as pallas_call(..., name=f'{name}_v{version}'); "
      "to accept a target unchecked, run hx-check-export{allow-targets=<target>}")
  return "\n".join(lines)
