"""Builds hxmlir's native CPU kernel for ``hx.matmul_q`` (``hxmlir._matmul_q_cpu``) and
finds the packages.

Everything else about the package is declared in ``pyproject.toml``; this file
adds the C++ extension, which setuptools compiles during ``pip install`` (no
CMake), and the package list: every package under each source root of
:data:`PACKAGE_ROOTS` (``hxmlir/``, and ``lowering/``, ``passes/`` installed as
``hxmlir.lowering``, ``hxmlir.passes``), found by setuptools rather than listed by
hand, so a sub-package added later is in the wheel too (``pyproject.toml``'s
``packages.find`` cannot map a folder to another package name). The XLA FFI
headers it needs are vendored under ``csrc/third_party/xla`` (header-only,
Apache 2.0), so the build needs no jaxlib.

Runtime CPU dispatch: the block kernels (``csrc/matmul_q_kernels.inc`` for
``hx_matmul_q_cpu_v1``, ``csrc/matmul_q_formats.inc`` for every format, ``_v2``; ``csrc/matmul_q_nk.inc`` for
the ``[out, in]`` layout, ``_v3``; ``csrc/matmul_q_i8x.inc`` for its integer-activation
variant ``hx_matmul_q_cpu_i8x_v1``, with an AVX-512 VNNI copy, and ``csrc/matmul_q_i8x_blocks.inc``
for GGUF's block formats', ``hx_matmul_q_cpu_i8x_v2``, in the same units; ``csrc/attention.inc`` for
``hx.attention``'s ``hx_attention_cpu_v1``) are
compiled once per ISA, each translation unit with its own ``-m`` flags
(AVX-512, AVX2 + FMA + F16C on x86-64; a portable copy everywhere), and the module
picks one at run time with ``__builtin_cpu_supports``. The extension is
``optional``: if it fails to build, ``pip install`` still succeeds and hxmlir
falls back to its StableHLO lowering (``hxmlir.cpu_kernel_info()`` says so).
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

from setuptools import Extension, find_namespace_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

# Installed package name -> its source folder. Sub-packages follow their folders.
PACKAGE_ROOTS = {"hxmlir": "hxmlir", "hxmlir.lowering": "lowering", "hxmlir.passes": "passes"}


def find_packages() -> list[str]:
  """Every package under each root of :data:`PACKAGE_ROOTS`, under its installed name: each
  folder below a root (with or without ``__init__.py``; ``__pycache__`` excluded) is one."""
  found = []
  for name, root in PACKAGE_ROOTS.items():
    subs = find_namespace_packages(root, exclude=("__pycache__", "*.__pycache__"))
    found += [name] + [f"{name}.{p}" for p in subs]
  return sorted(found)


X86 = platform.machine().lower() in ("x86_64", "amd64")
# -Wno-psabi: the decoders return 64-byte vectors from inline functions of one translation
# unit (never across a library boundary), so GCC's note that such a return's ABI differs
# without AVX-512 concerns no caller
COMMON = ["-std=c++20", "-O3", "-fno-math-errno", "-fvisibility=hidden", "-Wall", "-Wno-psabi"]
# Per-ISA translation units and the flags they (and only they) are compiled with.
ISA_SOURCES = {
    "csrc/matmul_q_avx512.cc": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                                "-mavx2", "-mfma", "-mprefer-vector-width=512"],
    "csrc/matmul_q_avx2.cc": ["-mavx2", "-mfma", "-mf16c"],
    "csrc/matmul_q_i8x_avx512vnni.cc": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni",
                                        "-mavx2", "-mfma", "-mprefer-vector-width=512"],
    "csrc/matmul_q_i8x_avx2.cc": ["-mavx2", "-mfma", "-mf16c"],
    # the transposed product of the [out, in] layout (csrc/matmul_q_nkt.inc)
    "csrc/matmul_q_nkt_avx512.cc": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                                    "-mavx2", "-mfma", "-mprefer-vector-width=512"],
    "csrc/matmul_q_nkt_avx2.cc": ["-mavx2", "-mfma", "-mf16c"],
    # hx.attention's kernels (csrc/attention.inc): vector extensions, a*b+c fused where the ISA has FMA
    "csrc/attention_avx512.cc": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2",
                                 "-mfma", "-mprefer-vector-width=512", "-ffp-contract=fast"],
    "csrc/attention_avx2.cc": ["-mavx2", "-mfma", "-ffp-contract=fast"],
} if X86 else {}
ISA_SOURCES["csrc/attention_generic.cc"] = ["-ffp-contract=fast"]


class BuildExt(build_ext):
  """``build_ext`` that compiles each ISA-specific source with its own flags first."""

  def build_extension(self, ext):
    if sys.platform == "win32" or self.compiler.compiler_type == "msvc":
      # a CompileError, which setuptools' handling of optional extensions turns into a
      # warning: pip install goes on without the kernel (hxmlir uses StableHLO instead)
      raise CompileError("hxmlir's CPU kernel builds with GCC or Clang only")
    objects = []
    for src, flags in ISA_SOURCES.items():
      objects += self.compiler.compile([src], output_dir=self.build_temp,
                                       include_dirs=ext.include_dirs, macros=ext.define_macros,
                                       extra_postargs=COMMON + flags, depends=ext.depends)
    ext.extra_objects = list(ext.extra_objects or []) + objects
    super().build_extension(ext)


setup(
    packages=find_packages(),
    package_dir=PACKAGE_ROOTS,
    ext_modules=[Extension(
        "hxmlir._matmul_q_cpu",
        sources=["csrc/matmul_q_ffi.cc", "csrc/matmul_q_formats_ffi.cc", "csrc/matmul_q_nk_ffi.cc",
                 "csrc/matmul_q_i8x_ffi.cc", "csrc/matmul_q_nkt_ffi.cc", "csrc/matmul_q_generic.cc",
                 "csrc/matmul_q_i8x_generic.cc", "csrc/matmul_q_nkt_generic.cc",
                 "csrc/attention_ffi.cc"],
        include_dirs=["csrc"],
        define_macros=[("HXMLIR_HAVE_X86_ISAS", "1")] if X86 else [],
        extra_compile_args=[*COMMON, "-isystem", "csrc/third_party"],
        depends=sorted(str(p) for p in Path("csrc").glob("**/*")
                       if p.suffix in (".h", ".inc") and "third_party" not in p.parts),
        language="c++",
        optional=True,
    )],
    cmdclass={"build_ext": BuildExt},
)
