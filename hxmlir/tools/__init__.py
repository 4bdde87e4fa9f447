"""The tools' floor: the command-line programs and what only they use.

``cli`` (``hxmlir``: its parser and dispatch) with one module per subcommand:
``lower_cli`` (``hxmlir lower``, ``hxmlir export``), ``run_cli`` (``hxmlir run``),
``inspect_cli`` (``hxmlir inspect``), ``generate_cli`` (``hxmlir generate``),
``finetune_cli`` (``hxmlir finetune``), and ``cli_common`` (what they share); ``opt``
(``hxmlir-opt``, the lit tool) with ``expectations`` (its ``--verify-diagnostics``), ``demo``
and ``report`` (``hxmlir demo``), ``artifact_info`` (``hxmlir inspect``), ``npzio`` (the npz
files of inputs and outputs). Nothing below imports this package.
"""
