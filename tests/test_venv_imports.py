"""In the README's environment, torchvision, Lightning and torchmetrics import first, in any order, in a fresh interpreter.

PyPI's torchvision wheel cannot load its operators beside the CPU-only
torch; ``scripts/bootstrap.sh`` then adds a ``.pth`` file that prepares the
first ``import torchvision`` (``iterators/_torchvision_import.py``). These
tests run fresh interpreters in isolated mode (``-I``: no PYTHONPATH, no
current directory), so only what the venv itself holds can make them pass.
"""

import os
import subprocess
import sys
import sysconfig

import pytest

pytest.importorskip("torchvision")

PTH = os.path.join(sysconfig.get_paths()["purelib"], "stager-torchvision.pth")


def fresh(code):
    return subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120,
                          cwd="/")


@pytest.mark.parametrize("order", [
    "import torchvision; import lightning",
    "import lightning; import torchvision",
    "import torchmetrics",
    "from torchvision.datasets import ImageFolder; from torchvision.transforms import v2",
    "import torchvision.models as m; m.resnet18(num_classes=2)",
])
def test_a_fresh_interpreter_imports_the_stacks_in_any_order(order):
    if "lightning" in order or "torchmetrics" in order:
        pytest.importorskip("lightning", reason="Lightning is not installed (extra 'stacks')")
    proc = fresh(order)
    assert proc.returncode == 0, proc.stderr


def test_the_import_hook_is_installed_exactly_where_torchvision_needs_it():
    without_hook = fresh("import sys\n"
                         "sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != '_BeforeTorchvision']\n"
                         "import torchvision")
    if os.path.exists(PTH):
        assert without_hook.returncode != 0 and "torchvision::" in without_hook.stderr, \
            "the .pth file is only for a torchvision whose operators cannot load"
    else:
        assert without_hook.returncode == 0, without_hook.stderr


def test_a_missing_operator_library_still_says_so_when_called():
    proc = fresh("import torch, torchvision\n"
                 "from torchvision.ops import nms\n"
                 "boxes = torch.tensor([[0., 0., 1., 1.]]); scores = torch.tensor([1.])\n"
                 "try:\n"
                 "    print('kept', nms(boxes, scores, 0.5).tolist())\n"
                 "except (RuntimeError, NotImplementedError) as exc:\n"
                 "    print('no kernel:', exc)\n")
    assert proc.returncode == 0, proc.stderr
    # Where the library loads, nms works; where it cannot (the .pth's case), calling it is torch's own error.
    assert proc.stdout.startswith("no kernel:" if os.path.exists(PTH) else "kept [0]"), proc.stdout
