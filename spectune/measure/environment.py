"""The host and package versions recorded in sweep.json and validate.json, and the CPU line every speed figure
carries (``lscpu``'s model name and the vector flags that decide the CPU kernels)."""

from __future__ import annotations

import os
import platform
import socket
import sys
from importlib.metadata import PackageNotFoundError, version

from spectune.backends.cpuinfo import read_cpuinfo
from spectune.core.json_types import JsonObject

VECTOR_FLAG_PREFIXES = ("avx", "amx", "fma", "f16c")
"""CPU flags that decide which kernels torch, oneDNN, llama.cpp and vLLM run (AVX2, AVX-512 and its bf16/VNNI
extensions, AMX)."""


def cpu_model_and_flags(cpuinfo: str = "/proc/cpuinfo") -> tuple[str, list[str]]:
    """The CPU's model name (what ``lscpu`` prints as "Model name") and its vector flags
    (:data:`VECTOR_FLAG_PREFIXES`, sorted), from :func:`spectune.backends.cpuinfo.read_cpuinfo`; off Linux
    (no such file) ``platform.processor()`` and no flags. Raises nothing."""
    model, flags = read_cpuinfo(cpuinfo)
    return model or platform.processor() or "unknown", sorted(x for x in flags if x.startswith(VECTOR_FLAG_PREFIXES))


def cpu_line() -> str:
    """``"<model>; <vector flags>"``: the machine line printed beside every speed figure of the benchmarks."""
    model, flags = cpu_model_and_flags()
    return f"{model}; {' '.join(flags) or 'no vector flags read'}"


def environment() -> JsonObject:
    """``host`` and ``versions`` for sweep.json and validate.json (package versions read from metadata: nothing
    is imported). ``host.load_average`` is the 1, 5 and 15 minute load average when the run started
    (``os.getloadavg``; None where the OS has none): how busy the machine was before spectune loaded it, which
    says whether its speed figures came from a quiet machine. ``host.cpu`` is :func:`cpu_model_and_flags`."""
    def ver(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    versions = {n: ver(n) for n in ("spectune", "aiohttp", "numpy", "torch", "transformers")}
    versions["python"] = platform.python_version()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        load = None
    model, flags = cpu_model_and_flags()
    host = {"hostname": socket.gethostname(), "platform": platform.platform(), "python": sys.version.split()[0],
            "cpus": os.cpu_count(), "cpu": {"model": model, "vector_flags": flags}, "load_average": load}
    return {"host": host, "versions": versions}
