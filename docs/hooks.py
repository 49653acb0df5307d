"""mkdocs hooks: the manual's reference parts are generated from the code when it is built
(``<!-- settings-table -->``, ``<!-- cli-reference -->``, ``<!-- site-file: NAME -->``,
``<!-- layer-table -->``, ``<!-- parsl-patches -->``), so they cannot drift from it."""

from __future__ import annotations

import argparse
import ast
import re
from importlib import resources
from pathlib import Path

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


LAYER = re.compile(r"\b[Ll]ayer (\d)")


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def layer_table() -> str:
    """One row per package (a folder, or a top module), highest layer first: its layer and contract, from
    its docstring (a sub-package's layer is its parent's), and every module in it."""
    import parsl_torch

    root = Path(parsl_torch.__file__).parent
    rows = []
    for init in sorted(root.rglob("__init__.py")):
        folder = init.parent
        if folder == root:
            continue
        top = root / folder.relative_to(root).parts[0] / "__init__.py"
        layer = LAYER.search(_docstring(top))
        contract = " ".join(_docstring(init).split("\n\n")[0].split())
        modules = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
        name = folder.relative_to(root).as_posix()
        rows.append((-int(layer.group(1)) if layer else 0, name,
                     f"| {layer.group(1) if layer else '?'} | `{name}/` | {contract} | "
                     f"{', '.join(f'`{m}`' for m in modules)} |"))
    for module in sorted(p for p in root.glob("*.py") if p.stem != "__init__"):
        layer = LAYER.search(_docstring(module))
        rows.append((-int(layer.group(1)) if layer else 0, module.stem,
                     f"| {layer.group(1) if layer else '?'} | `{module.name}` | "
                     f"{' '.join(_docstring(module).split(chr(10) * 2)[0].split())} | |"))
    return "\n".join(["| layer | package | what it owns | modules |", "|---|---|---|---|",
                      *(row for _, _, row in sorted(rows))])


def on_page_markdown(markdown: str, **_: object) -> str:
    from parsl_torch import parslext
    from parsl_torch.common import settings

    markdown = markdown.replace("<!-- layer-table -->", layer_table())
    markdown = markdown.replace("<!-- parsl-patches -->", parslext.markdown_table())
    markdown = markdown.replace("<!-- settings-table -->", settings.markdown_table())
    markdown = markdown.replace("<!-- cli-reference -->", cli_reference())
    return SITE_FILE.sub(lambda m: site_file(m.group(1)), markdown)
