"""The integration floor: how hxmlir hooks into JAX's pipeline.

``installation`` (``hx.install`` / ``uninstall`` / ``installed`` / ``stats``: the pass
pipeline in JAX's lowering hook, the kernels' allow-list for ``jax.export``) and
``dispatch`` (``hx.jit``). What is installed is :mod:`hxmlir.install_state`, on the
bottom floor because lowering rules read it. Export is its own public package,
:mod:`hxmlir.export`.
"""
