"""Lets DLIO (``dlio_benchmark``) import without TensorFlow when it runs PyTorch workloads.

DLIO 2.0.0's ``main`` imports its profiler factory, which imports
``dlio_benchmark.profiler.tf_profiler``, which imports ``tensorflow`` at
module level, even for ``framework: pytorch``, where nothing of TensorFlow
is used: without TensorFlow installed (gigabytes that a PyTorch site does
not want) ``dlio_benchmark`` cannot start. Only that one module is
replaced here, and only when TensorFlow is not installed: by a module
whose ``TFProfiler`` raises, when asked for, an ``ImportError`` that says
which DLIO setting needs TensorFlow. DLIO's own files are not touched;
with TensorFlow installed, nothing changes.

``install()`` is called at interpreter start by a ``.pth`` file that
``scripts/bootstrap.sh`` writes into the venv only where ``import
dlio_benchmark.main`` fails for want of TensorFlow (the ``dlio`` extra's
install, docs/dlio.md). It costs one ``sys.meta_path`` entry until DLIO's
profiler is imported, and nothing after.
"""

import importlib.util
import sys

TF_PROFILER = "dlio_benchmark.profiler.tf_profiler"


class _NoTensorFlowProfiler:
    """Builds the stand-in for DLIO's TensorFlow profiler module.

    A loader by its two methods, not a subclass of ``importlib.abc.Loader``:
    this module is imported at every interpreter's start, and ``importlib.abc``
    would cost each one 8 ms.
    """

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module):
        from dlio_benchmark.profiler.io_profiler import IOProfiler

        def refuse(*_args, **_kwargs):
            raise ImportError("DLIO's tensorboard profiler (workload.profiling.profiler: tensorboard) needs "
                              "TensorFlow, which is not installed: choose iostat or none, or install tensorflow")

        module.TFProfiler = type("TFProfiler", (IOProfiler,), {
            "__doc__": "DLIO's TensorFlow profiler, unavailable: TensorFlow is not installed.",
            "__init__": refuse, "get_instance": staticmethod(refuse)})
        module.__doc__ = __doc__


class _BeforeDLIOProfiler:
    """A meta-path finder that answers for DLIO's TensorFlow profiler only, then steps aside."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TF_PROFILER:
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        if importlib.util.find_spec("tensorflow") is not None:
            return None  # the real module, with the real TensorFlow
        return importlib.util.spec_from_loader(fullname, _NoTensorFlowProfiler(), origin="stager (no tensorflow)")


def install():
    """Prepares DLIO's first profiler import in this interpreter (called by the venv's ``.pth`` file)."""
    if TF_PROFILER not in sys.modules and not any(isinstance(f, _BeforeDLIOProfiler) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeDLIOProfiler())
