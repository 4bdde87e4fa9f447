"""The integration floor: how hxmlir hooks into JAX's pipeline.

``install_state`` (what is installed, a JAX config state every layer may read),
``installation`` (``hx.install`` / ``uninstall`` / ``installed`` / ``stats``: the pass
pipeline in JAX's lowering hook) and ``dispatch`` (``hx.jit``). Export is its own public
package, :mod:`hxmlir.export`.
"""
