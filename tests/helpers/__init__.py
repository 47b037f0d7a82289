"""Shared test helpers (``tests/`` is on pytest's ``pythonpath``): ``from helpers.web import serve_app``.

- :mod:`helpers.paths`: the repository's folders and the fixture files tests read.
- :mod:`helpers.web`: serve an in-test aiohttp app on a free port and get its URL.
- :mod:`helpers.fake_server`: a fake OpenAI-compatible speculative server (in process, or as a program).
- :mod:`helpers.engine`: the bundled engine's server in a thread or as a real subprocess.
- :mod:`helpers.tiny_models`: tiny random targets and heads for fast engine tests.
- :mod:`helpers.sglang_contract_probe`: runs SGLang's own code on spectune's configs (a separate process).
"""
