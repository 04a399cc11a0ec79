"""The front door and the documentation site: the README stays short, the site builds strictly, the
references cover every key and command, and the commands and code the pages show still parse.
"""

import glob
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from conftest import REPO
from stager import __version__
from stager.cli.main import build_parser
from stager.cli.reference import commands
from stager.cli.reference import markdown as cli_markdown
from stager.config import config_from_dict
from stager.config.reference import keys
from stager.config.reference import markdown as config_markdown

PAGES = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)


def blocks(kinds):
    """``(page, language, code)`` of every fenced block whose language is in ``kinds``."""
    for page in PAGES:
        with open(page) as fh:
            text = fh.read()
        for match in FENCE.finditer(text):
            if match.group(1) in kinds:
                yield os.path.relpath(page, REPO), match.group(1), match.group(2)


def stager_invocations():
    """``(page, line, arguments)`` of every ``stager`` command shown in a shell block."""
    for page, _, code in blocks({"", "bash", "sh", "shell"}):
        for line in code.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line.split(" #")[0], comments=True)
            except ValueError:
                continue  # unbalanced quotes: a program's output shown in the block, not a command
            for start, word in enumerate(words):
                if os.path.basename(word) == "stager":  # .venv/bin/stager, stager, -m stager
                    rest = words[start + 1:]
                    if rest and not rest[0].endswith(":"):  # "stager analyze: ..." is output, not a command
                        cut = [i for i, w in enumerate(rest) if w in (":", "&", "|", ">", "&&")]
                        yield page, line.strip(), rest[:cut[0]] if cut else rest
                    break


def test_the_readme_is_a_short_front_door():
    with open(os.path.join(REPO, "README.md")) as fh:
        lines = fh.read().splitlines()
    assert len(lines) <= 300
    head = "\n".join(lines[:150])
    assert "scripts/bootstrap.sh demo" in head and "scripts/bootstrap.sh test" in head
    assert "+train_loader = StagedLoader(" in head, "the one-line PyTorch change in the first 150 lines"
    assert "StagingIterator(" in head and "was: MultiprocessIterator" in head, "the one-line Chainer change"
    assert ".venv/bin/mkdocs build --strict" in "\n".join(lines), "the README names the site's build command"


def test_every_configuration_key_is_described_and_in_the_reference():
    page = config_markdown()
    missing = [key.path for key in keys() if not key.description.strip()]
    assert not missing, f"keys without a description in their section's docstring: {missing}"
    for key in keys():
        assert f"| `{key.name}` |" in page.split(f"## `{key.section}`", 1)[1].split("\n## ", 1)[0], key.path
        for choice in key.choices or ():
            assert f"`{choice}`" in page
    assert len(keys()) > 60


def test_every_command_and_option_is_in_the_cli_reference():
    page = cli_markdown()
    listed = [name for name, _, _ in commands()]
    top = build_parser()
    for action in top._actions:
        for name in getattr(action, "choices", None) or {}:
            assert f"stager {name}" in listed
    for name, parser, _ in commands():
        assert f"`{name}`" in page
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert flag in page, f"{name} {flag}"


def test_the_commands_the_pages_show_parse_with_todays_parser_and_keys():
    paths = {key.path for key in keys()}
    seen = 0
    for page, line, args in stager_invocations():
        try:
            build_parser().parse_args(args)
        except SystemExit:
            pytest.fail(f"{page}: `{line}` no longer parses: stager {' '.join(args)}")
        for i, word in enumerate(args):
            if word == "--set" and i + 1 < len(args):
                key = args[i + 1].split("=", 1)[0]
                assert key in paths or key.startswith("slurm."), f"{page}: `{line}` sets an unknown key {key}"
        seen += 1
    assert seen >= 30


def test_the_files_the_pages_name_exist():
    named = re.compile(r"(?<![\w/.])((?:configs|examples|benchmarks|slurm|scripts)/[\w./-]+\.(?:py|yaml|sbatch|sh))")
    for page, _, code in blocks({"", "bash", "sh", "shell", "python", "diff", "yaml"}):
        for path in named.findall(code):
            assert os.path.exists(os.path.join(REPO, path)), f"{page} names {path}"


def test_the_configurations_the_pages_show_load():
    sections = {key.section for key in keys()}
    count = 0
    for page, _, code in blocks({"yaml"}):
        data = yaml.safe_load(code)
        if isinstance(data, dict) and set(data) <= sections:  # a stager config (not a profile, not Slurm's)
            config_from_dict(data)
            count += 1
    assert count >= 3


def test_the_python_the_pages_show_compiles():
    count = 0
    for page, _, code in blocks({"python"}):
        compile(code, page, "exec")
        count += 1
    assert count >= 5


def test_the_committed_reference_pages_are_what_the_code_says_today():
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "docs_reference.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_site_builds_strictly_with_the_version_and_the_generated_references(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    configuration = (site / "reference" / "configuration" / "index.html").read_text()
    assert "shuffle_algorithm" in configuration and "torch_loader_persistent" in configuration
    assert "stager simulate" in (site / "reference" / "cli" / "index.html").read_text()
    assert "StagedLoader" in (site / "reference" / "api" / "index.html").read_text()
    assert f"stager {__version__}" in (site / "index.html").read_text()


def test_the_version_is_the_packages():
    proc = subprocess.run([sys.executable, "-m", "stager", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"stager {__version__}"
