"""Keep secrets out of everything spectune writes: command lines, launched servers' logs, sweep.json, points.jsonl.

Redaction works by flag and by value:

- **flags** of the engines spectune launches whose name ends in a secret word (``--api-key``, ``--hf-token``,
  ``--admin-api-key``, ``--password``...; :func:`is_secret_name`): their value is replaced by ``***``. Only the last
  word of the name counts, so numeric engine flags such as ``--speculative-num-draft-tokens 4`` or
  ``--max-num-batched-tokens`` are never masked (recorded commands stay replayable);
- **environment assignments** in a command (``env HF_TOKEN=hf_... vllm serve``) whose name is a secret variable;
- **values**: the values of secret environment variables of this process (``HF_TOKEN``, ``OPENAI_API_KEY``, any
  ``*_API_KEY``/``*_TOKEN``/``*_SECRET``/``*_PASSWORD``), wherever they appear; ``Authorization``/``Bearer``
  credentials; passwords in URLs (``https://user:pw@host``) and secret query parameters (``?api_key=``); ``name=value``
  or ``name: value`` pairs and ``--flag value`` in text with a secret name (SGLang and vLLM print their arguments as
  ``api_key='...'``, a command line quoted in a log as ``--api-key X``); and
  token shapes that are secrets whatever their context (Hugging Face ``hf_...``, OpenAI/Anthropic ``sk-...``,
  GitHub ``ghp_...``/``github_pat_...``, Slack ``xox?-...``).

Values that are numbers, booleans or null are never masked. :class:`Redactor` holds the values to hide (from the
environment and from a command line) and redacts text; :func:`redact_argv` renders a command line.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Iterable, Mapping, TypeVar

__all__ = ["Redactor", "argv_secrets", "is_secret_name", "redact_argv", "redact_text", "redact_obj", "MASK"]

MASK = "***"
JsonT = TypeVar("JsonT")
"""A JSON-like value :func:`redact_obj` copies (its type is kept)."""
SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "pwd", "credential",
                          "credentials", "auth"})
"""A flag or variable is secret when the last word of its name (split on ``-``, ``_``, ``.``) is one of these."""
KNOWN_SECRET_ENV = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN", "OPENAI_API_KEY",
                              "ANTHROPIC_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "WANDB_API_KEY",
                              "SPECTUNE_API_KEY", "VLLM_API_KEY", "GITHUB_TOKEN", "GH_TOKEN", "NGC_API_KEY",
                              "AZURE_OPENAI_API_KEY", "HF_API_TOKEN"})
NOT_SECRET_ENV = frozenset({"PWD", "OLDPWD"})
"""POSIX shell variables holding working directories, whose last word ``pwd`` is not a password: masking their values
would mask every path under the current folder in logs and command lines."""
MIN_VALUE_CHARS = 6
"""Environment values shorter than this are not searched for in text (``TOKEN=1`` would mask every 1)."""

_WORD_SPLIT = re.compile(r"[-_.]+")
_PLAIN = re.compile(r"^(?:[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|true|false|none|null|nil|)$", re.IGNORECASE)
_SHAPES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,})")
_BEARER = re.compile(r"(?i)\b(bearer|basic)(\s+)([A-Za-z0-9._~+/=-]+)")
_AUTH_HEADER = re.compile(r"(?i)((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)([^\"'\r\n,}]+)")
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]+:)([^/\s@]+)(@)")
_URL_QUERY = re.compile(r"(?i)([?&;](?:api[_-]?key|key|token|access[_-]?token|secret|password|sig|signature)=)"
                        r"([^&\s\"'#]+)")
_FLAG_VALUE = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9_.-]*)(['\"]?,?\s+)(['\"]?)([^\s'\",\]]+)")
_PAIR = re.compile(r"(?i)\b([A-Za-z][A-Za-z0-9_.-]*)([\"']?\s*[=:]\s*)([\"']?)([^\s\"',;(){}\[\]=]+)")


def is_secret_name(name: str) -> bool:
    """True for names of secret flags or variables: ``--api-key``, ``hf_token``, ``HF_TOKEN``, ``password``; False
    for ``--speculative-num-draft-tokens``, ``--api-key-env`` (a variable's name), ``max_num_batched_tokens``, and the
    shell's ``PWD``/``OLDPWD`` (:data:`NOT_SECRET_ENV`)."""
    bare = name.lstrip("-").strip()
    if bare.upper() in NOT_SECRET_ENV:
        return False
    if bare.upper() in KNOWN_SECRET_ENV:
        return True
    words = [w for w in _WORD_SPLIT.split(bare.lower()) if w]
    return bool(words) and words[-1] in SECRET_WORDS


def _environment_secrets(environ: Mapping[str, str]) -> list[str]:
    return [v for k, v in environ.items() if is_secret_name(k) and len(v) >= MIN_VALUE_CHARS]


class Redactor:
    """Redacts text: secret values of the environment plus ``extra`` values (both kept out of every output),
    then the patterns of the module docstring.

    Args:
        extra: more literal values to hide (e.g. a launched command's ``--api-key`` value).
        environ: the environment whose secret variables' values are hidden (default: ``os.environ``).
    """

    def __init__(self, extra: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> None:
        values = set(_environment_secrets(os.environ if environ is None else environ))
        values |= {v for v in extra if v and len(v) >= MIN_VALUE_CHARS}
        self.values = sorted(values, key=len, reverse=True)  # longest first: a value inside another is still hidden

    def __call__(self, text: str) -> str:
        """``text`` with every secret replaced by ``***``."""
        for value in self.values:
            if value in text:
                text = text.replace(value, MASK)
        text = _SHAPES.sub(MASK, text)
        text = _URL_CREDENTIALS.sub(lambda m: m.group(1) + MASK + m.group(3), text)
        text = _URL_QUERY.sub(lambda m: m.group(1) + MASK, text)
        text = _AUTH_HEADER.sub(lambda m: m.group(1) + _mask_auth(m.group(2)), text)
        text = _BEARER.sub(lambda m: m.group(1) + m.group(2) + (m.group(3) if m.group(3) == MASK else MASK), text)
        text = _FLAG_VALUE.sub(_mask_flag_value, text)
        return _PAIR.sub(_mask_pair, text)


def _mask_auth(value: str) -> str:
    scheme, _, rest = value.strip().partition(" ")
    return f"{scheme} {MASK}" if rest else MASK


def _mask_flag_value(m: re.Match[str]) -> str:
    flag, sep, quote, value = m.group(1), m.group(2), m.group(3), m.group(4)
    if not is_secret_name(flag) or _PLAIN.match(value) or value.startswith("-") or value == MASK:
        return m.group(0)
    return f"{flag}{sep}{quote}{MASK}"


def _mask_pair(m: re.Match[str]) -> str:
    name, sep, quote, value = m.group(1), m.group(2), m.group(3), m.group(4)
    if not is_secret_name(name) or _PLAIN.match(value) or value == MASK or name.lower() in ("authorization",):
        return m.group(0)
    return f"{name}{sep}{quote}{MASK}"


def redact_text(text: str, extra: Iterable[str] = ()) -> str:
    """:class:`Redactor` over the current environment (plus ``extra`` values) applied to ``text``."""
    return Redactor(extra)(text)


def argv_secrets(argv: Iterable[str]) -> list[str]:
    """The secret values a command line carries: values of secret flags (``--api-key X``, ``--hf-token=X``) and
    of secret environment assignments (``HF_TOKEN=X``), for a :class:`Redactor` of that command's log."""
    out, hide_next = [], False
    for arg in argv:
        if hide_next:
            out.append(arg)
            hide_next = False
            continue
        head, eq, value = arg.partition("=")
        if arg.startswith("-") and is_secret_name(head):
            if eq:
                out.append(value)
            else:
                hide_next = True
        elif eq and not arg.startswith("-") and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", head) and is_secret_name(head):
            out.append(value)
    return [v for v in out if not _PLAIN.match(v)]


def redact_argv(argv: list[str], redactor: Redactor | None = None) -> str:
    """The command line as one shell-quoted string with secrets replaced by ``***``: the value after a secret flag
    (``--api-key X``, ``--hf-token=X``), secret environment assignments (``HF_TOKEN=X``), and secret values anywhere
    (:class:`Redactor`). Numeric engine flags (``--speculative-num-draft-tokens 4``) are kept."""
    red = redactor or Redactor(argv_secrets(argv))
    out: list[str] = []
    hide_next = False
    for arg in argv:
        head, eq, _ = arg.partition("=")
        if hide_next:
            out.append(MASK)
            hide_next = False
        elif arg.startswith("-") and is_secret_name(head):
            if eq:
                out.append(head + "=" + MASK)
            else:
                out.append(arg)
                hide_next = True
        elif eq and not arg.startswith("-") and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", head) and is_secret_name(head):
            out.append(head + "=" + MASK)
        else:
            out.append(red(arg))
    return shlex.join(out)


def redact_obj(obj: JsonT, redactor: Redactor | None = None) -> JsonT:
    """A copy of a JSON-like object with every string value redacted (keys, numbers and structure untouched)."""
    red = redactor or Redactor()
    if isinstance(obj, str):
        return red(obj)
    if isinstance(obj, dict):
        return {k: redact_obj(v, red) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v, red) for v in obj]
    return obj
