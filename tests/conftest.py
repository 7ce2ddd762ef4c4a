"""Test configuration: Triton's CPU interpreter when there is no GPU (its per-device-call re-patch of
``triton.language`` memoised per launch: ``tests.helpers.fast_interpreter_calls``); the ``gpu`` marker.

``TRITON_INTERPRET`` must be set before any kernel is decorated, so it is set here, before the
package's Triton modules can be imported by a test module.
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True, scope="session")
def _fast_interpreter():
    """Every interpreted launch patches triton.language once, not once per device-function call (the same
    state, so the same results; ~40% of an interpreted program). A no-op for compiled kernels."""
    from tests.helpers import fast_interpreter_calls

    with fast_interpreter_calls():
        yield


@pytest.fixture
def device():
    """The device of non-``gpu`` kernel tests: CPU (interpreter) without a GPU, else CUDA."""
    return torch.device("cuda" if HAS_CUDA else "cpu")
