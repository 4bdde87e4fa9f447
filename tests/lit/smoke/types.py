# RUN: %python %s | filecheck %s
# Hi types print as their JAX types and appear as single values in jaxprs.
import jax
import jax.numpy as jnp

import hxmlir as hx

x = jnp.array([[1.0, 2.0, 3.0], [4.0, -5.0, 6.0]], "float32")
print(jax.typeof(hx.quantize(x)))
# CHECK: q8[2,3]
print(jax.jit(lambda x: hx.dequantize(hx.quantize(x))).trace(x).jaxpr)
# CHECK: { lambda ; [[X:.*]]:f32[2,3]. let
# CHECK-NEXT: [[Q:.*]]:q8[2,3] = call_hi_primitive[
# CHECK-NEXT: _prim=Quantize[{'fmt': 'int8', 'group_size': None, 'method': 'absmax'}]
# CHECK-NEXT: ] [[X]]
# CHECK-NEXT: {{.*}}:f32[2,3] = call_hi_primitive[_prim=Dequantize[{}]] [[Q]]
print(jax.typeof(hx.quantize(jnp.ones((4, 64)), jnp.int4, group_size=32)))
# CHECK: q4[4,64:g32]
print(jax.typeof(hx.quantize(jnp.ones((4, 64)), jnp.float8_e4m3fn)))
# CHECK: f8[4,64]
print(jax.typeof(hx.quantize(jnp.ones((4, 64)), jnp.int8, group_size=16)))
# CHECK: q8[4,64:g16]
print(jax.typeof(hx.outer(jnp.ones(6, "float32"), jnp.ones(5, "float32"))))
# CHECK: r1[6,5]
print(jax.typeof(hx.make_tup(jnp.arange(3.0), 5.0)))
# CHECK: Tup{f32[3],f32[]}
