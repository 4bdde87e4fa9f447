# RUN: %python %s | filecheck %s
# hxmlir.export embeds the hi signature (and, with vjp_order=1, the VJP artifact)
# as attributes of the serialized StableHLO module: a plain jax.export.deserialize
# reads them back, and the module still holds the hx.* composites.
import jax
import jax.numpy as jnp

import hxmlir as hx
import hxmlir.export as hxe

x = jnp.ones((2, 3), "float32")
qw = hx.quantize(jnp.arange(12.0, dtype="float32").reshape(3, 4))
exp = hxe.export(jax.jit(hx.matmul_q), platforms=("cpu", "cuda", "tpu"))(x, qw)
print("TEST: signature", exp.signature())
# CHECK-LABEL: TEST: signature (f32[2,3], q8[3,4]) -> (f32[2,4])
module = jax.export.deserialize(exp.serialize(vjp_order=1)).mlir_module()
print(module)
# CHECK: module @jit_matmul_q attributes {hx.signature = "{\22format\22: 2, \22fun_name\22: \22matmul_q\22, \22hxmlir\22: \22{{[0-9.]+}}\22, \22in\22: [{\22dtype\22: \22float32\22, \22shape\22: [2, 3], {{.*}}\22type\22: \22array\22, \22v\22: 1}, {\22shape\22: [3, 4], {{.*}}\22type\22: \22q8\22, \22v\22: 1}]
# CHECK-SAME: \22out\22: [{\22dtype\22: \22float32\22, \22shape\22: [2, 4], {{.*}}\22type\22: \22array\22, \22v\22: 1}]
# CHECK-SAME: hx.vjp = "{{[A-Za-z0-9+/=]+}}"
# CHECK: stablehlo.composite "hx.matmul_q"
