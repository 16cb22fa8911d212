"""Base URLs behind gateways (core/baseurl.py): where each request path goes, what is shown, what is refused.

The expected answers were written down before the code was run.
"""

from __future__ import annotations

import pytest

from loadgen.core.baseurl import BaseUrl, BaseUrlError, masked
from loadgen.results.writer import command_line
from loadgen.run.config import build_targets

# base URL given, request path -> request-target sent
JOINS = [
    ("http://127.0.0.1:8080", "/completion", "/completion"),
    ("http://127.0.0.1:8080/", "/v1/chat/completions", "/v1/chat/completions"),
    ("https://gw.example/team-a/llama", "/completion", "/team-a/llama/completion"),
    ("https://gw.example/team-a/llama/", "/v1/chat/completions", "/team-a/llama/v1/chat/completions"),
    ("https://gw.example/team-a/llama", "/metrics", "/team-a/llama/metrics"),
    ("https://gw.example/team-a/llama", "/tokenize", "/team-a/llama/tokenize"),
    # the OpenAI convention: /v1 is the API under the root, never doubled
    ("http://localhost:8000/v1", "/v1/chat/completions", "/v1/chat/completions"),
    ("http://localhost:8000/v1/", "/v1/completions", "/v1/completions"),
    ("http://localhost:8000/v1", "/health", "/health"),
    ("http://localhost:8000/v1", "/completion", "/completion"),
    ("https://gw.example/openai/v1", "/v1/chat/completions", "/openai/v1/chat/completions"),
    ("https://gw.example/openai/v1", "/slots", "/openai/slots"),
    # not the OpenAI suffix: only a whole path segment "v1" is
    ("https://gw.example/v1beta", "/v1/models", "/v1beta/v1/models"),
    # query strings are kept on every request, after any query of the path
    ("https://gw.example/llama?api-version=2024-06-01", "/completion", "/llama/completion?api-version=2024-06-01"),
    ("https://gw.example/llama/v1?api-version=1", "/v1/chat/completions", "/llama/v1/chat/completions?api-version=1"),
    ("http://h:1/p?a=1&b=2", "/slots?fail_on_no_slot=1", "/p/slots?fail_on_no_slot=1&a=1&b=2"),
]


@pytest.mark.parametrize("base,path,expected", JOINS, ids=[f"{b} {p}" for b, p, _ in JOINS])
def test_request_paths_go_under_the_prefix_with_the_query(base, path, expected):
    assert BaseUrl.parse(base).target(path) == expected


# URL given -> shown (keys masked)
SHOWN = [
    ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
    ("https://gw.example/llama/v1/", "https://gw.example/llama/v1"),
    ("https://gw.example/llama?api-version=1&key=s3cret-value", "https://gw.example/llama?api-version=1&key=***"),
    ("https://gw.example/x?subscription-key=abc&code=zz&flag",
     "https://gw.example/x?subscription-key=***&code=***&flag"),
    ("https://gw.example/x?access_token=t&sig=s&api_key=k&monkey=1",
     "https://gw.example/x?access_token=***&sig=***&api_key=***&monkey=1"),
]


@pytest.mark.parametrize("given,shown", SHOWN, ids=[g for g, _ in SHOWN])
def test_keys_in_the_query_are_masked_when_shown(given, shown):
    assert BaseUrl.parse(given).text() == shown
    if "?" in given:  # any text, valid or not, gets the same masking for messages
        assert masked(given) == shown


BAD = [
    ("ftp://h:21", "expected http"),
    ("http://user:pw@h:1", "credentials"),
    ("http://h:1/llama#frag", "fragment"),
    ("http://h:1/v1/chat/completions", "an endpoint"),
    ("http://h:1/gw/completion", "an endpoint"),
    ("http://h:1/v1/completions", "an endpoint"),
    ("http://h:1/a b", "space"),
    ("http://h:0", "port 0"),
    ("http://h:99999", "not a valid URL"),
]


@pytest.mark.parametrize("given,why", BAD, ids=[g for g, _ in BAD])
def test_what_is_not_a_base_url(given, why):
    with pytest.raises(BaseUrlError, match=why):
        BaseUrl.parse(given)


def test_targets_keep_the_path_and_take_server_urls_in_order():
    targets = build_targets("127.0.0.1", None, ("http://127.0.0.1:9000/gw/llama/v1?key=abcdefgh12", "http://a:1"),
                            (), (",http://127.0.0.1:8080",))
    assert targets[0].url == "http://127.0.0.1:9000/gw/llama/v1?key=abcdefgh12"
    assert targets[0].display == "http://127.0.0.1:9000/gw/llama/v1?key=***"
    assert targets[0].shown == "127.0.0.1:9000/gw/llama/v1?key=***"
    assert targets[0].server_url is None and targets[0].probe_url == targets[0].url
    assert targets[1].server_url == "http://127.0.0.1:8080" and targets[1].probe_url == "http://127.0.0.1:8080"
    assert targets[0].secrets == ("abcdefgh12",)


def test_the_command_line_masks_url_keys():
    argv = ["loadgen", "sweep", "--url", "https://gw/x?api-version=1&key=SECRET", "--url=http://h/?token=T"]
    assert command_line(argv) == ["loadgen", "sweep", "--url", "https://gw/x?api-version=1&key=***",
                                  "--url=http://h/?token=***"]
