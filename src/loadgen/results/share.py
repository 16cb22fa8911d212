"""Results people can share (`loadgen share`, issue 49): run folders' JSON files with what names this
machine and its people redacted, bundled with a list of what was removed.

What is redacted, in every string of every JSON value (keys are kept):
- secrets: the values of keys that hold them (api_key, authorization, token, password, secret, cookie),
  `Bearer ...` credentials and `sk-...` keys inside strings: "<secret>";
- absolute paths: the folders of a path are "<path>", its last part kept (`<path>/SmolLM2.gguf`: the
  model's file name says what was measured, the folders say whose machine);
- the machine's host names and the user's name (`Redactor.for_this_machine`): "<host>", "<user>";
- IP addresses other than loopback (127.0.0.0/8, ::1): "<ip>" (a target's URL keeps its port).
The list of what was removed names each category, how many strings it touched and where (the JSON
paths), never the values. Pure but for `for_this_machine`, which reads the host and user names.
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

SECRET_KEYS = re.compile(r"(api[_-]?key|authorization|token|password|secret|cookie)", re.IGNORECASE)
_BEARER = re.compile(r"\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]+", re.IGNORECASE)
_SK = re.compile(r"\bsk-[A-Za-z0-9_-]{8,}")
_PATH = re.compile(r"(?<![\w.:/<])(/(?:[^/\s\"',;:]+/)+)([^/\s\"',;:]*)")
_IPV4 = re.compile(r"(?<![\w.])(\d{1,3}(?:\.\d{1,3}){3})(?![\w.])")
_IPV6 = re.compile(r"(?<![\w:])((?:[0-9a-fA-F]{1,4}:){2,7}[0-9a-fA-F]{0,4}|::1)(?![\w:])")
SECRET, PATH, HOST, USER, IP = "secrets", "absolute paths", "host names", "user names", "IP addresses"


@dataclass
class Redactor:
    """Redacts JSON values (module docstring) and counts what it removed, by category and where."""

    hosts: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    removed: dict[str, set[str]] = field(default_factory=dict)

    @classmethod
    def for_this_machine(cls) -> Redactor:
        names = {socket.gethostname(), socket.getfqdn()}
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # no name for the uid (a container)
            user = os.environ.get("USER", "")
        return cls(hosts=tuple(sorted(n for n in names if n and n not in ("localhost", "localhost.localdomain"))),
                   users=(user,) if user and user != "root" else ())

    def _note(self, category: str, where: str) -> None:
        self.removed.setdefault(category, set()).add(where)

    def value(self, value: Any, where: str = "") -> Any:
        if isinstance(value, dict):
            return {k: ("<secret>" if SECRET_KEYS.search(str(k)) and isinstance(v, str) and v and self._secret(
                f"{where}.{k}") else self.value(v, f"{where}.{k}")) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, str):
            return self.text(value, where)
        return value

    def _secret(self, where: str) -> bool:
        self._note(SECRET, where)
        return True

    def text(self, text: str, where: str = "") -> str:
        out = text
        for pattern in (_BEARER, _SK):
            out, n = pattern.subn(lambda m: (m.group(1) + " <secret>") if m.lastindex else "<secret>", out)
            if n:
                self._note(SECRET, where)
        out, n = _PATH.subn(lambda m: "<path>/" + m.group(2), out)
        if n:
            self._note(PATH, where)
        for category, names, mark in ((HOST, self.hosts, "<host>"), (USER, self.users, "<user>")):
            for name in names:
                if name in out:
                    out = re.sub(rf"(?<![\w-]){re.escape(name)}(?![\w-])", mark, out)
                    if mark in out:
                        self._note(category, where)
        out = _IPV4.sub(lambda m: self._ip(m.group(1), where), out)
        return _IPV6.sub(lambda m: self._ip(m.group(1), where), out)

    def _ip(self, text: str, where: str) -> str:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            return text  # a version number such as 1.2.3.4000, not an address
        if address.is_loopback or address.is_unspecified:
            return text
        self._note(IP, where)
        return "<ip>"

    def report(self, files: Iterable[str]) -> str:
        """REDACTED.md: what was removed, by category, where (JSON paths), never the values."""
        lines = ["# What `loadgen share` removed", "",
                 "Values are replaced in place; the values themselves are not listed.", ""]
        if not self.removed:
            lines.append("Nothing: no secret, absolute path, host name, user name or IP address was found.")
        for category in (SECRET, PATH, HOST, USER, IP):
            places = sorted(self.removed.get(category, ()))
            if places:
                shown = ", ".join(f"`{p}`" for p in places[:12]) + (f" and {len(places) - 12} more" if len(places) > 12 else "")
                lines.append(f"- {category} ({len(places)} place(s)): {shown}")
        lines += ["", "Files: " + ", ".join(f"`{f}`" for f in files)]
        return "\n".join(lines) + "\n"


def bundle(folders: Iterable[Any], out_path: Any, records: bool = False, redactor: Redactor | None = None) -> list[str]:
    """Write a .tar.gz of each run folder's JSON files (and with `records`, its requests.jsonl), redacted,
    with REDACTED.md; the files' names in the bundle. ValueError (one line) for a folder without run.json."""
    import io
    import json
    import tarfile
    from pathlib import Path

    red = redactor or Redactor.for_this_machine()
    members: list[tuple[str, bytes]] = []
    for folder in map(Path, folders):
        if not (folder / "run.json").is_file():
            raise ValueError(f"{folder}: no run.json here; give run folders written by loadgen")
        name = base = red.text(folder.resolve().name, "folder name")
        taken = {n.split("/", 1)[0] for n, _ in members}
        for k in range(2, 10_000):  # two folders of one name: the second is name-2, not written over it
            if name not in taken:
                break
            name = f"{base}-{k}"
        for path in sorted(folder.glob("*.json")):
            doc = red.value(json.loads(path.read_text(encoding="utf-8")), f"{name}/{path.name}")
            members.append((f"{name}/{path.name}", (json.dumps(doc, indent=2) + "\n").encode()))
            if path.name == "run.json" and isinstance(doc, dict):  # each level in llm-d's common report
                from .llmd_report import llmd_reports

                members += [(f"{name}/llm-d/{file}", (json.dumps(report, indent=2) + "\n").encode())
                            for file, report in llmd_reports(doc)]
        if records and (folder / "requests.jsonl").is_file():
            lines = [json.dumps(red.value(json.loads(line), f"{name}/requests.jsonl"))
                     for line in (folder / "requests.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
            members.append((f"{name}/requests.jsonl", ("\n".join(lines) + "\n").encode()))
    names = [n for n, _ in members]
    members.append(("REDACTED.md", red.report(names).encode()))
    out = Path(out_path)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for member_name, data in members:
            info = tarfile.TarInfo(member_name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0  # no owner, no time: nothing of who made it
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, out)
    return [*names, "REDACTED.md"]
