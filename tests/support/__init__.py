"""Shared test helpers, imported as a package (`from support.hf_reference import ...`): the
`tests` folder is on the import path through pytest's `pythonpath` setting in pyproject.toml."""
