"""The house's moves: old import paths keep working for one release, with a warning; the public API is unchanged."""

import importlib
import subprocess
import sys
import warnings

import pytest

from stager import _moved


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_an_old_import_path_warns_naming_the_new_one_and_gives_the_same_objects(old):
    for name in [m for m in sys.modules if m == old or m.startswith(old + ".")]:
        del sys.modules[name]
    targets = [importlib.import_module(t) for t in _moved.MOVED[old]]
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {_moved.MOVED[old][0]}"):
        module = importlib.import_module(old)
    public = [n for t in targets for n in dir(t) if not n.startswith("_")]
    assert public, f"{old}'s new home {_moved.MOVED[old]} has no public names"
    for name in public:
        found = next(getattr(t, name) for t in targets if hasattr(t, name))
        assert getattr(module, name) is found, (old, name)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        getattr(module, "no_such_name")


def test_a_name_that_left_a_module_that_stays_warns_and_is_the_same_object():
    from stager.engine.perf import probe
    from stager.model import calibrate

    with pytest.warns(DeprecationWarning, match="stager.model.calibrate.probe moved to stager.engine.perf.probe"):
        assert calibrate.probe is probe
    with pytest.raises(AttributeError):
        calibrate.no_such_name


def test_the_public_api_imports_without_a_deprecation_warning():
    # A fresh interpreter, warnings about moves turned into errors: the names
    # users have always imported must not touch an old path.
    code = ("import warnings\n"
            "warnings.filterwarnings('error', message='.* moved to ')\n"
            "from stager import Pipeline, Batch, Catalog, Config, load_config, config_from_dict\n"
            "from stager import StagerError, StageError, ConfigError, CatalogError\n"
            "from stager.plan import Position\n"
            "from stager.world import install_abort_hook, detect, World\n"
            "from stager.catalog import Catalog as C, broadcast_catalog\n"
            "from stager.telemetry import Telemetry, NEEDED\n"
            "from iterators.pytorch import StagedLoader\n"
            "from iterators.chainer import StagingIterator\n"
            "from stager.cli import main\n"
            "import stager.job, stager.bench, stager.analyze, stager.model, stager.slurm, stager.slowfs, stager.slows3\n"
            "print('ok')\n")
    with warnings.catch_warnings():
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
