"""The one training loop. Techniques change the TrainState; this file never asks which technique is on."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field

import torch
from torch import nn

from membench import optimizers
from membench.spec import RunSpec
from membench.workloads import Batch, Workload


@dataclass
class TrainState:
    """Everything one training step needs. Techniques may replace any field in `configure`."""

    spec: RunSpec
    workload: Workload
    model: nn.Module
    device: torch.device
    optimizer_options: dict = field(default_factory=dict)
    optimizers: list[torch.optim.Optimizer] | None = None  # None: one optimizer over all parameters
    step_optimizers: bool = True  # False when the optimizer already stepped inside backward
    micro_batches: int = 1
    forward_contexts: list[Callable[[], ContextManager]] = field(default_factory=list)
    scale_loss: Callable[[torch.Tensor], torch.Tensor] = lambda loss: loss
    step_optimizer: Callable[[torch.optim.Optimizer], None] = lambda opt: opt.step()
    # before clipping: amp-fp16 unscales; opt-offload moves the gradients to the host first
    unscale_gradients: Callable[[torch.optim.Optimizer], None] = lambda opt: None
    batch_to_device: Callable[[Batch, torch.device], Batch] = lambda batch, device: tuple(
        t.to(device) for t in batch)
    on_model: Callable[[nn.Module], None] | None = None  # a technique that replaces the parameters calls it again
    device_mesh: object | None = None  # sharded techniques' torch DeviceMesh, built once (techniques/mesh.py)
    # A prediction: a library optimizer whose step fake tensors cannot run, as a stand-in that makes its state
    # (predict/emulate/lowbit_optimizers.py); called with (name, params, lr, options), None for other optimizers.
    optimizer_stand_in: Callable | None = None
    # A CUDA prediction: memory offloading moves to the host, told apart from device memory
    # (predict/emulate/off_device.OffDeviceLedger); None in a run, where the tensors' devices say it.
    host_memory: object | None = None

    def make_optimizer(self, params, **overrides) -> torch.optim.Optimizer:
        """The run's optimizer (--optimizer) over params. Options a technique sets (foreach, fused) reach only an
        optimizer that takes them: foreach=False for opt-in-bwd means nothing to Adafactor's single-tensor step."""
        options = {**self.optimizer_options, **overrides}
        if self.optimizer_stand_in is not None:
            stand_in = self.optimizer_stand_in(self.spec.optimizer, params, self.spec.lr, options)
            if stand_in is not None:
                return stand_in
        return optimizers.make(self.spec.optimizer, params, lr=self.spec.lr, **options)

    def forward_context(self) -> ContextManager:
        stack = contextlib.ExitStack()
        for make in self.forward_contexts:
            stack.enter_context(make())
        return stack


def noop_phase(name: str) -> ContextManager:
    return contextlib.nullcontext()


def train_step(state: TrainState, batch: Batch, phase: Callable[[str], ContextManager] = noop_phase) -> float:
    """One optimizer step on `batch`; returns the loss (mean over the batch). `phase` marks where we are."""
    if state.spec.inference:
        return forward_step(state, batch, phase)
    with phase("inputs"):
        batch = state.batch_to_device(batch, state.device)
    n = state.micro_batches
    micro_batches = zip(*(t.chunk(n) for t in batch)) if n > 1 else [batch]
    losses = []
    for micro in micro_batches:
        with phase("forward"), state.forward_context():
            # The workload's loss is a mean over its samples; 1/n makes n micro-batches one big batch's mean.
            loss = state.workload.loss_fn(state.model, micro) / n
        with phase("backward"):
            state.scale_loss(loss).backward()
        losses.append(loss.detach())
        del loss
    with phase("optimizer"):
        if state.spec.clip_grad_norm is not None:
            for opt in state.optimizers:
                state.unscale_gradients(opt)
            # The gradients the optimizers step on: the model's own, or host copies (opt-offload moves them first).
            grads = [p for opt in state.optimizers for group in opt.param_groups for p in group["params"]
                     if p.grad is not None]
            nn.utils.clip_grad_norm_(grads, state.spec.clip_grad_norm)
        if state.step_optimizers:
            for opt in state.optimizers:
                state.step_optimizer(opt)
                # "zeros" keeps every gradient allocated between steps, as zero_grad() did before torch 2.0.
                opt.zero_grad(set_to_none=state.spec.zero_grad == "none")
    # .item() waits for the device, so a step's wall time is its real time.
    return float(sum(loss.float().item() for loss in losses))


def forward_step(state: TrainState, batch: Batch, phase: Callable[[str], ContextManager] = noop_phase) -> float:
    """--inference: the forward alone (the model in eval mode, built so by build_state), with no autograd record."""
    with phase("inputs"):
        batch = state.batch_to_device(batch, state.device)
    with phase("forward"), torch.inference_mode(), state.forward_context():
        loss = state.workload.loss_fn(state.model, batch)
    return float(loss.float().item())


def build_state(spec: RunSpec, workload: Workload, techniques, on_model: Callable[[nn.Module], None] | None = None
                ) -> TrainState:
    """Build the model (a technique may build it its own way), then let each technique configure the state."""
    device = torch.device(spec.device)
    torch.manual_seed(spec.seed)
    model = None
    for t in techniques:
        model = model or t.build_model(workload.build_model, spec.device)
    if model is None:
        model = workload.build_model().to(device)
    model.train(not spec.inference)
    if on_model is not None:
        on_model(model)  # e.g. the memory tracker's gradient hooks, before any technique adds its own
    state = TrainState(spec=spec, workload=workload, model=model, device=device, on_model=on_model)
    for t in techniques:
        t.configure(state)
    if spec.inference:
        state.optimizers = []  # nothing steps, and no optimizer state is made
    if state.optimizers is None:
        state.optimizers = [state.make_optimizer([p for p in state.model.parameters() if p.requires_grad])]
    return state


def batches(workload: Workload, spec: RunSpec, rank: int = 0, world: int = 1):
    """The same synthetic batches for every technique: batch i comes from seed + i.

    Data parallel: rank r of `world` gets the r-th slice of a batch of world x batch_size, so the ranks
    together train on exactly what one process would at that batch size.
    """
    for i in range(10**9):
        full = workload.make_batch(spec.batch_size * world, torch.Generator().manual_seed(spec.seed * 100_003 + i))
        yield full if world == 1 else tuple(t.chunk(world)[rank].contiguous() for t in full)
        # Hold no batch while the next is made: a CUDA run copies each to the GPU inside its step, after the last
        # step's copy is gone, and a prediction (whose batches are the device's) must free in that order too.
        del full


__all__ = ["TrainState", "train_step", "forward_step", "build_state", "batches"]
