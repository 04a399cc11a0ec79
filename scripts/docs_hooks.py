"""MkDocs hook (named in mkdocs.yml): the site's title carries the package's version."""


def on_config(config):
    import stager

    config.site_name = f"stager {stager.__version__}"
    return config
