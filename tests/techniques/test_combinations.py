"""Stacking techniques with '+': valid stacks run, impossible ones are refused before anything runs."""

from __future__ import annotations

import itertools

import pytest

from membench.api import plan
from membench.cli import main
from membench.common.errors import UserError
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


# Written from what each pair does, not read from the techniques' declarations: one step or one precision at a time,
# one owner of the optimizer step, one owner of the parameters, one kind of checkpointing, and GradScaler (amp-fp16)
# needs the whole backward before any optimizer step, which opt-in-bwd and FSDP's sharded gradients do not give it.
CONFLICTS = {frozenset(pair) for pair in [
    ("accum", "opt-in-bwd"),
    ("amp-bf16", "amp-fp16"), ("amp-bf16", "bf16"), ("amp-fp16", "bf16"),
    ("fused-adam", "foreach-off"),
    ("sac", "ckpt"),
    ("fsdp", "fsdp-offload"), ("opt-offload", "fsdp"), ("opt-offload", "fsdp-offload"), ("opt-offload", "opt-in-bwd"),
    ("amp-fp16", "opt-in-bwd"), ("amp-fp16", "fsdp"), ("amp-fp16", "fsdp-offload"),
    ("tp", "fsdp-offload"), ("tp", "opt-offload"), ("tp", "amp-fp16"),
    # chunked-ce calls the trunk and the output projection itself, around the root module's FSDP and TP hooks.
    ("chunked-ce", "fsdp"), ("chunked-ce", "fsdp-offload"), ("chunked-ce", "tp"),
    # one adapter per run (qlora is lora over 4-bit weights); membench does not shard, offload or split a peft
    # model's or bitsandbytes' 4-bit weights with these yet (lora+fsdp it does: FSDP2 over the peft model)
    ("lora", "qlora"), ("lora", "tp"), ("lora", "opt-offload"), ("lora", "fsdp-offload"),
    ("qlora", "tp"), ("qlora", "opt-offload"), ("qlora", "fsdp-offload"), ("qlora", "fsdp"),
    # compile is measured on single-device stacks only (docs/compile.md): not sharded, not offloaded
    ("compile", "fsdp"), ("compile", "fsdp-offload"), ("compile", "tp"), ("compile", "act-offload"),
    ("compile", "opt-offload"),
]}
CUDA_ONLY = {"opt-offload", "act-offload", "fsdp-offload", "expandable-segments"}  # they move memory off the GPU


def refused(stack: tuple[str, ...], device: str) -> bool:
    try:
        check_stack(stack, device)
    except UserError:
        return True
    return False


def test_exactly_the_known_conflicts_are_refused_in_either_order():
    techniques = [n for n in REGISTRY if n != "baseline"]
    assert {n for pair in CONFLICTS for n in pair} <= set(techniques)
    wrong = [(a, b) for a, b in itertools.permutations(techniques, 2)
             if refused((a, b), "cuda") != (frozenset((a, b)) in CONFLICTS)]
    assert not wrong, f"refused or accepted against the table: {wrong}"
    for name in techniques:  # what `membench techniques` lists as each one's conflicts
        assert set(conflicts_of(name)) == {other for pair in CONFLICTS if name in pair for other in pair - {name}}


def test_on_cpu_only_conflicts_and_cuda_only_techniques_are_refused():
    techniques = [n for n in REGISTRY if n != "baseline"]
    wrong = [(a, b) for a, b in itertools.combinations(techniques, 2)
             if refused((a, b), "cpu") != (frozenset((a, b)) in CONFLICTS or bool({a, b} & CUDA_ONLY))]
    assert not wrong, f"refused or accepted on cpu against the table: {wrong}"
    for name in CUDA_ONLY:
        with pytest.raises(UserError, match=f"^technique {name} cannot run on cpu"):
            check_stack((name,), "cpu")


def test_a_bad_combination_is_refused_before_anything_runs(tmp_path, capsys):
    code = main(["run", "--device", "cpu", "--workload", "gpt-tiny", "--techniques", "ckpt,accum+opt-in-bwd",
                 "--out", str(tmp_path)])
    assert code == 2
    assert capsys.readouterr().err.startswith("membench: error: cannot combine accum with opt-in-bwd")
    assert not list(tmp_path.iterdir())


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


@pytest.mark.slow
def test_ckpt_and_opt_in_bwd_stack_their_savings():
    peak = lambda *s: measure("gpt-tiny", s).memory.peak_allocated_bytes  # noqa: E731
    both, ckpt, base = peak("ckpt", "opt-in-bwd"), peak("ckpt"), peak()
    assert both < ckpt < base
