"""sbatch scripts from the templates in the repository's ``slurm/`` (a tool of the ``stager`` command)."""

from .render import TEMPLATES, directives, render, template_dirs, template_path

__all__ = ["TEMPLATES", "directives", "render", "template_dirs", "template_path"]
