"""`membench predict` builds each workload's model once and gives every configuration that builds it the default
way a copy: what each predicts must be what a fresh process predicts, to the byte."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from membench.api import plan, register
from membench.predict.run import predict, predict_all
from membench.workloads import REGISTERED, load_workload

ROOT = Path(__file__).resolve().parents[2]
PLAN = dict(workload="gpt-tiny", batch_size=4, target_device="cuda", nproc_per_node=1, check=False, timeline=False,
            warmup=1, gpu="H100")
TECHNIQUES = "ckpt,opt-in-bwd,accum,bf16,init-on-device,amp-bf16,foreach-off"


def comparable(record) -> dict:
    """A record as JSON, less what differs between two runs of the same prediction (when and how long)."""
    data = json.loads(record.to_json())
    for key in ("started", "wall_s"):
        data.pop(key, None)
    return data


def test_the_model_is_built_once_for_the_configurations_that_build_it_the_default_way():
    built = []
    gpt = load_workload("gpt-tiny")

    def build():
        built.append(1)
        return gpt.build_model()

    name = register(dataclasses.replace(gpt, build_model=build), name="counted_gpt")
    try:
        jobs = plan(**{**PLAN, "workload": name}, techniques="ckpt,bf16", in_process=True)
        assert [j.name for j in jobs] == ["baseline", "ckpt", "bf16"]
        records = predict_all(jobs, None)
    finally:
        REGISTERED.pop(name)
    assert all(r.status == "ok" for r in records), [r.error for r in records]
    # baseline and ckpt share one build; bf16 builds its own way (cast to bf16 on meta): a second.
    assert len(built) == 2


@pytest.mark.slow
def test_each_configuration_predicts_what_it_predicts_alone():
    """In one process: the shared model against a model built for each configuration alone."""
    jobs = plan(**PLAN, techniques=TECHNIQUES, in_process=True)
    together = predict_all(jobs, None)
    alone = [predict(job) for job in jobs]  # outside predict_all: each builds its own model
    assert [r.status for r in together] == ["ok"] * len(jobs), [r.error for r in together]
    assert [comparable(r) for r in together] == [comparable(r) for r in alone]


FRESH = """
import json, sys
from membench.api import plan
from membench.predict.run import predict
job = next(j for j in plan(**json.loads(sys.argv[1]), in_process=True) if j.name == sys.argv[2])
print("RECORD " + predict(job).to_json().replace("\\n", " "))
"""


@pytest.mark.slow
def test_each_configuration_predicts_what_a_fresh_process_predicts():
    jobs = plan(**PLAN, techniques=TECHNIQUES, in_process=True)
    together = predict_all(jobs, None)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", FRESH, json.dumps({**PLAN, "techniques": TECHNIQUES}),
                               job.name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for job in jobs]
    fresh = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
        fresh.append(json.loads(next(x for x in out.splitlines() if x.startswith("RECORD ")).removeprefix("RECORD ")))
    for record, alone in zip(together, fresh):
        alone.pop("started", None), alone.pop("wall_s", None)
        assert comparable(record) == alone, record.name
