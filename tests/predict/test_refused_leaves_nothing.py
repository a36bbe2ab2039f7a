"""A prediction refused (a workload that does not load, an unknown technique) leaves no folder behind: the
default output folder and its parents that the command created are removed with their lock file, and a folder
that existed before stays as it was."""

from __future__ import annotations

from membench import cli


def test_a_refused_prediction_leaves_no_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["predict", "--workload", "vit-tiny", "--device", "cpu", "--techniques", "nope"]) == 2
    assert "unknown technique 'nope'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # not even results/predicted/<machine>/cpu-vit-tiny-bs32/.membench.lock


def test_a_refused_lookup_into_an_existing_folder_keeps_it(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("kept")
    assert cli.main(["predict", "--workload", "tests.workloads:no_such_factory", "--device", "cpu",
                     "--out", str(out)]) == 2
    assert "no_such_factory" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "kept"
