"""mkdocs hooks: the manual's reference parts are generated from the code when it is built
(``<!-- settings-table -->``, ``<!-- cli-reference -->``, ``<!-- site-file: NAME -->``), so they
cannot drift from it."""

from __future__ import annotations

import argparse
import re
from importlib import resources

SITE_FILE = re.compile(r"<!-- site-file: ([a-z0-9_-]+) -->")


def cli_reference() -> str:
    """Each command's ``--help``, in the order a user meets them."""
    from parsl_torch.cli.commands import build_parser

    blocks: list[str] = []

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        blocks.append(f"## `{name}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
        for action in parser._actions:  # argparse keeps its subcommands here (no public accessor)
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    walk(child, f"{name} {sub}")

    walk(build_parser(), "parsl-torch")
    return "\n".join(blocks)


def site_file(name: str) -> str:
    text = resources.files("parsl_torch").joinpath("site_configs", f"{name}.yaml").read_text()
    return f"```yaml\n{text.rstrip()}\n```"


def on_page_markdown(markdown: str, **_: object) -> str:
    from parsl_torch.common import settings

    markdown = markdown.replace("<!-- settings-table -->", settings.markdown_table())
    markdown = markdown.replace("<!-- cli-reference -->", cli_reference())
    return SITE_FILE.sub(lambda m: site_file(m.group(1)), markdown)
