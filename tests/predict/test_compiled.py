"""torch.compile said plainly: under a dispatch mode Dynamo runs a compiled forward eager, so a prediction (and a
run's recording pass) sees the eager model; each says so (predict/compiled.py, measure.Session.record_timeline)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from membench import api, private
from membench.predict import compiled, verdict
from membench.predict.emulate import versions
from membench.predict.run import predict
from tests.helpers import session_for, spec


class Decorated(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(16, 16)

    @torch.compile
    def forward(self, x):
        return self.inner(x)


def _build(how: str) -> nn.Module:
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 4))
    if how == "torch.compile(model)":
        return torch.compile(model)
    if how == "model.compile()":
        model.compile()
    if how == "submodule.compile()":
        model[2].compile()
    return model


def _batch(n, generator):
    return torch.randn(n, 16, generator=generator), torch.randint(0, 4, (n,), generator=generator)


def test_the_compiled_modules_are_named_outermost_first():
    assert private.compiled_modules(_build("eager")) == []
    assert private.compiled_modules(_build("torch.compile(model)")) == [""]  # its _orig_mod is not named again
    assert private.compiled_modules(_build("model.compile()")) == [""]
    assert private.compiled_modules(_build("submodule.compile()")) == ["2"]
    assert private.compiled_modules(nn.Sequential(nn.ReLU(), Decorated())) == ["1"]


@pytest.mark.parametrize("how", ["torch.compile(model)", "model.compile()", "submodule.compile()"])
def test_a_compiled_model_is_predicted_eager_and_says_so(how):
    eager = predict(spec(api.register(lambda: _build("eager"), _batch, name="eager"), batch_size=8, device="cuda"))
    record = predict(spec(api.register(lambda: _build(how), _batch, name="compiled"), batch_size=8, device="cuda"))
    assert record.status == eager.status == "ok", record.error
    assert record.memory.peak_allocated_bytes == eager.memory.peak_allocated_bytes  # the eager model's, exactly
    notes = [a for a in record.assumed if a.startswith(compiled.PREFIX)]
    which = "the forward of module '2' is" if how == "submodule.compile()" else "the model's forward is"
    assert notes == [f"{compiled.PREFIX} {which} compiled and predicted eager (under a dispatch mode Dynamo runs it "
                     "eager): a compiled step can keep other intermediates (Inductor fuses ops), so its memory can "
                     "differ"]
    assert not [a for a in eager.assumed or [] if a.startswith(compiled.PREFIX)]


def test_the_cli_says_it_on_a_line_of_its_own():
    @dataclasses.dataclass
    class Predicted:
        assumed: list[str] | None
        cannot_see: list[str] | None = None

    note = compiled.note(_build("model.compile()"))
    lines = verdict.assumptions([Predicted([note, "a value read back"]), Predicted([note]), Predicted(None)], None,
                                explain=False)
    assert lines[2:] == [note, "Assumed: a value read back."]  # after the two lines on what a CPU prediction is


def test_the_recording_pass_says_it_ran_a_compiled_model_eager(tmp_path):
    key = api.register(lambda: _build("model.compile()"), _batch, name="compiled")
    session = session_for(spec(key, batch_size=8).run)
    session.build()
    info = session.record_timeline(tmp_path / "run")
    assert info.ran_eager == ("torch.compile: the model's forward ran eager in this pass; the measured step ran "
                              "eager too (a CPU run's meter is one)")
    session.detach()
    plain = session_for(spec(api.register(lambda: _build("eager"), _batch, name="eager"), batch_size=8).run)
    plain.build()
    assert plain.record_timeline(tmp_path / "plain").ran_eager is None
    plain.detach()


def test_this_torchs_dynamo_runs_compiled_code_eager_under_a_dispatch_mode():
    """torch 2.14's Dynamo skips a frame called under a dispatch mode (torch 2.4's compiles it): nothing to turn
    off here, so a prediction leaves Dynamo as it is."""
    assert private.dynamo_compiles_under_dispatch_modes() is (versions.release() == "2.4")


def test_where_dynamo_would_compile_a_prediction_turns_it_off(monkeypatch):
    compiled_calls = []

    def backend(graph, example_inputs):
        compiled_calls.append(graph)
        return graph.forward

    monkeypatch.setattr(private, "dynamo_compiles_under_dispatch_modes", lambda: True)  # as on torch 2.4
    torch._dynamo.reset()
    try:
        double = torch.compile(lambda x: x * 2, backend=backend)
        with private.dynamo_eager():
            assert torch.equal(double(torch.ones(3)), torch.full((3,), 2.0))
        assert compiled_calls == []
    finally:
        torch._dynamo.reset()  # config.disable marked the code it met as skipped: forget it
