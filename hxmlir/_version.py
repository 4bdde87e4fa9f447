"""hxmlir's version: the one place it is written.

Read by packaging (``pyproject.toml``: ``[tool.setuptools.dynamic]``) and by
``hxmlir.__version__``; artifacts record it (``hxmlir.export``). Bump it with every release
and every new composite or kernel version, with an entry in CHANGELOG.md.
"""

__version__ = "0.8.9"
