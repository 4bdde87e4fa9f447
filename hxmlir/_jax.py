"""The one module that imports JAX's private API (``jax._src``).

Every other hxmlir module reaches private JAX through the names re-exported
here, so a JAX upgrade touches this file alone. Names are grouped by the part of
hxmlir that needs them. Pinned to the JAX 0.10.x line.
"""

from jax._src import core as core
from jax._src.hijax import MappingSpec as MappingSpec

# --- hi types: mapping helpers for component types (vmap / scan) ------------
mapped_aval = core.mapped_aval
unmapped_aval = core.unmapped_aval


# --- lowering: lo primitives --------------------------------------------------
from jax._src import dispatch as _dispatch  # noqa: E402

apply_primitive = _dispatch.apply_primitive
