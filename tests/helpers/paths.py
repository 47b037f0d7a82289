"""Where things are: the repository root, the test fixtures, the fake server program and the docs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root."""
TESTS = ROOT / "tests"
FIXTURES = TESTS / "fixtures"
"""Recorded engine pages (/metrics, /server_info...) the backend tests parse."""
FAKE_SERVER = TESTS / "helpers" / "fake_server.py"
"""The fake server as a program (``python FAKE_SERVER --port P ...``), what launch-mode tests start."""
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
