"""One process of a tensor-parallel LLaMA decoder run across processes (``jax.distributed``).

Start the same command once per process, with ``--process-id`` 0 .. N-1 (process 0 hosts
the coordinator)::

  python -m hxmlir.models.llama_dist --coordinator 127.0.0.1:12345 --num-processes 2 \\
      --process-id 0 --model smollm2 --prompt "The capital of France is" --max-tokens 8 &
  python -m hxmlir.models.llama_dist --coordinator 127.0.0.1:12345 --num-processes 2 \\
      --process-id 1 --model smollm2 --prompt "The capital of France is" --max-tokens 8

Each process makes ``--local-devices`` CPU devices (``jax_num_cpu_devices``, default 1),
joins the others with ``jax.distributed.initialize`` (the coordinator bound to the
``--coordinator`` address only; cross-process collectives on CPU by gloo,
``jax_cpu_collectives_implementation``, whose TCP pairs bind to this host name's
address), loads the GGUF file, and runs :class:`hxmlir.models.llama.Llama` with ``mesh=``
one axis ``"i"`` over every process's devices: the same SPMD program on each, the
weights placed by :func:`hxmlir.models.llama_sharding.shard_params`. Each process prints
one JSON line, ``{"process": i, "processes": N, "devices": D, "tokens": [...],
"text": "..."}``: the greedy tokens, the same on every process (the logits are
replicated).

Must run in a fresh process: the CPU device count and the collectives are fixed when
JAX's backend starts.
"""

from __future__ import annotations

import argparse
import json
import sys


def parse_args(argv=None) -> argparse.Namespace:
  """The command line of one process (``--help`` lists it); ``argv``: ``sys.argv[1:]``
  by default."""
  p = argparse.ArgumentParser(prog="python -m hxmlir.models.llama_dist",
                              description=__doc__.split("\n\n")[0])
  p.add_argument("--coordinator", required=True, metavar="HOST:PORT",
                 help="the coordinator's address, process 0 binds it (127.0.0.1:PORT on "
                 "one machine)")
  p.add_argument("--num-processes", type=int, required=True)
  p.add_argument("--process-id", type=int, required=True)
  p.add_argument("--local-devices", type=int, default=1,
                 help="CPU devices of this process (jax_num_cpu_devices)")
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument("--model", choices=("smollm2",))
  src.add_argument("--gguf", metavar="PATH")
  p.add_argument("--prompt", default=None, help="text (encoded with the file's tokenizer)")
  p.add_argument("--prompt-ids", default=None, help="comma-separated token ids")
  p.add_argument("--max-tokens", type=int, default=8)
  p.add_argument("--max-context", type=int, default=64)
  p.add_argument("--layers", type=int, default=None,
                 help="run only the file's first N blocks (a shorter program over the same "
                 "weights, for tests); default: all")
  p.add_argument("--timeout", type=int, default=60,
                 help="seconds to wait for the other processes to join")
  return p.parse_args(argv)


def main(argv=None) -> int:
  """One process of a ``jax.distributed`` run of the decoder: joins the coordinator
  (127.0.0.1 in the tests), builds the model on the mesh of every process's devices,
  generates and prints its tokens as one JSON line. Returns the exit status."""
  args = parse_args(argv)
  import jax
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", args.local_devices)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=args.coordinator,
                             num_processes=args.num_processes, process_id=args.process_id,
                             coordinator_bind_address=args.coordinator,
                             cluster_detection_method="deactivate",
                             initialization_timeout=args.timeout)
  try:
    mesh = jax.make_mesh((jax.device_count(),), ("i",))
    m = load(args.model, args.gguf, args.max_context, mesh, args.layers)
    prompt = [int(t) for t in args.prompt_ids.split(",")] if args.prompt_ids \
        else args.prompt
    tokens = list(m.generate(prompt, args.max_tokens))
    print(json.dumps({"process": jax.process_index(), "processes": jax.process_count(),
                      "devices": jax.device_count(), "tokens": tokens,
                      "text": m.tokenizer.decode(tokens)}), flush=True)
  finally:
    jax.distributed.shutdown()
  return 0


def load(model: str | None, path: str | None, max_context: int, mesh, layers: int | None):
  """The decoder of ``--model``/``--gguf`` on ``mesh``; with ``layers``, of the file's first
  ``layers`` blocks only (only their tensors are read; :func:`hxmlir.models.llama.params_of`
  takes ``config.layers`` blocks)."""
  from hxmlir import gguf
  from hxmlir.models import arch, llama, params, runtime
  path = llama.smollm2_path() if model else path
  if layers is None:
    return llama.Llama.from_gguf(path, max_context=max_context, mesh=mesh)
  header = gguf.read_header(path)  # the header once (its token lists take seconds)
  shapes = {t.name: tuple(int(d) for d in reversed(t.shape.tolist()))
            for t in header.reader.tensors}
  cfg = arch.describe(header.metadata, shapes, path).first_layers(layers)
  ck = gguf.load(header, names=params.tensor_names(cfg))
  m = llama.Llama(cfg, params.params_of(ck, cfg), max_context=max_context,
                  metadata=ck.metadata, path=path, mesh=mesh)
  m.tokenizer = runtime._tokenizer(ck.metadata)
  return m

if __name__ == "__main__":
  sys.exit(main())
