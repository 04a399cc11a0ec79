"""MkDocs hooks: the generated reference pages and the version, from the code itself (named in mkdocs.yml)."""

from mkdocs.structure.files import File

GENERATED = {
    "reference/configuration.md": "stager.config.reference",
    "reference/cli.md": "stager.cli.reference",
}


def on_config(config):
    import stager

    config.site_name = f"stager {stager.__version__}"
    return config


def on_files(files, config):
    import importlib

    for path, module in GENERATED.items():
        files.append(File.generated(config, path, content=importlib.import_module(module).markdown()))
    return files
