"""The default techniques adapt to the workload and batch: one the run cannot take is skipped with one note naming
it and why; a technique the user names is refused instead (exit 2), and the baseline always runs."""

from __future__ import annotations

import pytest

from membench.api import plan
from membench.common.errors import UserError
from membench.spec import DEFAULT_TECHNIQUES


def test_a_batch_the_accumulation_steps_do_not_divide_skips_accum_with_one_note(capsys):
    assert DEFAULT_TECHNIQUES == "accum,ckpt,opt-in-bwd"  # the note below is about this set
    jobs = plan("vit-tiny", None, batch_size=1, device="cpu")
    assert [j.name for j in jobs] == ["baseline", "ckpt", "opt-in-bwd"]
    notes = capsys.readouterr().err.strip().splitlines()
    assert notes == ["membench: skipping accum (a default technique): --batch-size 1 is not divisible by "
                     "--accum-steps 4 (accumulation needs equal micro-batches)"]


def test_a_batch_every_default_takes_runs_them_all(capsys):
    assert [j.name for j in plan("vit-tiny", None, batch_size=8, device="cpu")] == [
        "baseline", "accum", "ckpt", "opt-in-bwd"]
    assert capsys.readouterr().err == ""


def test_accum_named_by_the_user_is_refused_not_skipped():
    with pytest.raises(UserError, match="--batch-size 1 is not divisible by --accum-steps 4"):
        plan("vit-tiny", "accum", batch_size=1, device="cpu")
