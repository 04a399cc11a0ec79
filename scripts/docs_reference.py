"""Writes the site's generated reference pages from the code: the configuration schema and the CLI parsers.

    .venv/bin/python scripts/docs_reference.py           # rewrite docs/reference/{configuration,cli}.md
    .venv/bin/python scripts/docs_reference.py --check   # exit 1, naming the page, if either is stale

The pages are committed so that the README's links work in the repository
too; ``tests/test_docs.py`` fails when they differ from what the code says,
so they cannot drift.
"""

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

PAGES = {
    "docs/reference/configuration.md": "stager.config.reference",
    "docs/reference/cli.md": "stager.cli.reference",
}


def generated():
    """``{path: text}`` of each generated page, as the code makes it today."""
    import importlib

    return {path: importlib.import_module(module).markdown() + "\n" for path, module in PAGES.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the committed pages are current")
    args = parser.parse_args()
    stale = []
    for path, text in generated().items():
        full = os.path.join(REPO, path)
        current = open(full).read() if os.path.exists(full) else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as fh:
                fh.write(text)
    if args.check and stale:
        sys.exit(f"stale: {', '.join(stale)}: run .venv/bin/python scripts/docs_reference.py")
    for path in stale:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
