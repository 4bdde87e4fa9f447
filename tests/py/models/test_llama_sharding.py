"""hxmlir.models.llama tensor-parallel (``mesh=``) on 2 and 4 host CPU devices, and across 2
processes with ``jax.distributed``: the same greedy tokens as one device.

Compilation dominates these tests, so the decoder is SmolLM2's first :data:`LAYERS` blocks
(the file's weights and formats, every kind of weight and the tied head; a shorter
program): loaded once per module, placed on each mesh from the same arrays. conftest.py
makes 8 host CPU devices; a mesh takes the first 2 or 4. The 2-process test starts
``python -m hxmlir.models.llama_dist`` twice (one CPU device each), on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from smollm2_reference import PATH, needs_model

from hxmlir.models import llama, llama_dist
from hxmlir.models import llama_sharding as ls

pytest.importorskip("gguf")

pytestmark = needs_model

LAYERS = 4
MAX_CONTEXT = 32
TOKENS = 4


def _mesh(n: int):
  if jax.device_count() < n:
    pytest.skip(f"needs {n} devices (XLA_FLAGS=--xla_force_host_platform_device_count={n})")
  return jax.make_mesh((n,), ("i",), devices=jax.devices()[:n])


@pytest.fixture(scope="module")
def one():
  """The truncated decoder on one device, and its prompt."""
  m = llama_dist.load(None, PATH, MAX_CONTEXT, None, LAYERS)
  return m, m.tokenizer.encode("The capital of France is")


@pytest.fixture(scope="module")
def want(one):
  m, prompt = one
  return list(m.generate(prompt, TOKENS))


@pytest.fixture(scope="module")
def on_mesh(one):
  """``on_mesh(n)``: the truncated decoder on the first ``n`` devices, made once per ``n``."""
  models = {}

  def get(n):
    if n not in models:
      models[n] = llama.Llama(one[0].config, one[0].params, max_context=MAX_CONTEXT,
                              mesh=_mesh(n))
    return models[n]
  return get


def _spec(v):
  """The spec of an array or of a quantized value's values, without trailing ``None``."""
  parts = list((v.qvalue if hasattr(v, "qvalue") else v).sharding.spec)
  while parts and parts[-1] is None:
    parts.pop()
  return P(*parts)


@pytest.mark.parametrize("n", [2, 4])
def test_mesh_gives_one_devices_greedy_tokens(one, want, on_mesh, n):
  m = on_mesh(n)
  layer = m.params["layers"][0]
  assert {k: _spec(v) for k, v in layer.items()} == {
      "qkv": P("i"), "gate_up": P("i"), "down": P(None, "i"),  # fused along out (params_of)
      # in = 576: 18 groups of 32 split 2 ways, not 4
      "o": P(None, "i") if n == 2 else P(), "attn_norm": P(), "ffn_norm": P()}
  assert _spec(m.params["embed"]) == P("i") and _spec(m.params["norm"]) == P()
  # group scales and offsets split with the groups
  assert layer["down"].scale.sharding.spec == layer["down"].offset.sharding.spec == P(None, "i")
  assert layer["down"].scale.addressable_shards[0].data.shape == (576, 48 // n)
  got = list(m.generate(one[1], TOKENS))
  assert got == want
  k, v = m.new_cache()
  # 3 KV heads: split along positions (keys [kv, C, d], f32 values [kv, d, C])
  assert {a.sharding.spec for a in k} == {P(None, "i", None)}
  assert {a.sharding.spec for a in v} == {P(None, None, "i")}
  assert m.traces["greedy_step"] == m.traces["prefill"] == 1


def test_decode_step_runs_each_composite_on_its_shard(on_mesh):
  m = on_mesh(2)
  k, v = m.new_cache()
  text = m._step.lower(m.params, np.asarray([1], np.int32), np.int32(3), k, v).as_text()
  # the arguments carry the placement: the Q8_0 table along the vocabulary
  assert re.search(r'%arg0: tensor<49152x576xi8> \{sdy\.sharding = #sdy\.sharding<@mesh, '
                   r'\[\{"i"\}, \{\}\]>\}', text)
  # every hx.matmul_q runs inside a manual computation on its shard: 4 per block (qkv and
  # gate_up fused, o, down), the head
  comps = re.findall(r'sdy\.manual_computation\((.*)\n\s*%\S+ = stablehlo\.composite '
                     r'"hx\.matmul_q"', text)
  assert len(comps) == text.count('stablehlo.composite "hx.matmul_q"') == 4 * LAYERS + 1
  col = (r'in_shardings=\[<@mesh, \[\{\}, \{\}\]>(, <@mesh, \[\{"i"\}, \{\}\]>){2,3}\] '
         r'out_shardings=\[<@mesh, \[\{\}, \{"i"\}\]>\] manual_axes=\{"i"\} ')
  row = (r'in_shardings=\[(<@mesh, \[\{\}, \{"i"\}\]>(, )?){4}\] '
         r'out_shardings=\[<@mesh, \[\{\}, \{\}\]>\] manual_axes=\{"i"\} ')
  # qkv (u4o[960,576]: 480 rows of 288 packed bytes per device), o (576 rows of 144)
  local = r'.*: tensor<{}>, %\S+: tensor<{}>'
  assert any(re.search(col + local.format("480x288xui8", "480x18xf16"), c) for c in comps)
  assert any(re.search(row + local.format("576x144xui8", "576x9xf16"), c) for c in comps)
  assert any(re.search(col + local.format("24576x576xi8", "24576x18xf16"), c)
             for c in comps)  # the tied head: half the vocabulary per device
  assert sum(bool(re.search(row, c)) for c in comps) == 2 * LAYERS  # o and down
  # compiled, the step moves activations only: every collective's result is at most a row
  # of logits (49152); the smallest weight, o, has 576 x 576 elements. The partitioner
  # left alone with the composites' blocked loops all-gathers every weight instead.
  hlo = m._step.lower(m.params, np.asarray([1], np.int32), np.int32(3), k, v).compile(
      ).as_text()
  moved = re.findall(r"= \w+\[([\d,]*)\]\S* (?:all-gather|all-reduce|collective-permute|"
                     r"all-to-all|reduce-scatter)(?:-start)?\(", hlo)
  assert moved and max(int(np.prod([int(d) for d in m_.split(",") if d])) for m_ in moved) \
      <= m.config.vocab, moved


def test_placement_on_8_devices_and_other_head_counts(one):
  m, _ = one
  mesh8 = _mesh(8)
  s = ls.param_shardings(m.params, mesh8)
  layer = {k: v.spec for k, v in s["layers"][0].items()}
  assert layer["o"] == P()  # 18 groups of 32 do not split 8 ways: replicated
  assert layer["down"] == P(None, "i")  # 48 groups: 6 per device
  assert layer["qkv"] == layer["gate_up"] == P("i", None) and s["embed"].spec == P("i", None)
  assert ls.cache_spec(3, 32, mesh8) == P(None, "i", None)
  assert ls.cache_spec(3, 32, mesh8, "kdc") == P(None, None, "i")
  assert ls.cache_spec(3, 30, mesh8) == P()  # neither heads nor positions split 8 ways
  assert ls.cache_spec(3, 32, _mesh(3)) == P("i", None, None)  # one KV head each
  assert ls.cache_spec(3, 32, _mesh(3), "kdc") == P("i", None, None)
  with pytest.raises(ValueError, match="layout='ckd': expected 'kcd' or 'kdc'"):
    ls.cache_spec(3, 32, _mesh(3), "ckd")


def test_placing_a_weight_by_hand_across_a_group_is_a_type_error(one):
  m, _ = one
  with pytest.raises(TypeError, match=re.escape(
      "u4o[576,576:g32,f16] sharded over mesh axis 'i'=8: 18 groups of 32 cannot be "
      "split 8 ways (a shard would split a group)")):
    jax.device_put(m.params["layers"][0]["o"], NamedSharding(_mesh(8), P(None, "i")))


def test_mesh_must_have_one_axis():
  _mesh(4)  # skips without 4 devices
  with pytest.raises(ValueError, match=r"mesh= takes a mesh of one axis, got axes \('i', 'j'\)"):
    ls.auto_mesh(jax.make_mesh((2, 2), ("i", "j"), devices=jax.devices()[:4]))
  with pytest.raises(TypeError, match=r"mesh= takes a jax\.sharding\.Mesh .*, got list"):
    ls.auto_mesh(jax.devices()[:2])


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_give_one_devices_greedy_tokens(one, want):
  # gloo's TCP pairs bind to the address of this host's name: loopback only, or skip
  if not socket.gethostbyname(socket.gethostname()).startswith("127."):
    pytest.skip("this host's name does not resolve to a loopback address (gloo binds it)")
  port = _free_port()
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device each
  env["JAX_PLATFORMS"] = "cpu"
  cmd = [sys.executable, "-m", "hxmlir.models.llama_dist", "--coordinator",
         f"127.0.0.1:{port}", "--num-processes", "2", "--gguf", PATH, "--prompt-ids",
         ",".join(map(str, one[1])), "--max-tokens", str(TOKENS), "--max-context",
         str(MAX_CONTEXT), "--layers", str(LAYERS), "--timeout", "120"]
  procs = [subprocess.Popen([*cmd, "--process-id", str(i)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
           for i in range(2)]
  outs, deadline = [], time.monotonic() + 420  # both processes, together
  try:
    for p in procs:
      outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.communicate()
  for i, (p, (out, err)) in enumerate(zip(procs, outs)):
    assert p.returncode == 0, f"process {i}: exit {p.returncode}\n{err[-3000:]}"
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert lines == [{"process": i, "processes": 2, "devices": 2, "tokens": want,
                      "text": one[0].tokenizer.decode(want)}], out
