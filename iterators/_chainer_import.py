"""Imports Chainer 7 on a modern Python (one place for the workarounds)."""

import sys
import warnings


def import_chainer():
    """Returns the ``chainer`` module."""
    # Chainer 7 imports numpy.distutils, which needs the standard library's
    # distutils rather than the shim that setuptools installs at start-up.
    if "distutils" not in sys.modules:
        try:
            import _distutils_hack
            _distutils_hack.remove_shim()
        except ImportError:
            pass
    with warnings.catch_warnings():
        # Chainer 7 imports pkg_resources, which setuptools marks deprecated.
        warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
        import chainer
    return chainer


chainer = import_chainer()
