"""--json-schema, --grammar, --tools and --tool-choice: what every request asks for beyond text.

Read and checked here, once, before the first level (docs/request-features.md): a schema that does
not parse or is not a valid JSON schema (jsonschema's `check_schema`), a tool file that is not a
list of OpenAI function tools, two tools of one name, a tool whose `parameters` is not a valid
schema, a --tool-choice that names no tool, and a feature the chosen --api has no field for are
each refused in one line (exit 2). The values become `GenerationParams` fields; the backends put
them in every body (client/backends/features.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..client.backends import IMAGE_APIS, STRUCTURED_APIS, TOOLS_APIS
from ..core.errors import ConfigError
from ..core.images import ImageSet

TOOL_CHOICES = ("auto", "required", "none")


def feature_options(f: Callable) -> Callable:
    """The request-feature options, in --help's order."""
    for option in reversed([
        click.option("--json-schema", "json_schema", metavar="FILE|JSON",
                     help="Constrain every answer to this JSON schema (a file, or the JSON itself) and report the "
                          "share of answers that parse and match it (docs/request-features.md)."),
        click.option("--grammar", "grammar_file", metavar="FILE", type=click.Path(dir_okay=False),
                     help="Constrain every answer with this GBNF grammar (llama-server's `grammar`)."),
        click.option("--tools", "tools", metavar="N|FILE",
                     help="Offer N synthetic tools with every request, or the OpenAI tool definitions of a JSON "
                          "file (a list); chat API; llama-server needs --jinja."),
        click.option("--tool-choice", metavar="auto|required|none|NAME", help="With --tools: the `tool_choice` sent."),
        click.option("--images", "images", metavar="K:WxH|K",
                     help="K generated W×H images in every request (chat, responses, messages), each salted per "
                          "request so the server's image cache never answers; with --images-from, K of its images."),
        click.option("--images-from", "images_from", metavar="PATH", multiple=True,
                     help="Send these image files (a folder: its files) instead of generated ones; repeatable."),
        click.option("--image-cache", is_flag=True, default=False,
                     help="Send the images unsalted and let the server reuse them (cache_prompt): measures its cache."),
    ]):
        f = option(f)
    return f


def request_features(json_schema: str | None, grammar_file: str | None, tools: str | None,
                     tool_choice: str | None, api: str, ignore_eos: bool = True) -> dict[str, Any]:
    """The GenerationParams fields the options ask for, checked (ConfigError otherwise), and
    `ignore_eos` (--ignore-eos): off whenever a feature is asked, since a constrained answer ends
    where its grammar (or the tool call) does, and forcing past its end would only add tokens the
    grammar cannot take."""
    fields: dict[str, Any] = {}
    if (json_schema is not None or grammar_file is not None) and api not in STRUCTURED_APIS:
        raise ConfigError(f"--json-schema and --grammar apply to --api {', '.join(STRUCTURED_APIS)} "
                          f"(the {api} API has no field for them)")
    if json_schema is not None and grammar_file is not None:
        raise ConfigError("give --json-schema or --grammar, not both (llama-server takes one constraint a request)")
    if json_schema is not None:
        fields["json_schema"] = read_schema(json_schema)
    if grammar_file is not None:
        fields["grammar"] = _read(grammar_file, "--grammar")
    if tools is not None:
        if api not in TOOLS_APIS:
            raise ConfigError(f"--tools applies to --api {' or '.join(TOOLS_APIS)} (the {api} API has no tools)")
        fields["tools"] = synthetic_tools(int(tools)) if tools.isdigit() else read_tools(tools)
    if tool_choice is not None:
        names = {t["function"]["name"] for t in fields.get("tools", ())}
        if not names:
            raise ConfigError("--tool-choice needs --tools")
        if tool_choice not in TOOL_CHOICES and tool_choice not in names:
            raise ConfigError(f"--tool-choice {tool_choice!r}: give auto, required, none or an offered tool's name")
        fields["tool_choice"] = tool_choice
    return {**fields, "ignore_eos": ignore_eos and not fields}


def image_features(images: str | None, images_from: tuple[str, ...] = (), image_cache: bool = False,
                   api: str = "chat") -> ImageSet | None:
    """The GenerationParams `images` --images / --images-from / --image-cache ask for (checked:
    ConfigError otherwise); None when no images are asked."""
    if images is None and not images_from:
        if image_cache:
            raise ConfigError("--image-cache needs --images or --images-from")
        return None
    if api not in IMAGE_APIS:
        raise ConfigError(f"--images applies to --api {', '.join(IMAGE_APIS)} (the {api} API carries no images)")
    from ..core import images as core_images

    if not images_from:
        return core_images.generated(str(images), cached=image_cache)
    if images is not None and not images.isdigit():
        raise ConfigError(f"--images {images!r} with --images-from: give K, the images a request carries")
    return core_images.from_files(_image_paths(images_from), int(images or 1), cached=image_cache)


def _image_paths(given: tuple[str, ...]) -> list[str]:
    paths: list[str] = []
    for name in given:
        path = Path(name)
        if path.is_dir():
            paths.extend(str(p) for p in sorted(path.iterdir()) if p.is_file())
        elif path.is_file():
            paths.append(name)
        else:
            raise ConfigError(f"--images-from {name}: no such file or folder")
    return paths


def synthetic_tools(n: int) -> tuple[dict[str, Any], ...]:
    """N distinct, deterministic function tools (tool_000, tool_001, ...), each small (one string
    parameter, ~30 tokens in a chat template): the same definitions every run, so the rungs of a
    tool ladder differ only in how many there are."""
    return tuple({"type": "function", "function": {
        "name": f"tool_{i:03d}", "description": f"Look up record {i}.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}
        for i in range(n))


def read_schema(text_or_file: str) -> dict[str, Any]:
    """--json-schema: the JSON itself when it starts with `{`, else a file holding it; a valid schema."""
    text = text_or_file if text_or_file.lstrip().startswith("{") else _read(text_or_file, "--json-schema")
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--json-schema: not JSON ({exc})") from None
    _check_schema(schema, "--json-schema")
    return schema


def read_tools(path: str) -> tuple[dict[str, Any], ...]:
    """--tools FILE: a JSON list of `{"type": "function", "function": {"name", "parameters"...}}`,
    names distinct, each `parameters` a valid schema."""
    try:
        tools = json.loads(_read(path, "--tools"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--tools {path}: not JSON ({exc})") from None
    if not isinstance(tools, list) or not tools:
        raise ConfigError(f"--tools {path}: give a JSON list of tool definitions")
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise ConfigError(f"--tools {path}: tool {i} is not {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
        if name in seen:
            raise ConfigError(f"--tools {path}: two tools are named {name!r}")
        seen.add(name)
        if "parameters" in function:
            _check_schema(function["parameters"], f"--tools {path}: tool {name!r}'s parameters")
    return tuple(tools)


def _check_schema(schema: Any, what: str) -> None:
    import jsonschema

    if not isinstance(schema, dict):
        raise ConfigError(f"{what}: a JSON schema is an object")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"{what}: not a valid JSON schema ({exc.message})") from None


def _read(path: str, option: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{option} {path}: cannot read it ({exc})") from None
