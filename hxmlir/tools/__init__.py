"""The tools' floor: the command-line programs and what only they use.

``cli`` (``hxmlir``: lower, export, run, inspect, demo, generate), ``opt`` (``hxmlir-opt``,
the lit tool) with ``expectations`` (its ``--verify-diagnostics``), ``demo`` and
``report`` (``hxmlir demo``), ``artifact_info`` (``hxmlir inspect``), ``npzio`` (the npz
files of inputs and outputs), ``generate_cli`` (``hxmlir generate``). Nothing below
imports this package.
"""
