""""Installed" means two things, named apart: the pass pipeline runs
(``install_state.is_installed``) and lowering rules emit hxmlir's kernels
(``install_state.use_kernels``). ``hx.install(kernels=False)`` / ``hx.installed(kernels=False)``
keeps the first and drops the second; the default keeps both, as before."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from numerics import assert_matmul_close

import hxmlir as hx
from hxmlir import install_state

CPU_KERNEL = hx.cpu_kernel_info()


def _operands():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((4, 512)).astype(np.float32)
  w = hx.quantize(rng.standard_normal((512, 256)).astype(np.float32))  # above SMALL_WEIGHT
  return x, w


def _lowered(x, w) -> str:
  return jax.jit(hx.matmul_q).lower(x, w).as_text()


def test_the_two_meanings_by_default_and_apart():
  assert not install_state.is_installed() and not install_state.use_kernels()
  with hx.installed():
    assert install_state.is_installed() and install_state.use_kernels()
  with hx.installed(kernels=False):
    assert install_state.is_installed() and not install_state.use_kernels()
  assert not install_state.is_installed()


@pytest.mark.skipif(not CPU_KERNEL.active, reason=CPU_KERNEL.reason)
def test_kernels_false_runs_the_pipeline_and_emits_the_reference():
  x, w = _operands()
  hx.stats(reset=True)
  with hx.installed():
    with_kernels = _lowered(x, w)
    y_kernel = jax.jit(hx.matmul_q)(x, w)
  with hx.installed(kernels=False):
    without = _lowered(x, w)
    y_ref = jax.jit(hx.matmul_q)(x, w)
  assert hx.stats()["total"]["modules"] == 4  # the pipeline ran on every lowering
  assert CPU_KERNEL.target in with_kernels
  assert "hx_matmul_q_cpu" not in without and 'stablehlo.composite "hx.matmul_q"' in without
  wf = np.asarray(hx.dequantize(w))
  assert_matmul_close(np.asarray(y_kernel), x, wf, extra=1)
  assert_matmul_close(np.asarray(y_ref), x, wf, extra=1)


def test_install_kernels_false_is_process_wide_and_undone():
  try:
    hx.install(kernels=False)
    assert install_state.is_installed() and not install_state.use_kernels()
    hx.install()
    assert install_state.use_kernels()
  finally:
    hx.uninstall()
  assert not install_state.is_installed() and not install_state.use_kernels()
