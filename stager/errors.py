"""Exceptions that stager raises to its callers.

Every error names the thing at fault (file, key, line, stage) so that a user
reading a failed job's log can act without re-running it.
"""


class StagerError(Exception):
    """Base class of every error stager raises on purpose."""


class ConfigError(StagerError, ValueError):
    """A configuration file or override is invalid."""


class CatalogError(StagerError, ValueError):
    """The dataset listing (directory or manifest) is invalid."""


class StageError(StagerError, RuntimeError):
    """A pipeline stage failed; carries where it happened.

    Attributes:
        message: What happened, without the context (which the text adds).
        stage: "prefetch", "read" or "pipeline".
        epoch: Epoch of the minibatch being processed, or None.
        step: Index of the minibatch within its epoch, or None.
        path: Relative path of the sample being processed, or None.
        cause: Name of the original exception type.
        remote_traceback: Formatted traceback from the worker process.
    """

    def __init__(self, message, *, stage, epoch=None, step=None, path=None,
                 cause=None, remote_traceback=None):
        where = [f"stage={stage}"]
        if epoch is not None:
            where.append(f"epoch={epoch}")
        if step is not None:
            where.append(f"minibatch={step}")
        if path is not None:
            where.append(f"file={path}")
        text = f"{message} [{', '.join(where)}]"
        if remote_traceback:
            text += "\n\nOriginal traceback in the worker:\n" + remote_traceback
        super().__init__(text)
        self.message = message
        self.stage = stage
        self.epoch = epoch
        self.step = step
        self.path = path
        self.cause = cause
        self.remote_traceback = remote_traceback
