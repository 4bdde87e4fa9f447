"""pytest setup: 8 host CPU devices for the sharding tests, set before JAX is imported,
and the ``mesh`` / ``on_mesh`` fixtures those tests share."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (after the environment above)
import pytest  # noqa: E402
from jax.sharding import AxisType  # noqa: E402


@pytest.fixture(scope="session")
def mesh():
  """The 4 x 2 mesh ``("i", "j")`` with explicit axes; skips without 8 devices."""
  if jax.device_count() < 8:
    pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
  return jax.make_mesh((4, 2), ("i", "j"), axis_types=(AxisType.Explicit, AxisType.Explicit))


@pytest.fixture
def on_mesh(mesh):
  """``mesh``, set as the current mesh (``jax.set_mesh``) for the test."""
  with jax.set_mesh(mesh):
    yield mesh
