"""The types' floor: hi types, their hi primitives and their typing rules.

``qarray`` (``q8[m,n]`` and every format of :mod:`hxmlir.formats`), ``rank1``
(``r1[m,n]``), ``tuples`` (``Tup{...}``) on the base of ``hiprim``; the arithmetic
their typing rules share (``shardings``, ``dotdims``); hi functions over them
(``einsum``, ``gather``); how JAX's own APIs take hi values (``control_flow``,
``jax_apis``: the rules the seam installs); the
type descriptors artifacts embed (``typedesc``) and the type grammar of type strings
(``typestr``). Imports only the floor below it: :mod:`hxmlir._jax`, :mod:`hxmlir.formats`, and
:mod:`hxmlir.pallas` (public, beside it: hi values in Pallas kernels).
"""
