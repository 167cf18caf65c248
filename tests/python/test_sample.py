"""Archive.schema and Archive.sample(): archives of earlier versions read as image + label (plus
what the folder pack stores), and boxes and masks turn with a JPEG's EXIF orientation so they
always match the upright image sample() returns."""
import numpy as np
import pytest

import shardfeed


def test_folder_archive_sample_matches_getitem(archive_path):
    a = shardfeed.Archive(archive_path)
    schema = a.schema
    assert list(schema)[:2] == ["image", "label"]
    assert schema["image"] == "image" and schema["label"] == "int64"
    for i in (0, 7, len(a) - 1, -1):
        s = a.sample(i)
        image, label = a[i]
        assert list(s) == list(schema)
        assert np.array_equal(s["image"], image) and s["label"] == label
    with pytest.raises(IndexError):
        a.sample(len(a))
