"""Shared by the Python tests: one archive of the sample images (SHARDFEED_TEST_DATA/good, 36
JPEGs in 3 classes), packed once per pytest run with the default options. Tests only read it;
a test that damages, repacks or appends packs its own."""
import os

import pytest

import shardfeed

GOOD = os.path.join(os.environ.get("SHARDFEED_TEST_DATA", ""), "good")


@pytest.fixture(scope="session")
def archive_path(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("good") / "a")
    assert shardfeed.pack(GOOD, out, workers=2)["packed"] == 36
    return out
