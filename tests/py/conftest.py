"""pytest setup: 8 host CPU devices for the sharding tests, set before JAX is imported,
and the fixtures the test modules share (meshes, example operands, a clean install
state). Shared helper functions live in ``hx_testing.py``."""

import os
import pathlib
import re

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (after the environment above)
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import AxisType  # noqa: E402


def _explicit_mesh(shape):
  if jax.device_count() < 8:
    pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
  return jax.make_mesh(shape, ("i", "j"), axis_types=(AxisType.Explicit, AxisType.Explicit))


@pytest.fixture(scope="session")
def mesh():
  """The 4 x 2 mesh ``("i", "j")`` with explicit axes; skips without 8 devices."""
  return _explicit_mesh((4, 2))


@pytest.fixture(scope="session")
def mesh_2x4():
  """The 2 x 4 mesh ``("i", "j")`` with explicit axes; skips without 8 devices."""
  return _explicit_mesh((2, 4))


@pytest.fixture
def on_mesh(mesh):
  """``mesh``, set as the current mesh (``jax.set_mesh``) for the test."""
  with jax.set_mesh(mesh):
    yield mesh


@pytest.fixture
def x():
  """``f32[2,3]`` with a negative entry."""
  return jnp.array([[1., 2., 3.], [4., -5., 6.]], jnp.float32)


@pytest.fixture
def uninstalled():
  """hxmlir uninstalled, with fresh ``hx.stats()``, before and after the test."""
  import hxmlir as hx
  hx.uninstall()
  hx.stats(reset=True)
  yield
  hx.uninstall()


REQUIRE_NATIVE_ENV = "HXMLIR_REQUIRE_NATIVE"
"""Set to 1 (CI: scripts/test.sh under ``CI``): a test skipped because the native CPU kernel
is inactive fails instead, so a machine whose extension did not build cannot pass."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """Under ``HXMLIR_REQUIRE_NATIVE=1`` a skip whose reason names the native kernel (``native
  kernel inactive: ...``, ``native kernel disabled by the environment``) is a failure."""
  outcome = yield
  report = outcome.get_result()
  if not report.skipped or os.environ.get(REQUIRE_NATIVE_ENV, "") in ("", "0"):
    return
  reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr)
  reason = reason.removeprefix("Skipped: ")
  if "native" in reason.lower():
    report.outcome = "failed"
    report.longrepr = (f"{REQUIRE_NATIVE_ENV}=1 and this test was skipped: {reason} (build the "
                       "extension: pip install -e . or python setup.py build_ext --inplace)")
# --- the fast tier: `scripts/test.sh --fast` runs `pytest -m "not slow"` ------------------
# Marked here, in one place, rather than in each module (pyproject.toml registers the
# marker). Slow: what compiles a real model (SmolLM2's 30 layers, all-MiniLM-L6-v2) or runs
# the whole demo, and the test functions of tests/py/slow_tests.txt (a case measured >= 0.5 s).
SLOW_MODULES = {"test_llama.py", "test_llama_cache_export.py", "test_llama_sharding.py",
                "test_minilm.py"}
SLOW_FIXTURES = {"test_demo.py": {"run", "format_run"}}
SLOW_WORDS = ("smollm2", "minilm")  # in a test's name or parameters: it loads the real model
# and the functions measured slow in a full run (scripts/slow_tests.py writes the list)
SLOW_TESTS = frozenset(
    line.split("#")[0].strip() for line in
    (pathlib.Path(__file__).parent / "slow_tests.txt").read_text().splitlines()) - {""}


def _is_slow(item) -> bool:
  name = item.path.name
  if name in SLOW_MODULES or re.sub(r"\[.*", "", item.nodeid, flags=re.S) in SLOW_TESTS:
    return True
  if SLOW_FIXTURES.get(name, set()) & set(getattr(item, "fixturenames", ())):
    return True
  words = (item.originalname or item.name).lower()
  if hasattr(item, "callspec"):
    words += " " + item.callspec.id.lower()
  return any(w in words for w in SLOW_WORDS) and "missing" not in words


def pytest_collection_modifyitems(config, items):
  for item in items:
    if _is_slow(item):
      item.add_marker(pytest.mark.slow)
