"""What a new user tries first: their own optimizer, Hugging Face models by name, a model defined in a notebook,
their own package from the working directory, and the small things (--version, progress, report file)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch import nn

import membench
import membench.api
from membench import optimizers
from membench.common.errors import UserError
from membench.common.install import extra_hint
from membench.predict.run import predict_memory
from membench.spec import OPTIMIZERS
from membench.workloads import Workload, load_workload
from tests.helpers import spec, verdict

# --- item 7: optimizers ------------------------------------------------------------------------------------------


def expected_state_bytes(optimizer: str, params: list[torch.Tensor]) -> int:
    """Each optimizer's state, derived from the parameter shapes (torch/optim/{adam,sgd,_adafactor}.py)."""
    step = 4  # a 0-d fp32 `step` tensor per parameter (Adam, AdamW, Adafactor)
    if optimizer in ("adam", "adamw"):
        return sum(2 * p.numel() * p.element_size() + step for p in params)  # exp_avg, exp_avg_sq
    if optimizer == "sgd-momentum":
        return sum(p.numel() * p.element_size() for p in params)  # momentum_buffer
    if optimizer == "sgd":
        return 0
    assert optimizer == "adafactor"
    total = 0
    for p in params:
        if p.dim() >= 2:  # factored: row_var (last dim 1) and col_var (second-to-last dim 1)
            rows, cols = p.numel() // p.shape[-1], p.numel() // p.shape[-2]
            total += (rows + cols) * p.element_size() + step
        else:  # vectors keep a full second moment
            total += p.numel() * p.element_size() + step
    return total


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("techniques", [(), ("opt-in-bwd",)])
def test_prediction_counts_each_optimizers_state_exactly(optimizer, techniques):
    params = list(load_workload("gpt-tiny").build_model().parameters())
    memory = predict_memory(spec("gpt-tiny", techniques, batch_size=2, optimizer=optimizer, device="cpu"))
    assert memory.current_breakdown["optimizer_state"] == expected_state_bytes(optimizer, params)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd-momentum", "adafactor", "tests.workloads:rmsprop"])
def test_opt_in_bwd_trains_the_same_model_with_each_optimizer(optimizer):
    assert verdict("gpt-tiny", ("opt-in-bwd",), optimizer=optimizer).verdict == "bitwise"


def test_a_users_optimizer_factory_is_built_from_the_parameters_with_the_runs_lr():
    params = [nn.Parameter(torch.zeros(3, 4))]
    opt = optimizers.make("tests.workloads:rmsprop", params, lr=0.5, foreach=False)
    assert isinstance(opt, torch.optim.RMSprop) and opt.param_groups[0]["lr"] == 0.5
    memory = predict_memory(spec("gpt-tiny", batch_size=2, optimizer="tests.workloads:rmsprop", device="cpu"))
    model = load_workload("gpt-tiny").build_model()
    assert memory.current_breakdown["optimizer_state"] == sum(4 * p.numel() + 4 for p in model.parameters())


@pytest.mark.slow
def test_a_workload_names_its_default_optimizer_and_the_flag_overrides_it():
    jobs = membench.api.plan("tests.workloads:mlp_adafactor", "baseline", 4, "cpu")
    assert jobs[0].run.optimizer == "adafactor"
    jobs = membench.api.plan("tests.workloads:mlp_adafactor", "baseline", 4, "cpu", optimizer="sgd")
    assert jobs[0].run.optimizer == "sgd"
    assert membench.api.plan("vit-tiny", "baseline", 4, "cpu")[0].run.optimizer == "adam"


@pytest.mark.parametrize("optimizer,message", [
    ("lamb", "unknown optimizer 'lamb'"),
    ("nosuch.module:make", "cannot import optimizer module 'nosuch.module'"),
])
def test_bad_optimizers_are_one_line(optimizer, message):
    with pytest.raises(UserError, match=message):
        membench.api.plan("vit-tiny", "baseline", 4, "cpu", optimizer=optimizer)


def test_fused_needs_an_optimizer_with_a_fused_step():
    with pytest.raises(UserError, match="fused-adam needs an optimizer with a fused step"):
        membench.api.plan("vit-tiny", "fused-adam", 4, "cpu", optimizer="adafactor")


# --- item 2: Hugging Face models by name, --seq-len ---------------------------------------------------------------

TINY_GPT2 = "hf:gpt2,n_layer=2,n_embd=64,n_head=2,vocab_size=256,n_positions=128"
TINY_BERT = "hf:bert,num_hidden_layers=2,hidden_size=64,num_attention_heads=2,intermediate_size=128,vocab_size=256"
TINY_LLAMA = ("hf:llama,num_hidden_layers=2,hidden_size=64,num_attention_heads=2,num_key_value_heads=1,"
              "intermediate_size=128,vocab_size=256")
TINY_VIT = "hf:vit,num_hidden_layers=2,hidden_size=32,num_attention_heads=2,intermediate_size=64,image_size=32," \
           "patch_size=8"
needs_transformers = pytest.mark.skipif(not any(p for p in sys.modules if p == "transformers") and
                                        __import__("importlib").util.find_spec("transformers") is None,
                                        reason="transformers is not installed (the [hf] extra)")


@needs_transformers
@pytest.mark.parametrize("name,head", [(TINY_GPT2, "GPT2LMHeadModel"), (TINY_LLAMA, "LlamaForCausalLM"),
                                       (TINY_BERT, "BertForMaskedLM"),
                                       (TINY_BERT + ",head=seq-cls", "BertForSequenceClassification"),
                                       (TINY_VIT, "ViTForImageClassification")])
def test_hf_models_by_name_predict_exactly_what_a_cpu_run_measures(name, head):
    from tests.helpers import measure

    workload = load_workload(name)
    assert type(workload.build_model()).__name__ == head
    text = not name.startswith("hf:vit")
    job = spec(name, ("ckpt",), batch_size=2, device="cpu", **({"seq_len": 16} if text else {}))
    predicted = predict_memory(job)
    measured = measure(name, ("ckpt",), batch_size=2, **({"seq_len": 16} if text else {})).memory
    # Exact, except where transformers branches on tensor values: it skips building the boolean causal mask
    # (batch x seq x seq bytes) only after checking the position tensor's values, which a fake tensor does not
    # have (transformers.utils.is_tracing treats fake tensors as tracing), so a prediction may keep one mask more.
    mask = 2 * 16 * 16
    assert 0 <= predicted.peak_allocated_bytes - measured.peak_allocated_bytes <= (mask if text else 0)
    assert predicted.peak_phase == measured.peak_phase
    assert predicted.current_breakdown == measured.current_breakdown  # parameters, optimizer state: exact


@pytest.mark.slow
@needs_transformers
def test_hf_checkpointing_and_optimizer_in_backward_train_the_same_model():
    assert verdict(TINY_GPT2, ("ckpt",), seq_len=16).verdict == "bitwise"
    assert verdict(TINY_GPT2, ("opt-in-bwd",), seq_len=16, optimizer="adamw").verdict == "bitwise"


@needs_transformers
def test_seq_len_sets_the_tokens_of_every_text_workload():
    for name in ("gpt-tiny", TINY_GPT2):
        workload = load_workload(name, seq_len=24)
        tokens, _ = workload.make_batch(3, torch.Generator().manual_seed(0))
        assert tokens.shape == (3, 24) and workload.items_per_sample == 24
    with pytest.raises(UserError, match="--seq-len is for text workloads"):
        load_workload("vit-tiny", seq_len=24)
    with pytest.raises(UserError, match="longer than"):
        load_workload(TINY_GPT2, seq_len=4096)


def test_old_results_without_seq_len_still_pair_with_new_runs():
    from membench.spec import Job

    job = spec("gpt-tiny")
    old = job.to_dict()
    del old["run"]["seq_len"]
    assert Job.from_dict(old).run == job.run


@pytest.mark.slow
def test_missing_transformers_is_one_line(tmp_path):
    (tmp_path / "transformers.py").write_text("raise ImportError('planted: not installed')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ["PYTHONPATH"]])}
    proc = subprocess.run([sys.executable, "-m", "membench", "predict", "--workload", "hf:gpt2"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)  # its folder: not the clone's
    assert proc.returncode == 2
    # the hint for how membench was installed here: from a clone, `pip install -e "<clone>[hf]"` (membench[hf] is
    # not on the package index)
    assert proc.stderr == f"membench: error: Hugging Face workloads need transformers: {extra_hint('hf')}\n"


# --- item 3: a model defined in a notebook ------------------------------------------------------------------------


def _tiny_model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 32), nn.ReLU(), nn.Linear(32, 10))


def _images(batch_size: int, generator: torch.Generator):
    return torch.randn(batch_size, 3, 8, 8, generator=generator), torch.randint(0, 10, (batch_size,),
                                                                                 generator=generator)


def _in_a_fresh_process(test) -> bool:
    """Run a fork test in a fresh pytest process, as in a new notebook: what earlier tests did with autograd in
    this process can make torch refuse autograd in a forked child. True: it ran there (and passed)."""
    if os.environ.get("MEMBENCH_TEST_FRESH"):
        return False
    # -m "": the test itself may be marked slow, which the default addopts deselect.
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "",
                    f"{__file__}::{test.__name__}"],
                   check=True, timeout=600, cwd=os.path.dirname(os.path.dirname(__file__)),
                   env={**os.environ, "MEMBENCH_TEST_FRESH": "1"})
    return True


@pytest.mark.slow
def test_run_sweep_takes_a_model_function_and_runs_each_in_a_forked_child(tmp_path):
    from membench.launch.fork import InProcessWarning

    this = test_run_sweep_takes_a_model_function_and_runs_each_in_a_forked_child
    if _in_a_fresh_process(this):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error", InProcessWarning)  # forked, not in this process
        frame = membench.run_sweep(_tiny_model, "opt-in-bwd", batch_size=4, device="cpu", out=tmp_path, steps=1,
                                   warmup=1, make_batch=_images)
    assert list(frame["run"]) == ["baseline", "opt-in-bwd"] and set(frame["status"]) == {"ok"}
    assert list(frame["equivalence"]) == ["reference", "bitwise"]
    assert (tmp_path / "baseline.json").exists() and "_tiny_model" in (tmp_path / "baseline.json").read_text()


@pytest.mark.slow
def test_a_crash_in_a_notebook_model_ends_only_its_forked_run(tmp_path):
    if _in_a_fresh_process(test_a_crash_in_a_notebook_model_ends_only_its_forked_run):
        return

    def build():
        os._exit(3)  # the model takes its process down: in a child, not in the caller

    frame = membench.run_sweep(Workload(build, _images, membench.api._default_loss),
                               "baseline", batch_size=4, device="cpu", out=tmp_path, steps=1, warmup=0,
                               name="crashes")
    assert list(frame["status"]) == ["error"]


def test_when_torch_refuses_autograd_in_the_child_the_run_moves_into_this_process(tmp_path, monkeypatch):
    from membench.child import worker
    from membench.launch import fork

    parent, real_run = os.getpid(), worker.run

    def run(job, out):  # in the forked child: what torch says after an unforkable use of autograd in the parent
        if os.getpid() == parent:
            return real_run(job, out)
        raise SystemExit(worker.write_record(out, worker.RunRecord(
            name=job.name, status="error", spec=job,
            error=f"RuntimeError during warmup: Unable to handle autograd's threading ... {fork.AUTOGRAD_FORK}")))

    monkeypatch.setattr(worker, "run", run)
    monkeypatch.setattr(fork, "why_not_fork", lambda device: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = membench.run_sweep(_tiny_model, "baseline", batch_size=4, device="cpu", out=tmp_path, steps=1,
                                   warmup=0, make_batch=_images, check=False, timeline=False)
    assert list(frame["status"]) == ["ok"]
    assert any("autograd refused to run in the forked child" in str(w.message) for w in caught)


def test_where_it_cannot_fork_it_runs_in_process_and_says_what_that_costs(tmp_path, monkeypatch):
    from membench.launch import fork

    monkeypatch.setattr(fork, "why_not_fork", lambda device: "fork is used only on Linux (this is darwin)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = membench.run_sweep(_tiny_model, "baseline", batch_size=4, device="cpu", out=tmp_path, steps=1,
                                   warmup=0, make_batch=_images, check=False, timeline=False)
    assert list(frame["status"]) == ["ok"]
    [warning] = [w for w in caught if issubclass(w.category, fork.InProcessWarning)]
    assert "ends your own process" in str(warning.message) and "darwin" in str(warning.message)


def test_a_model_function_without_make_batch_is_refused():
    with pytest.raises(UserError, match="needs make_batch"):
        membench.run_sweep(_tiny_model, "baseline", device="cpu")


# --- item 1 and 8: their own package, --version, predict on cpu, the report file ---------------------------------


def _cli(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "membench", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


@pytest.mark.slow
def test_module_factory_resolves_from_the_working_directory_and_default_techniques_fit_the_model(tmp_path):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "bench.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn
        from membench.workloads import Workload

        def my_model():
            return Workload(build_model=lambda: nn.Sequential(nn.Flatten(), nn.Linear(12, 4)),
                            make_batch=lambda b, g: (torch.randn(b, 12, generator=g),
                                                     torch.randint(0, 4, (b,), generator=g)),
                            loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]))
    """))
    proc = _cli("predict", "--workload", "mypkg.bench:my_model", "--batch-size", "4", "--device", "cpu",
                "--out", str(tmp_path / "pred"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "skipping ckpt" in proc.stderr and "CUDA" not in proc.stdout
    lines = proc.stdout.splitlines()
    dashes = next(i for i, line in enumerate(lines) if line.startswith("---"))
    assert [line.split()[0] for line in lines[dashes + 1:dashes + 4]] == ["baseline", "accum", "opt-in-bwd"]


def test_version():
    proc = _cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"membench {membench.__version__}"


@pytest.mark.slow
def test_fit_shows_each_prediction_as_it_goes():
    proc = _cli("fit", "--workload", "gpt-tiny", "--budget", "4MiB", "--techniques", "baseline", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "fit baseline: batch 2 -> " in proc.stderr and "(fits)" in proc.stderr and "(over)" in proc.stderr


@pytest.mark.slow
def test_run_ends_by_naming_the_report_file_to_open(tmp_path):
    proc = _cli("run", "--workload", "tests.workloads:mlp", "--batch-size", "4", "--device", "cpu", "--techniques",
                "baseline", "--steps", "1", "--warmup", "0", "--no-check", "--no-timeline", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last == f"open {tmp_path / 'report' / 'report.html'}" and (tmp_path / "report" / "report.html").exists()


@needs_transformers
def test_a_folder_named_like_a_model_type_does_not_shadow_it(tmp_path, monkeypatch):
    from membench.workloads import hf

    (tmp_path / "bert").mkdir()  # a results folder called bert, say
    monkeypatch.chdir(tmp_path)
    hf.load_config.cache_clear()
    assert type(hf.load_config("bert,num_hidden_layers=1")).__name__ == "BertConfig"
    with pytest.raises(UserError, match="no config for './bert'"):  # a path asks for the folder, which has none
        hf.load_config("./bert")


@needs_transformers
def test_gpt2_names_its_causal_lm_loss_so_transformers_does_not_warn():
    from transformers.loss.loss_utils import LOSS_MAPPING

    model = load_workload(TINY_GPT2).build_model()
    # loss_type None is what makes transformers print "`loss_type=None` ... unrecognized"
    assert model.loss_type == "ForCausalLM" and model.loss_function is LOSS_MAPPING["ForCausalLM"]
