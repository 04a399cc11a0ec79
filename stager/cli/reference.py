"""The command-line reference, read from the ``stager`` command's own argparse parsers.

Each command and subcommand with its usage line, its description and its
arguments (the options' flags, metavars, defaults and help), in the order
``stager --help`` lists them. The documentation site renders
``markdown()``; ``commands()`` is what a test holds against the parser.
"""

import argparse
import contextlib
import os

from .main import build_parser


@contextlib.contextmanager
def _columns(width):
    # argparse wraps usage lines at the terminal's width ($COLUMNS); the page must not depend on who built it.
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def _subcommands(parser):
    for action in parser._actions:  # argparse keeps its subcommands on this private list only
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            return [(name, sub, helps.get(name, "")) for name, sub in action.choices.items()]
    return []


def commands(parser=None, prefix="stager"):
    """``[(full command, parser, one-line help)]`` for every command below ``parser``, depth first."""
    parser = parser or build_parser()
    out = []
    for name, sub, text in _subcommands(parser):
        full = f"{prefix} {name}"
        out.append((full, sub, text))
        out += commands(sub, full)
    return out


def _argument_rows(parser):
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            flags = ", ".join(action.option_strings)
            if action.nargs != 0:
                flags += " " + (action.metavar or action.dest.upper())
        else:
            flags = action.metavar or action.dest
        default = action.default
        shown = "" if default in (None, False, [], argparse.SUPPRESS) or not action.option_strings else f"`{default}`"
        text = (action.help or "").replace("%(default)s", str(default)).replace("|", "\\|")
        rows.append(f"| `{flags}` | {shown} | {text} |")
    return rows


def markdown():
    """The reference page: one section per command."""
    with _columns(100):
        return _page(build_parser())


def _page(top):
    lines = ["# Command-line reference", "",
             "Every `stager` command, generated from its argparse parsers (`stager/cli`); `stager COMMAND --help` "
             "prints the same. (Written by `scripts/docs_reference.py`: edit the parsers' help, not this page.)", "", "```", top.format_usage().strip(), "```", ""]
    for full, parser, text in commands(top):
        depth = full.count(" ")
        lines += ["#" * min(depth + 1, 4) + f" `{full}`", ""]
        if text:
            lines += [text[0].upper() + text[1:] + ".", ""]
        lines += ["```", parser.format_usage().strip(), "```", ""]
        if parser.description:
            lines += [parser.description, ""]
        rows = _argument_rows(parser)
        if rows:
            lines += ["| argument | default | meaning |", "|---|---|---|", *rows, ""]
    return "\n".join(lines)
