"""A re-run archives every file of the earlier run, under a name of its own."""

from __future__ import annotations

import os

import pytest

from membench.results import read_result
from tests.helpers import run_tiny

# --- a re-run archives every file of the earlier run, under a name of its own ----------------------------------

@pytest.mark.slow
def test_a_rerun_archives_the_result_with_its_timeline(tmp_path):
    assert run_tiny("--out", str(tmp_path), "--timeline") == 0
    first = read_result(tmp_path / "baseline.json")
    first_timeline = (tmp_path / "baseline.timeline.json").read_bytes()
    assert run_tiny("--out", str(tmp_path), "--timeline") == 0
    [folder] = (tmp_path / "previous").iterdir()
    archived = read_result(folder / "baseline.json")
    assert archived.started == first.started
    assert (folder / archived.timeline.file).read_bytes() == first_timeline  # still its own timeline
    assert (folder / "baseline.log").exists()
    assert read_result(tmp_path / "baseline.json").started != first.started
    assert (tmp_path / "baseline.timeline.json").exists()


def test_two_archives_in_the_same_microsecond_do_not_collide(tmp_path):
    from membench.results import archive

    folders = []
    for text in ("first", "second"):
        for name in ("baseline.json", "baseline.timeline.json", "baseline.rank1.oom.pickle", "ckpt+amp.json"):
            (tmp_path / name).write_text(text)
            os.utime(tmp_path / name, (1_700_000_000.5, 1_700_000_000.5))
        folders.append(archive(tmp_path, "baseline"))
    assert folders[0] != folders[1]
    for folder, text in zip(folders, ("first", "second")):
        assert folder.name.startswith("baseline.20231114T221320.500000Z-")
        assert sorted(p.name for p in folder.iterdir()) == ["baseline.json", "baseline.rank1.oom.pickle",
                                                            "baseline.timeline.json"]
        assert (folder / "baseline.timeline.json").read_text() == text
    assert (tmp_path / "ckpt+amp.json").exists()  # another run's file stays
