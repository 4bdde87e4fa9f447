"""The helpers the passes share, under the name they had before they were split by concept.

New code imports the module of the concept: :mod:`hxmlir.passes.parsing`
(contexts, parsing, bytecode, the parse guard), :mod:`hxmlir.passes.locations`
(``file:line:col`` strings), :mod:`hxmlir.passes.ops` (walking, the op index,
attributes, ``hx.*`` composites), :mod:`hxmlir.passes.symbols` (functions and
symbol references) and :mod:`hxmlir.passes.shardings` (reading Shardy
shardings). This module re-exports them for callers outside ``passes/``
(``hxmlir.installation``, ``hxmlir.demo``).
"""

from jaxlib.mlir import ir as ir

from hxmlir.passes.locations import location_str as location_str
from hxmlir.passes.ops import attr_or_none as attr_or_none
from hxmlir.passes.ops import composite_name as composite_name
from hxmlir.passes.ops import has_hx_ops as has_hx_ops
from hxmlir.passes.ops import hx_composites as hx_composites
from hxmlir.passes.ops import invalidate_op_index as invalidate_op_index
from hxmlir.passes.ops import is_hx_composite as is_hx_composite
from hxmlir.passes.ops import op_index_scope as op_index_scope
from hxmlir.passes.ops import ops_named as ops_named
from hxmlir.passes.ops import tensor_type as tensor_type
from hxmlir.passes.ops import walk as walk
from hxmlir.passes.parsing import is_bytecode as is_bytecode
from hxmlir.passes.parsing import make_context as make_context
from hxmlir.passes.parsing import parse_module as parse_module
from hxmlir.passes.shardings import as_per_value as as_per_value
from hxmlir.passes.shardings import as_tensor_sharding as as_tensor_sharding
from hxmlir.passes.shardings import dim_sharding as dim_sharding
from hxmlir.passes.shardings import may_have_shardings as may_have_shardings
from hxmlir.passes.shardings import result_sharding_attr as result_sharding_attr
from hxmlir.passes.shardings import value_sharding as value_sharding
from hxmlir.passes.shardings import value_sharding_attr as value_sharding_attr
from hxmlir.passes.symbols import enclosing_func as enclosing_func
from hxmlir.passes.symbols import enclosing_module as enclosing_module
from hxmlir.passes.symbols import erase_unused_functions as erase_unused_functions
from hxmlir.passes.symbols import func_name as func_name
from hxmlir.passes.symbols import func_ops as func_ops
from hxmlir.passes.symbols import scope_funcs as scope_funcs
from hxmlir.passes.symbols import symbol_ref as symbol_ref
from hxmlir.passes.symbols import symbol_uses as symbol_uses
