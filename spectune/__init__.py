"""spectune: benchmark and tune speculative decoding (EAGLE num_steps per batch size) for LLM serving.

One installed import name, ``spectune``. The repository keeps the subsystems in top-level folders (``loadgen/``,
``backends/``, ``presets/``) that install as ``spectune.loadgen``, ``spectune.backends`` and ``spectune.presets``
(``[tool.setuptools] package-dir`` in pyproject.toml), so no other distribution's import names can collide with them.
Run from a source checkout (``PYTHONPATH=.`` or an editable install), the same names resolve because the checkout's
root is searched for this package's subpackages too; docs/architecture.md explains the layout.
"""

import os as _os

__version__ = "0.1.0"

_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(__path__[0], "loadgen")) and _os.path.isfile(
        _os.path.join(_ROOT, "loadgen", "__init__.py")):
    __path__.append(_ROOT)  # source checkout: loadgen/, backends/, presets/ beside spectune/
