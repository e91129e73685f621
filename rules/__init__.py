"""ddpdoctor's built-in diagnosis rules: one ``<name>.toml`` file per rule.

This folder is installed as the data package ``ddpdoctor._builtin_rules`` (see ``[tool.setuptools]`` in
pyproject.toml); the file format is described in ``ddpdoctor/diagnosis/rules.py``. This ``__init__.py`` only makes
the folder a regular package so that editable installs and wheels can locate it with ``importlib.resources``.
"""
