"""trackers.memory.Meter: both meters answer every member of the protocol, with its parameters."""

from __future__ import annotations

import inspect

import pytest

from membench.trackers.memory import CpuMeter, CudaMeter, Meter, make_meter

MEMBERS = [name for name in dir(Meter) if not name.startswith("_") and callable(getattr(Meter, name))]


def test_the_protocol_names_what_measure_session_calls():
    assert set(MEMBERS) == {"attach_model", "attach_optimizers", "detach", "active", "recording", "track_inputs",
                            "phase", "start_step", "reset_peak", "current", "close", "result"}
    assert set(Meter.__annotations__) == {"device", "tracker"}


@pytest.mark.parametrize("meter", [CpuMeter, CudaMeter])
def test_each_meter_takes_every_members_parameters(meter):
    for name in MEMBERS:
        assert name in dir(meter), f"{meter.__name__} has no {name}"
        wanted = list(inspect.signature(getattr(Meter, name)).parameters)
        assert list(inspect.signature(getattr(meter, name)).parameters) == wanted, (meter.__name__, name)


def test_make_meter_on_cpu_is_a_meter():
    meter = make_meter("cpu")
    assert isinstance(meter, CpuMeter) and isinstance(meter, Meter) and meter.device == "cpu"
    assert isinstance(CudaMeter(), Meter) and CudaMeter.device == "cuda"  # no budget: no CUDA call made
