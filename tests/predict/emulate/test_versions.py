"""Versions stated, not assumed: the autocast lists are the installed torch's, Adam's priming checks the signature it
calls, and a prediction under a torch release its other rules were not checked on says which (versions.py).

The last test runs only under a torch older than 2.14, e.g. in a venv made with `pip install torch==2.9.1
torchvision==0.24.1 pandas matplotlib tabulate rich pytest "transformers>=4.40,<5"` or, the oldest pyproject
allows, `pip install torch==2.4.1 torchvision==0.19.1 "numpy<2" pandas matplotlib tabulate rich pytest
transformers==4.44.2`, from the repository root:
`PYTHONPATH=$PWD VENV/bin/python -m pytest -q -p no:cacheprovider tests/predict/emulate/test_versions.py`.
"""

from __future__ import annotations

import pytest
import torch

from membench import private
from membench.common.errors import UserError
from membench.predict.emulate import autocast, versions
from membench.predict.run import predict
from tests.helpers import spec

HEADER = """#define AT_FORALL_LOWER_PRECISION_FP(_)  \\
  _(_convolution, deprecated)            \\
  _(mm)

#define AT_FORALL_FP32(_) \\
  _(acos)             \\
  _(rms_norm)

#define AT_FORALL_FP32_SET_OPT_DTYPE(_) \\
  _(sum)                                \\
  _(sum, dim_IntList)
#define AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(_) \\
  _(ADD_NS(norm), "norm.Scalar")

#define AT_FORALL_PROMOTE(_) \\
  _(tensordot)               \\
  _(scatter_add)"""


def test_the_lists_are_read_from_a_header_as_the_macros_give_them():
    """Overloads joined with '.', each macro up to its last continued line (2.9's ends the file without a blank
    line, and its FP32_SET_OPT_DTYPE is followed at once by another macro)."""
    lists = autocast.lists_from_header(HEADER, "test")
    assert lists.lower_precision_fp == ("_convolution.deprecated", "mm")
    assert lists.fp32 == ("acos", "rms_norm")
    assert lists.fp32_set_opt_dtype == ("sum", "sum.dim_IntList")
    assert lists.promote == ("tensordot", "scatter_add")
    with pytest.raises(ValueError, match="AT_FORALL_PROMOTE"):
        autocast.lists_from_header(HEADER.split("#define AT_FORALL_PROMOTE")[0], "test")


def test_the_installed_torchs_lists_are_used():
    lists = autocast.cuda_lists()
    if lists.source.startswith("read from"):
        assert lists.source.endswith("autocast_mode.h")
    if versions.release() == "2.14":  # the copies are 2.14's: this torch's header gives the same
        copied = autocast.COPIED
        assert (lists.lower_precision_fp, lists.fp32, lists.fp32_set_opt_dtype, lists.promote) == (
            copied.lower_precision_fp, copied.fp32, copied.fp32_set_opt_dtype, copied.promote)


def test_a_release_outside_what_was_checked_says_which_parts_may_differ():
    assert versions.notice("2.14.1+cu130") is None
    line = versions.notice("2.9.1+cu128")
    assert line.startswith("torch 2.9.1+cu128: CUDA rules not checked on this release")
    assert "reductions' vector widths" in line
    assert "cuBLAS and cuBLASLt workspace sizes (checked on torch 2.11, 2.14)" in line
    assert "host tensors" not in line  # torch 2.9's optimizers keep their step counts as 2.14's do
    assert len(versions.unchecked("2.4.0")) == len(versions.RULES) - 1  # its optimizers' host tensors were read
    assert len(versions.unchecked("2.13.0")) == len(versions.RULES)
    assert "CUDA output dtypes" not in versions.notice("2.11.0+cu130")


def test_adam_is_primed_only_through_the_signature_it_was_written_for(monkeypatch):
    """torch 2.4's AdamW._init_group takes `amsgrad` third: there the warm-up step is run instead of the priming."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))])

    def init_group_2_4(self, group, params_with_grad, grads, amsgrad, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                       state_steps):
        raise AssertionError("called with 2.14's arguments")

    monkeypatch.setattr(torch.optim.AdamW, "_init_group", init_group_2_4)
    assert private.make_adam_state(optimizer) is False
    monkeypatch.undo()
    optimizer.param_groups[0]["params"][0].grad = torch.zeros(2)
    written_for = private._init_group_arguments(optimizer) == private._ADAM_INIT  # False on torch 2.4
    assert private.make_adam_state(optimizer) is written_for and len(optimizer.state) == int(written_for)


@pytest.mark.skipif(versions.release() == "2.14", reason="checks a torch release older than 2.14 (run it in a "
                    "venv with e.g. torch 2.9.1: the module's docstring)")
@pytest.mark.parametrize("workload, optimizer", [("gpt-tiny", "adamw"), ("gpt-tiny", "adafactor"),
                                                 ("hf:gpt2", "adamw")])
def test_an_older_torch_predicts_and_says_what_may_differ(workload, optimizer):
    if workload.startswith("hf:"):
        pytest.importorskip("transformers")
    if optimizer == "adafactor" and not hasattr(torch.optim, "Adafactor"):  # torch < 2.5: one line says so
        with pytest.raises(UserError, match=r"optimizer adafactor needs torch >= 2.5 .*; this is torch 2\."):
            predict(spec(workload, ("ckpt",), batch_size=1, device="cuda", optimizer=optimizer, seq_len=64))
        return
    record = predict(spec(workload, ("ckpt",), batch_size=1, device="cuda", optimizer=optimizer, seq_len=64))
    assert record.status == "ok", record.error
    assert versions.notice() in record.assumed


def test_hopper_and_blackwell_take_the_large_cublas_workspace():
    from membench.predict.gpus import cublas_workspace_bytes

    for major in (9, 10, 12):
        assert cublas_workspace_bytes((major, 0), env={}) == 32 * 2**20
    for capability in ((8, 0), (8, 9), (7, 5), (11, 0)):
        assert cublas_workspace_bytes(capability, env={}) == 4096 * 1024 * 2 + 16 * 1024 * 8 == 8_519_680
