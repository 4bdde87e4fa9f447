"""Hi types inside Pallas kernels: what ``pl.pallas_call`` asks of ``q8``, ``r1`` and ``Tup``.

JAX 0.10.2's ``pallas_call`` takes hi-typed operands and results
(``_pallas_call_to_lojax`` in ``jax/_src/pallas/pallas_call.py``): each hi
operand becomes its lo components, each ``BlockSpec`` -- written over the
value's dense shape, as a user thinks of a weight -- is lowered per component
by the type's ``lower_block_spec``, and inside the kernel a ref of a hi type is
read (``ref[...]``, ``ref[0:8, :]``) and written (``ref[...] = v``) as hi
values through the type's ``ref_get_*``/``ref_swap_*`` methods, which apply the
index to each component. The protocol is JAX's (its ``PallasHiJaxTest`` toy
types implement the same methods); this module holds the logic the hi types
share, described per type by

* ``components``: for each lo component (in ``lo_ty`` order), the dense axes
  it has, in order. ``q8[*l, n]``: values all axes, scale ``*l`` (one scale
  per row). ``r1[*b, m, n]``: ``col`` ``(*b, m)``, ``row`` ``(*b, n)``.
* ``structural``: dense axes a component lacks. An index may slice them (a
  slice of a row keeps the row's scale) but not pick one element (that would
  leave no ``q8``), and a write must cover them whole (writing half a row with
  its own scale would rescale the other half).
* ``divisors``: per component, dense elements per stored entry along the last
  axis (``q4``'s values: 2, a pair per byte; a grouped scale: ``g``; else 1).
* ``group`` and ``pack``: elements per scale (``None``: one per row) and per
  stored value. A block or slice along the last axis must hold whole groups and
  whole packed bytes (:func:`check_whole_groups`, :func:`check_index`): its
  component blocks and indices are the dense ones divided by the divisor.

Every format of :data:`hxmlir.formats.FORMATS` and group size is an operand and a
result (``q8``, ``q4`` int4 pairs, ``f8``, f16 scales; per row or per group); a
format with an offset (``u4o``, ``q8o``) has a third component blocked exactly
like the scale.

The kernel-side form. Inside ``pl.pallas_call`` each hi operand and result
travels as its *kernel form* (:func:`kernel_form`): the same components, each
with the dense rank, unit dims on the dense axes it lacks (a ``q8[m, n]``'s
per-row scale is ``f32[m, 1]``, an ``r1[m, n]``'s factors ``f32[m, 1]`` and
``f32[1, n]``). So every block has the array's rank and the last two dims
Mosaic tiles, and a kernel lowers for TPU from any machine (Pallas reads the
tiling of 1-D blocks from the local TPU). The form is a type of its own (a
subclass of the value's, :func:`kernel_form`) for operands, results and refs
only: a value read from a ref is the ordinary type (``ref[...]`` of a ``q8`` ref is a ``q8`` with scale
``f32[m]``), and the hook in the JAX seam
(:func:`hxmlir._jax.install_pallas_operand_forms`) reshapes operands into the
form before the call and results back after it.

Each component's block takes the dense block's entries on its axes and the
index map's block indices on those axes: the scale's block follows the rows.
Inside kernels hxmlir's lo primitives lower as their reference semantics
(:func:`use_in_kernels`, called here when a hi type first meets
``pallas_call``).

By concept: :mod:`hxmlir.pallas.blocks` (block specs and indices over the dense shape),
:mod:`hxmlir.pallas.forms` (the kernel-side form), :mod:`hxmlir.pallas.protocol` (the
methods JAX's Pallas calls, for array-like hi types and for ``Tup``).
"""

from hxmlir import _jax
from hxmlir.pallas.blocks import array_name as array_name
from hxmlir.pallas.blocks import check_index as check_index
from hxmlir.pallas.blocks import check_whole_groups as check_whole_groups
from hxmlir.pallas.blocks import component_block_specs as component_block_specs
from hxmlir.pallas.blocks import note_block_of as note_block_of
from hxmlir.pallas.blocks import split_transforms as split_transforms
from hxmlir.pallas.forms import KernelFormValue as KernelFormValue
from hxmlir.pallas.forms import from_kernel_form as from_kernel_form
from hxmlir.pallas.forms import has_kernel_form as has_kernel_form
from hxmlir.pallas.forms import is_kernel_form as is_kernel_form
from hxmlir.pallas.forms import kernel_form as kernel_form
from hxmlir.pallas.forms import to_kernel_form as to_kernel_form
from hxmlir.pallas.forms import use_in_kernels as use_in_kernels
from hxmlir.pallas.forms import value_type as value_type
from hxmlir.pallas.protocol import check_write as check_write
from hxmlir.pallas.protocol import register_tuple_type as register_tuple_type
from hxmlir.pallas.protocol import register_type as register_type

_jax.install_ref_write_check(check_write)
