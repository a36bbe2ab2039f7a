"""Stacking techniques with '+': valid stacks run, impossible ones are refused before anything runs."""

from __future__ import annotations

import itertools

import pytest

from membench.api import plan
from membench.cli import main
from membench.errors import UserError
from membench.techniques import REGISTRY, check_stack, conflicts_of, parse_techniques
from tests.helpers import measure, verdict

REFUSED = [
    ("opt-in-bwd", "accum"), ("accum", "opt-in-bwd"), ("fsdp-offload", "opt-offload"), ("amp-bf16", "amp-fp16"),
    ("amp-bf16", "bf16"), ("amp-fp16", "bf16"), ("fused-adam", "foreach-off"), ("sac", "ckpt"),
    ("amp-fp16", "opt-in-bwd"), ("fsdp", "fsdp-offload"), ("amp-fp16", "fsdp"), ("opt-offload", "fsdp"),
]


@pytest.mark.parametrize("a,b", REFUSED)
def test_refused_combinations_say_why_in_one_line(a, b):
    with pytest.raises(UserError, match=rf"^cannot combine {a} with {b} in '{a}\+{b}': \S.*") as info:
        check_stack((a, b), "cuda")
    assert "\n" not in str(info.value)


def test_conflicts_are_symmetric_and_name_real_techniques():
    for name, cls in REGISTRY.items():
        assert set(cls.conflicts) <= set(REGISTRY), name
        for other in conflicts_of(name):
            assert name in conflicts_of(other)
            with pytest.raises(UserError):
                check_stack((name, other), "cuda")


def test_a_bad_combination_is_refused_before_anything_runs(tmp_path, capsys):
    code = main(["run", "--device", "cpu", "--workload", "gpt-tiny", "--techniques", "ckpt,accum+opt-in-bwd",
                 "--out", str(tmp_path)])
    assert code == 2
    assert capsys.readouterr().err.startswith("membench: error: cannot combine accum with opt-in-bwd")
    assert not list(tmp_path.iterdir())


def test_every_allowed_pair_on_cpu_is_accepted():
    cpu = [n for n, c in REGISTRY.items() if "cpu" in c.devices and n != "baseline"]
    for a, b in itertools.combinations(cpu, 2):
        if b not in conflicts_of(a):
            check_stack((a, b), "cpu")


def test_plan_expands_stacks_and_keeps_nproc_for_distributed_stacks_only():
    specs = plan("gpt-tiny", "ckpt+opt-in-bwd+amp-bf16,fsdp", batch_size=2, device="cpu", nproc_per_node=2)
    assert [s.run.techniques for s in specs] == [(), ("ckpt", "opt-in-bwd", "amp-bf16"), ("fsdp",)]
    assert [s.run.nproc_per_node for s in specs] == [1, 1, 2]
    assert parse_techniques("accum,ckpt+opt-in-bwd+amp-bf16") == (("accum",), ("ckpt", "opt-in-bwd", "amp-bf16"))


@pytest.mark.parametrize("stack", [("ckpt", "opt-in-bwd", "amp-bf16"), ("sac", "foreach-off", "init-on-device"),
                                   ("ckpt", "fused-adam"), ("init-on-device", "bf16", "opt-in-bwd")])
def test_stacks_run_and_keep_their_numerics(stack):
    assert measure("gpt-tiny", stack).memory.peak_allocated_bytes > 0
    expected = {("ckpt", "opt-in-bwd", "amp-bf16"): {"precision"}, ("sac", "foreach-off", "init-on-device"):
                {"bitwise"}, ("ckpt", "fused-adam"): {"equivalent"},
                ("init-on-device", "bf16", "opt-in-bwd"): {"precision"}}[stack]
    assert verdict("gpt-tiny", stack).verdict in expected


def test_ckpt_and_opt_in_bwd_stack_their_savings():
    peak = lambda *s: measure("gpt-tiny", s).memory.peak_allocated_bytes  # noqa: E731
    both, ckpt, base = peak("ckpt", "opt-in-bwd"), peak("ckpt"), peak()
    assert both < ckpt < base
