"""A long run says, after its warm-up, how long the rest takes at the warm-up's pace."""

from __future__ import annotations

import io

from membench.report import live
from membench.report.live import TIMELINE_STEPS, Pace, StageLines, steps_after_warmup
from membench.results.progress import Stage
from membench.trackers import timeline
from tests.helpers import spec


def cpu_job(techniques=(), **options):
    return spec("vit-tiny", techniques, **{"steps": 5, "warmup": 2, "check": True, "timeline": True, "device": "cpu",
                                          **options})


def test_steps_after_warmup_as_the_worker_runs_them():
    # baseline on CPU: 1 measured + 2 timeline + 5 timed + 1 FLOP count + 2 x 2 check steps (two models)
    assert steps_after_warmup(cpu_job()) == 13
    # a technique adds the baseline beside it: 2 warm-up steps and max(5, 6) pairs of two steps
    assert steps_after_warmup(cpu_job(("ckpt",))) == 13 + 2 + 12
    # more timed steps than the least pairs: as many pairs as timed steps (here no check)
    job = spec("vit-tiny", ("ckpt",), steps=8, warmup=1, device="cpu", check=False)
    assert steps_after_warmup(job) == 1 + 2 + 8 + 1 + 1 + 2 * 8
    assert TIMELINE_STEPS == timeline.TIMELINE_STEPS


def test_a_slow_warm_up_says_what_is_left_once_and_a_quick_one_nothing():
    job = cpu_job()
    pace = Pace()
    assert pace.seen(job, Stage("baseline", "build", 1.0)) is None
    assert pace.seen(job, Stage("baseline", "warmup", 10.0, steps=2)) is None
    said = pace.seen(job, Stage("baseline", "measure", 30.0, steps=1))  # 10 s a step, 13 steps to go
    assert said == "a step took 10 s in warm-up: at that pace this run needs about 2 min 10 s more (13 more steps)"
    assert pace.seen(job, Stage("baseline", "timeline", 40.0)) is None
    quick = Pace()
    quick.seen(job, Stage("baseline", "warmup", 10.0, steps=2))
    assert quick.seen(job, Stage("baseline", "measure", 19.0, steps=1)) is None  # 4.5 s x 13 = 58.5 s


def test_min_time_is_named_and_the_api_lines_print_it():
    job = cpu_job(min_time_s=60.0)
    out = io.StringIO()
    lines = StageLines(out)
    lines.start(job)
    lines(Stage("baseline", "warmup", 0.0, steps=2))
    lines(Stage("baseline", "measure", 40.0, steps=1))
    text = out.getvalue()
    assert ("membench: baseline: a step took 20 s in warm-up: at that pace this run needs about 4 min 20 s more "
            "(13 more steps (--min-time can add timed steps))") in text


def test_the_note_names_the_peak_host_memory_so_far_and_what_holds_two_models_later(monkeypatch):
    monkeypatch.setattr(live, "available_bytes", lambda: 7 * 2**30)  # more than twice 3 GiB: no warning
    job = cpu_job(("ckpt",))
    pace = Pace()
    pace.seen(job, Stage("ckpt", "warmup", 0.0, steps=2))
    said = pace.seen(job, Stage("ckpt", "measure", 20.0, steps=1, host_peak_bytes=3 * 2**30))
    assert said == ("a step took 10 s in warm-up: at that pace this run needs about 4 min 30 s more (27 more steps); "
                    "its peak host memory so far is 3.00 GiB (RSS), and later the baseline's model is built beside "
                    "it to time the two and the equivalence check trains two models side by side")


def test_twice_the_memory_held_beyond_what_is_available_is_a_warning(monkeypatch):
    monkeypatch.setattr(live, "available_bytes", lambda: 5 * 2**30)
    pace = Pace()
    pace.seen(cpu_job(), Stage("baseline", "warmup", 0.0, steps=2))
    said = pace.seen(cpu_job(), Stage("baseline", "measure", 20.0, steps=1, host_peak_bytes=3 * 2**30))
    assert said.endswith("its peak host memory so far is 3.00 GiB (RSS), and later the equivalence check trains two "
                         "models side by side: twice that is more than the 5.00 GiB this machine has available now "
                         "(MemAvailable), so it may be killed for memory; --no-check leaves out the check")
    # a baseline without the check holds one model throughout: nothing to warn about
    alone = Pace()
    job = cpu_job(check=False)
    alone.seen(job, Stage("baseline", "warmup", 0.0, steps=2))
    assert alone.seen(job, Stage("baseline", "measure", 60.0, steps=1, host_peak_bytes=3 * 2**30)).endswith(
        "its peak host memory so far is 3.00 GiB (RSS)")


def test_available_memory_is_read_from_meminfo_in_kib(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:    2048 kB\n")
    assert live.available_bytes(str(meminfo)) == 2 * 2**20
    assert live.available_bytes(str(tmp_path / "absent")) is None
    meminfo.write_text("MemAvailable: lots\n")
    assert live.available_bytes(str(meminfo)) is None


def test_before_its_first_step_a_run_that_cannot_fit_its_state_says_so(monkeypatch):
    monkeypatch.setattr(live, "available_bytes", lambda: 7 * 2**30)
    built = Stage("baseline", "warmup", 5.0, steps=2, model_bytes=2**30)
    # Adam: 1 GiB of parameters, 1 of gradients, 2 of moments = 4 GiB; the check trains two models later: 8 GiB
    assert Pace().seen(cpu_job(), built) == (
        "before its first step: this model's parameters are 1.00 GiB, so its parameters and their gradients and "
        "adam's 2 states hold at least 4.00 GiB, and twice that later, when the equivalence check trains two models "
        "side by side: more than the 7.00 GiB this machine has available now (MemAvailable), so it may be killed "
        "for memory; --no-check leaves out the check")
    assert Pace().seen(cpu_job(check=False), built) is None  # 4 GiB held once: it fits
    monkeypatch.setattr(live, "available_bytes", lambda: 5 * 2**29)  # 2.5 GiB
    assert Pace().seen(cpu_job(check=False, optimizer="sgd"), built) is None  # 2 GiB
    assert Pace().seen(cpu_job(check=False, optimizer="sgd-momentum"), built) == (
        "before its first step: this model's parameters are 1.00 GiB, so its parameters and their gradients and "
        "sgd-momentum's 1 state hold at least 3.00 GiB: more than the 2.50 GiB this machine has available now "
        "(MemAvailable), so it may be killed for memory")
    # nothing where the optimizer's states are not known, on a GPU, or when the worker said no size
    assert Pace().seen(cpu_job(check=False, optimizer="adafactor"), built) is None
    assert Pace().seen(cpu_job(device="cuda"), built) is None
    assert Pace().seen(cpu_job(), Stage("baseline", "warmup", 5.0, steps=2)) is None


def test_a_run_says_it_before_its_first_step_from_the_worker_s_model_size(tmp_path, monkeypatch, capsys):
    """End to end: the worker reports its built model's parameter bytes with the warm-up stage, and the sweep's
    progress says it before the warm-up (MemAvailable made 1 KiB here)."""
    from membench import cli

    monkeypatch.setattr(live, "available_bytes", lambda: 1024)
    assert cli.main(["run", "--device", "cpu", "--workload", "tests.workloads:mlp", "--batch-size", "2",
                     "--techniques", "baseline", "--steps", "1", "--warmup", "1", "--no-check", "--no-timeline",
                     "--out", str(tmp_path)]) == 0
    # tests.workloads:mlp: Linear(192, 64) and Linear(64, 10) in fp32, (192 * 64 + 64 + 64 * 10 + 10) * 4 B
    assert ("before its first step: this model's parameters are 50.79 KiB, so its parameters and their gradients "
            "and adam's 2 states hold at least 203.16 KiB: more than the 1.00 KiB this machine has available now "
            "(MemAvailable), so it may be killed for memory") in capsys.readouterr().err
