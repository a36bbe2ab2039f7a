"""Automatic mixed precision: matmuls in 16 bits under torch.autocast, parameters and optimizer in fp32."""

from membench.techniques.base import Technique


class AmpBf16(Technique):
    """Trades precision for activation memory and speed: autocast runs matmuls and attention in bf16, so
    activations saved for backward are half the size; parameters, gradients and Adam state stay fp32.

    bf16 has fp32's range, so no loss scaling. Conflicts with the other precision choices: one format per run.
    """

    name = "amp-bf16"
    summary = "autocast to bf16: half-size activations, faster matmuls; params/grads/optimizer stay fp32"
    numerics = "precision"
    conflicts = ("amp-fp16", "bf16")
    conflict_reason = "one numeric format per run: amp-bf16, amp-fp16 or bf16"
    autocast_dtype = "bfloat16"  # torch's name: the registry is read without importing torch
    order = 40

    def configure(self, state) -> None:
        import torch

        device_type, dtype = state.device.type, getattr(torch, self.autocast_dtype)
        state.forward_contexts.append(lambda: torch.autocast(device_type, dtype=dtype))


class AmpFp16(AmpBf16):
    """Like amp-bf16 in fp16, whose narrow range needs a gradient scaler: the loss is multiplied before backward,
    the gradients unscaled before the step, and a step with inf/nan gradients is skipped.

    Conflicts with opt-in-bwd: the scaler must see every gradient for infs before any parameter steps, and
    in-backward steps happen before the last gradient exists. Conflicts with fsdp/fsdp-offload: the scaler's inf
    check is per rank, so ranks could skip different steps (FSDP's mixed precision or amp-bf16 are the way there).
    """

    name = "amp-fp16"
    summary = "autocast to fp16 with a gradient scaler: like amp-bf16, plus loss scaling and skipped inf steps"
    conflicts = ("amp-bf16", "bf16", "opt-in-bwd", "fsdp", "fsdp-offload")
    conflict_reason = ("one numeric format per run; the gradient scaler must see all gradients before any step "
                       "(not with opt-in-bwd) and would skip steps per rank under FSDP")
    autocast_dtype = "float16"

    def configure(self, state) -> None:
        import torch

        super().configure(state)
        scaler = torch.amp.GradScaler(state.device.type)

        def step(optimizer) -> None:
            scaler.step(optimizer)
            scaler.update()  # one optimizer per step (opt-in-bwd, the only many-optimizer technique, conflicts)

        state.scale_loss = scaler.scale
        state.unscale_gradients = scaler.unscale_
        state.step_optimizer = step
