from membench.techniques.base import Technique


class Bf16(Technique):
    """Trades precision for memory everywhere: parameters, gradients, Adam state and activations all in bf16,
    half of fp32's bytes. Updates smaller than bf16's 8-bit mantissa can resolve are lost (no fp32 master copy),
    so the loss drifts from the fp32 baseline; the equivalence check reports by how much.
    """

    name = "bf16"
    summary = "parameters, gradients and optimizer state in bf16: half the bytes, updates lose precision"
    numerics = "precision"
    conflicts = ("amp-bf16", "amp-fp16")
    conflict_reason = "one numeric format per run: amp-bf16, amp-fp16 or bf16"
    param_dtype = "bfloat16"
    order = 10

    def build_model(self, build, device):
        import torch

        # The usual way: build in fp32 on the host, then cast and move (init-on-device builds at bf16 directly).
        return build().to(device=device, dtype=torch.bfloat16)

    def configure(self, state) -> None:
        import torch

        move = state.batch_to_device

        def to_device(batch, device):
            return tuple(t.to(torch.bfloat16) if t.is_floating_point() else t for t in move(batch, device))

        state.batch_to_device = to_device
