"""Redaction by flag and by value (backends/redact.py): what must be hidden, and what must stay replayable."""

from __future__ import annotations

import pytest

from spectune.backends.redact import MASK, Redactor, argv_secrets, is_secret_name, redact_argv, redact_obj

ENV = {"HF_TOKEN": "hf_" + "a" * 34, "MY_SERVICE_API_KEY": "k-123456789", "TOKENIZERS_PARALLELISM": "false",
       "PATH": "/usr/bin", "SHORT_TOKEN": "1"}


@pytest.mark.parametrize("name, secret", [
    ("--api-key", True), ("--hf-token", True), ("--admin-api-key", True), ("--password", True), ("api_key", True),
    ("HF_TOKEN", True), ("OPENAI_API_KEY", True), ("--speculative-num-draft-tokens", False),
    ("--max-num-batched-tokens", False), ("--api-key-env", False), ("TOKENIZERS_PARALLELISM", False),
    ("eos_token_id", False), ("--tokenizer", False), ("num_speculative_tokens", False), ("DB_PWD", True),
    ("PWD", False), ("OLDPWD", False),
])
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_numeric_engine_flags_are_never_masked() -> None:
    argv = ["python", "-m", "sglang.launch_server", "--speculative-num-draft-tokens", "4", "--speculative-num-steps",
            "3", "--max-num-batched-tokens", "8192", "--port", "30000"]
    assert redact_argv(argv) == " ".join(argv)


def test_commands_hide_flag_values_env_assignments_and_env_values(monkeypatch) -> None:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    argv = ["env", "HF_TOKEN=hf_" + "b" * 34, "vllm", "serve", "m", "--api-key", "abc123def", "--hf-token=xyz789abc",
            "--served-model-name", "k-123456789", "--api-key-env", "OPENAI_API_KEY"]
    line = redact_argv(argv)
    assert line == ("env 'HF_TOKEN=***' vllm serve m --api-key '***' '--hf-token=***' --served-model-name '***' "
                    "--api-key-env OPENAI_API_KEY")


@pytest.mark.parametrize("text, hidden, kept", [
    ("Namespace(api_key='abc123def', num_speculative_tokens=4, pad_token=None)", ["abc123def"],
     ["num_speculative_tokens=4", "pad_token=None"]),
    ('server_args=ServerArgs(api_key="zz99zz99", max_running_requests=64)', ["zz99zz99"], ["max_running_requests=64"]),
    ("GET https://user:pa55word@hub.example.com/x?api_key=QQQ&page=2", ["pa55word", "QQQ"], ["user:", "page=2"]),
    ("curl -H 'Authorization: Bearer tok-777-888'", ["tok-777-888"], ["Authorization: Bearer"]),
    ('{"Authorization": "Basic dXNlcjpwdw=="}', ["dXNlcjpwdw=="], ['"Authorization": "Basic']),
    ("loaded with sk-proj-ABCDEFGHIJKLMNOPQRSTUV and ghp_" + "x" * 36, ["sk-proj-", "ghp_"], ["loaded with"]),
    ("the value k-123456789 leaked", ["k-123456789"], ["the value", "leaked"]),
    ("top_k=20 max_tokens=256 seed=0 temperature: 0.7", [], ["top_k=20 max_tokens=256 seed=0 temperature: 0.7"]),
])
def test_text_is_redacted_by_value(text: str, hidden: list[str], kept: list[str]) -> None:
    out = Redactor(environ=ENV)(text)
    for h in hidden:
        assert h not in out
    for k in kept:
        assert k in out
    assert (MASK in out) is bool(hidden)


def test_the_working_directory_is_not_masked() -> None:
    """The shell's PWD is a folder, not a password: paths under it stay readable in logs and launch records."""
    red = Redactor(environ={"PWD": "/work/main", "OLDPWD": "/home/user"})
    assert red("--draft /work/main/backends/local/heads/h") == "--draft /work/main/backends/local/heads/h"


def test_short_or_non_secret_environment_values_are_left_alone() -> None:
    red = Redactor(environ=ENV)
    assert red("parallelism false, path /usr/bin, count 1") == "parallelism false, path /usr/bin, count 1"


def test_argv_secrets_feed_the_log_redactor() -> None:
    argv = ["srv", "--api-key", "abc123def", "--token", "4", "HF_TOKEN=hf_secretvalue1", "--port", "1"]
    assert argv_secrets(argv) == ["abc123def", "hf_secretvalue1"]
    red = Redactor(argv_secrets(argv), environ={})
    assert red("INFO server started, key abc123def") == "INFO server started, key ***"


def test_objects_keep_their_shape() -> None:
    obj = {"command": "x --api-key abc123def", "port": 8000, "nested": [{"url": "http://u:pw12345@h:1"}, 1.5, None]}
    assert redact_obj(obj, Redactor(environ={})) == {"command": "x --api-key ***", "port": 8000,
                                                     "nested": [{"url": "http://u:***@h:1"}, 1.5, None]}
