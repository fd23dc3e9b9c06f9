"""THE secret rule (specab.vocab.contract): which names are secrets, and how text, argv and mappings are redacted.

The controller once used a narrower rule than the node: ``--api-key X`` (server arg ``api_key``) and a bare
``TOKEN`` were redacted on the node but not in the runner scrub or the stored config. These cases pin the one
rule; the end-to-end proof is tests/driver/test_secrets_e2e.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from specab.vocab import contract as c

R = c.REDACTED
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize("name", ["TOKEN", "token", "HF_TOKEN", "hf_token", "api_key", "API_KEY", "--api-key",
                                  "api-key", "KEY", "MY_SECRET", "db_password", "DB_PASSWORD", "PASSWORD_FILE",
                                  "--db-password", "MY_NODE_TOKEN"])
def test_secret_names(name):
    assert c.is_secret_name(name)


@pytest.mark.parametrize("name", ["NCCL_PROTO", "--max-tokens", "max_tokens", "MAX_TOKENS", "TOKENS",
                                  "MAX_NEW_TOKENS", "max_total_tokens", "--max-prefill-tokens",
                                  "speculative_num_draft_tokens", "--speculative-num-draft-tokens",
                                  "tokenizer_path", "--tokenizer-path", "speculative_token_map", "KEYS", "monkey",
                                  "tp_size", "host", "port"])
def test_not_secret_names(name):
    """``*_TOKENS`` (plural: counts, not credentials) and names merely containing ``token``/``key`` are not secrets."""
    assert not c.is_secret_name(name)


@pytest.mark.parametrize("text, expected", [
    ("--api-key X", f"--api-key {R}"),
    ("--api-key=X", f"--api-key={R}"),
    ("TOKEN=x", f"TOKEN={R}"),
    ("export TOKEN=x", f"export TOKEN={R}"),
    ("HF_TOKEN=hf_abc", f"HF_TOKEN={R}"),
    ("db_password=pw", f"db_password={R}"),
    ("--api-key 'two words' --port 1", f"--api-key {R} --port 1"),
    ("NCCL_PROTO=LL", "NCCL_PROTO=LL"),
    ("--max-tokens 256", "--max-tokens 256"),
    ("--max-tokens=256 MAX_TOKENS=3", "--max-tokens=256 MAX_TOKENS=3"),
    ("--speculative-num-draft-tokens 3", "--speculative-num-draft-tokens 3"),
    # a value ends at the next blank, and the punctuation that closes it there stays in the text
    ("HF_TOKEN=a,b;c) x", f"HF_TOKEN={R}) x"),
    ('{"env": "HF_TOKEN=hf_abc"}', f'{{"env": "HF_TOKEN={R}"}}'),
    ("(api_key=sk-1)", f"(api_key={R})"),
])
def test_redact_text(text, expected):
    assert c.redact_text(text) == expected


def test_redact_text_in_a_launch_line_keeps_the_rest():
    line = "exec python -m sglang.launch_server --tp-size 8 --api-key SECRETAPI --max-total-tokens 9 NCCL_PROTO=LL"
    out = c.redact_text(line)
    assert "SECRETAPI" not in out
    assert out == f"exec python -m sglang.launch_server --tp-size 8 --api-key {R} --max-total-tokens 9 NCCL_PROTO=LL"


def test_redact_text_keeps_the_fields_of_a_real_server_args_line():
    """SGLang 0.5.17's ServerArgs(...) log line (the real H200 baseline log in tests/fixtures/sglang-0.5.17): a
    field redacted (its name ends in _token) keeps the ", " that separates it from the next one."""
    line = next(line for line in (FIXTURES / "sglang-0.5.17" / "baseline.log").read_text().splitlines()
                if "server_args=ServerArgs(" in line)
    out = c.redact_text(line)
    assert f"bucket_time_to_first_token={R}, bucket_inter_token_latency=None," in out
    assert out.count(", ") == line.count(", ")


def test_redact_mapping_is_deep_and_leaves_other_keys():
    m = {"server_args": {"api_key": "X", "max_total_tokens": 5, "tp_size": 8},
         "env": {"TOKEN": "t", "HF_TOKEN": "h", "db_password": "p", "NCCL_PROTO": "LL", "MAX_TOKENS": "3"},
         "arms": [{"name": "a", "env": {"TOKEN": "t2"}, "server_args": {"api_key": None}}]}
    out = c.redact_mapping(m)
    assert out == {"server_args": {"api_key": R, "max_total_tokens": 5, "tp_size": 8},
                   "env": {"TOKEN": R, "HF_TOKEN": R, "db_password": R, "NCCL_PROTO": "LL", "MAX_TOKENS": "3"},
                   "arms": [{"name": "a", "env": {"TOKEN": R}, "server_args": {"api_key": None}}]}
    assert m["env"]["TOKEN"] == "t"          # a copy: the input is untouched


def test_redact_env_and_secret_values():
    env = {"TOKEN": "t", "api_key": "k", "NCCL_PROTO": "LL", "EMPTY_TOKEN": "", "--max-tokens": "7"}
    assert c.redact_env(env) == {"TOKEN": R, "api_key": R, "NCCL_PROTO": "LL", "EMPTY_TOKEN": "", "--max-tokens": "7"}
    assert sorted(c.secret_values(env, {"HF_TOKEN": "h", "MAX_TOKENS": "9"})) == ["h", "k", "t"]


def test_nested_secret_values_reads_nested_results_and_json_strings():
    """What an Ansible task result carries: the experiment as a fact, a command's JSON stdout, a file's content."""
    result = {"ansible_facts": {"exp": {"server_args": {"api_key": "k-1234", "tp_size": 8},
                                        "arms": [{"env": {"HF_TOKEN": "t-5678", "NCCL_PROTO": "LL"}}]}},
              "stdout": '{"env": {"MY_SECRET": "s-9012"}, "KEY": 12345}',
              "content": "not json, api_key: x-0000",
              "flags": {"TOKEN": True, "API_KEY": "", "PASSWORD": R, "HF_TOKEN": None}}
    assert sorted(c.nested_secret_values(result)) == ["12345", "k-1234", "s-9012", "t-5678"]


def test_scrub_values_and_text():
    values = c.scrub_values(["abc", "abcdef-long", "abcdef", None, "abcdef"])
    assert values == ["abcdef-long", "abcdef"]            # distinct, longest first, too-short values left out
    text = 'x abcdef-long y "q\\"abcdef" HF_TOKEN=unknown --api-key other'
    assert c.scrub_text(text, values) == f'x {R} y "q\\"{R}" HF_TOKEN={R} --api-key {R}'
    assert c.scrub_text('"v": "a\\"b-1"', c.scrub_values(['a"b-1'])) == f'"v": "{R}"'   # the JSON-escaped form
    assert c.scrub_bytes(b"pre abcdef post", values) == f"pre {R} post".encode()
