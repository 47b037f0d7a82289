"""BackendOptions: frozen, with each engine's own settings in its own record, and those records reaching only
their engine's command line."""

from __future__ import annotations

import dataclasses
import json

import pytest

from spectune.backends import make_backend
from spectune.backends.options import BackendOptions, BundledEngineOptions


def engine_options(options: BackendOptions) -> dict:
    """The options the bundled engine's server process is launched with (``--options`` JSON)."""
    argv = make_backend("local", options).build_argv(2, "127.0.0.1", 9)
    return json.loads(argv[argv.index("--options") + 1])


def test_backend_options_cannot_be_changed_in_place():
    options = BackendOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.max_concurrency = 8  # type: ignore[misc]


def test_an_engine_record_cannot_be_changed_in_place():
    options = BackendOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.local.dtype = "float32"  # type: ignore[misc]


def test_the_bundled_engine_runs_the_compute_path_of_its_record():
    options = BackendOptions(local=BundledEngineOptions(dtype="float32", device="cpu", compile="off"))
    assert (engine_options(options)["dtype"], engine_options(options)["device"],
            engine_options(options)["compile"]) == ("float32", "cpu", "off")


def test_the_bundled_engine_defaults_to_the_measured_path():
    assert engine_options(BackendOptions())["dtype"] == "auto"


def test_a_bad_compile_mode_in_the_bundled_engines_record_is_a_user_error():
    from spectune.core.errors import UserError

    with pytest.raises(UserError, match="compile"):
        make_backend("local", BackendOptions(local=BundledEngineOptions(compile="sometimes")))


def test_the_bundled_engines_description_names_its_device_and_dtype():
    engine = make_backend("local", BackendOptions(max_concurrency=4,
                                                   local=BundledEngineOptions(device="cpu", dtype="native"))
                          ).describe()["engine"]
    assert engine == {"model": None, "draft": None, "max_concurrency": 4, "device": "cpu", "dtype": "native"}



def test_a_cutoff_reaches_the_bundled_engine_as_its_draft_p_min():
    assert engine_options(BackendOptions(draft_p_min=0.6))["draft_p_min"] == 0.6


def test_no_cutoff_leaves_the_bundled_engine_drafting_every_row_to_num_steps():
    assert "draft_p_min" not in engine_options(BackendOptions())
