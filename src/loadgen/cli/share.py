"""`loadgen share RUN_DIR...`: a bundle of runs to post in an issue, with this machine's and its people's
names, paths, addresses and secrets redacted (results/share.py; docs/history.md)."""

from __future__ import annotations

from pathlib import Path

import click

from ..core.errors import InputError
from ..results.share import bundle
from .common import user_errors


@click.command("share")
@click.argument("folders", nargs=-1, required=True, type=click.Path(file_okay=False, exists=True))
@click.option("--output", "out_file", default="loadgen-share.tar.gz", show_default=True,
              type=click.Path(dir_okay=False), help="The bundle to write (.tar.gz).")
@click.option("--records", is_flag=True, help="Also the request records (requests.jsonl), redacted the same way.")
def share_command(folders: tuple[str, ...], out_file: str, records: bool) -> None:
    """Bundle runs to share, with host and user names, paths, IP addresses and secrets redacted (a list of what was removed inside)."""
    with user_errors():
        try:
            names = bundle(folders, Path(out_file), records=records)
        except (ValueError, OSError) as exc:
            raise InputError(str(exc)) from None
    click.echo(out_file)
    click.echo(f"{len(names)} file(s); what was removed: REDACTED.md inside", err=True)
