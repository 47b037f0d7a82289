"""spectune: benchmark and tune speculative decoding (EAGLE num_steps per batch size) for LLM serving.

One installed import name, ``spectune``. The repository keeps the subsystems in top-level folders (``loadgen/``,
``backends/``, ``presets/``) that install as ``spectune.loadgen``, ``spectune.backends`` and ``spectune.presets``
(``[tool.setuptools] package-dir`` in pyproject.toml), so no other distribution's import names can collide with them.
A source checkout is used through an editable install (``pip install -e .``), whose import finder maps the same
names onto the folders; docs/architecture.md explains the layout.
"""

__version__ = "0.1.0"
