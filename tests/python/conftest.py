"""Shared fixtures of the Python client tests: where the built programs, the
client library and the test checkpoints are, and real holder processes in
temporary directories.

Paths come from the environment that ctest sets (tests/python/CMakeLists.txt):
  WSUP_BIN_DIR       folder of wsup-holder (default: build/bin)
  WSUP_CLIENT_LIB    libwsup_client.so (default: the package's own search)
  WSUP_TESTDATA_DIR  the test checkpoints (default: testdata/ in the repository)
"""

import json
import os
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

from wsup_client.holder import start_holder  # noqa: E402


def bin_dir():
    return os.environ.get("WSUP_BIN_DIR") or os.path.join(ROOT, "build", "bin")


def model_dir(name):
    base = os.environ.get("WSUP_TESTDATA_DIR") or os.path.join(ROOT, "testdata")
    path = os.path.abspath(os.path.join(base, name))
    if not os.path.isdir(path):
        pytest.fail("test checkpoint %s is missing: it is in the repository's testdata/; if WSUP_TESTDATA_DIR "
                    "is set, point it at a folder that has it" % path)
    return path


def tensors_json(name):
    with open(os.path.join(model_dir(name), "tensors.json")) as f:
        return json.load(f)


def golden(name):
    with open(os.path.join(model_dir(name), "golden.json")) as f:
        return json.load(f)


@pytest.fixture
def socket_dir():
    """A private (0700) directory for holder sockets and logs."""
    with tempfile.TemporaryDirectory(prefix="wsup-py-") as d:
        yield d


@pytest.fixture
def holder(socket_dir):
    """holder(model_name, *args, name="holder"): a running wsup-holder on a
    test checkpoint; every holder started is SIGKILLed at the end."""
    started = []
    binary = os.path.join(bin_dir(), "wsup-holder")
    if not os.access(binary, os.X_OK):
        pytest.fail("%s is missing: build it (ninja -C build wsup-holder) or set WSUP_BIN_DIR" % binary)

    def start(model, *args, name="holder"):
        h = start_holder(binary, model_dir(model), socket_dir, args=args, name=name)
        started.append(h)
        return h

    yield start
    for h in started:
        h.stop()
