"""The CPU as Linux reports it in ``/proc/cpuinfo``: the first processor's model name and flags, read in one place
for what depends on them (llama.cpp's ``--no-repack`` workaround, the ``host.cpu`` record of sweep.json and
validate.json)."""

from __future__ import annotations


def read_cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str, list[str]]:
    """(model name, flags) of the first processor ``path`` lists: the model name as ``lscpu`` prints it ("Model
    name"), the flags in the file's order; ``""`` / ``[]`` for what the file lacks or when it cannot be read (not
    Linux). Raises nothing."""
    model, flags = "", None
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "flags" and flags is None:
                    flags = value.split()
                if model and flags is not None:
                    break
    except OSError:
        pass
    return model, flags or []
