"""Shared fixtures. Tests mirror the package layout; slow ones (full Kokoro decoder) are marked `slow`."""

from __future__ import annotations

import os
import random
import shutil

import numpy as np
import pytest
import torch
from hypothesis import settings

from tests import torch_state

# Property tests run the same examples on every run (CI must not pass or fail by the draw); to explore new ones
# locally: TENSORPROBE_HYPOTHESIS=explore python -m pytest ...
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("TENSORPROBE_HYPOTHESIS", "repeatable"))


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same draws whatever ran before it (the order is random: pytest-randomly)."""
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    yield


def pytest_configure(config):
    """pytest-randomly shuffles the order but does not reseed: by default it reseeds random, NumPy and, through
    thinc's entry point (spaCy, under kokoro), torch right before each test body with a seed drawn per run, which
    would override `_seed` and give each CI run other weights (a TVM tolerance failed so on one seed of eight)."""
    if config.pluginmanager.hasplugin("randomly"):
        config.option.randomly_reset_seed = False


@pytest.fixture(autouse=True)
def _torch_state():
    """torch's process-wide state as each test found it (compiler configs, torch.compile as Lightning leaves it,
    default dtype, deterministic and grad modes, environment variables, tensorprobe's quiet mode), so that no test
    depends on the order the suite runs in: pytest-randomly shuffles it, and the seed line above the results says
    how to run one order again."""
    before = torch_state.save()
    yield
    torch_state.restore(before)


# what a failure on another machine is read against (CI's log shows them: .ci/run runs the README's command)
VERSIONS_SHOWN = ("torch", "numpy", "numba", "onnxruntime", "onnx", "executorch", "apache-tvm", "mlx", "lightning",
                  "transformers", "pytest", "hypothesis")


def pytest_collection_finish(session):
    """The versions of the packages the suite depends on most, and the random order's seed, printed even under -q
    (pytest-randomly prints its seed only in the header, which -q hides)."""
    from importlib.metadata import PackageNotFoundError, version

    config = session.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    installed = []
    for name in VERSIONS_SHOWN:
        try:
            installed.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            installed.append(f"{name} (not installed)")
    reporter.write_line("versions: " + ", ".join(installed))
    if config.pluginmanager.hasplugin("randomly") and config.getoption("randomly_seed", None) is not None:
        reporter.write_line(f"random order: --randomly-seed={config.getoption('randomly_seed')} "
                            "runs this order again; -p no:randomly runs the files' order")


@pytest.fixture(autouse=True)
def _threads():
    """torch's thread count as each test found it: a sweep engine run in this process (Dask's in-process
    workers) sets it to 1, and a later guide's in-process dump then rounds otherwise than its CLI capture
    (guide-diff read 'inputs differ by 7.3e-08' in the full suite, 'identical' alone)."""
    n = torch.get_num_threads()
    yield
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


_FAILED_MODULES: set[str] = set()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        _FAILED_MODULES.add(item.module.__name__)
    return report


@pytest.fixture(scope="module", autouse=True)
def _module_tmp_cleanup(request, tmp_path_factory):
    """Removes what a module's fixtures made with tmp_path_factory once the module is done, unless one of its
    tests failed: pytest keeps those until the session ends (policy 'failed' removes only a passing test's own
    tmp_path), and the whole suite's Kokoro captures and exports came to 18 GB there, enough to fill CI's disk."""
    base = tmp_path_factory.getbasetemp()
    before = set(base.iterdir())
    yield
    if request.module.__name__ in _FAILED_MODULES:
        return
    for entry in set(base.iterdir()) - before:
        shutil.rmtree(entry, ignore_errors=True)


@pytest.fixture(scope="session")
def kokoro():
    """The Kokoro example module (skips when the `kokoro` extra is not installed)."""
    pytest.importorskip("kokoro", reason="needs the kokoro extra: pip install 'tensorprobe[kokoro]'")
    from tensorprobe.examples import kokoro as k

    return k
