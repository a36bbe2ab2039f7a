from membench.techniques.base import Technique


class OptimizerOffload(Technique):
    """Trades host<->device copies and a host-speed step for device memory: the optimizer and its state (Adam's
    two moments) live in host memory on a host copy of the parameters (ZeRO-Offload style). Each step copies
    the gradients to the host, steps there, copies the parameters back, and frees the device gradients.

    Meaningless on CPU; predicted for CUDA, the host memory apart (predict/emulate/off_device.py). Conflicts
    with fsdp-offload (which offloads the sharded optimizer already; with fsdp, use fsdp-offload) and with
    opt-in-bwd (its per-parameter steps happen on the device inside backward).
    """

    name = "opt-offload"
    summary = "optimizer state and step in host memory: no Adam state on the device, slow host step"
    cost = "high"
    devices = ("cuda",)
    conflicts = ("fsdp-offload", "opt-in-bwd", "fsdp")
    conflict_reason = "with FSDP use fsdp-offload; opt-in-bwd steps on the device inside backward"
    order = 70
    numerics = "rounding"

    def configure(self, state) -> None:
        import torch

        pin = torch.cuda.is_available()
        # A CUDA prediction's host copies, told apart from device memory (predict/emulate/off_device.py): a pinned
        # copy of each parameter, and of each gradient (a non-blocking copy to the host lands in pinned memory).
        move = state.host_memory
        pairs = []
        for p in state.model.parameters():
            if p.requires_grad:
                if move is not None:
                    pairs.append((p, move.pinned_copy(p.detach()).requires_grad_()))
                    continue
                host = p.detach().to("cpu", copy=True)
                pairs.append((p, (host.pin_memory() if pin else host).requires_grad_()))
        optimizer = state.make_optimizer([h for _, h in pairs])
        inner_step = state.step_optimizer  # e.g. a gradient scaler's step, which unscales the host gradients
        inner_unscale = state.unscale_gradients  # a gradient scaler's unscale_, before clipping
        on_host = [False]  # this step's gradients were moved already (before clipping)

        def to_host() -> None:
            if on_host[0]:
                return
            for p, host in pairs:
                if p.grad is None or move is None:
                    host.grad = None if p.grad is None else p.grad.to("cpu", non_blocking=pin)
                else:
                    host.grad = move.pinned_copy(p.grad)
                p.grad = None
            if pin:
                torch.cuda.synchronize()  # the gradients must have landed before the host reads them
            on_host[0] = True

        def unscale(opt) -> None:
            # Clipping (train_step) reads the gradients the optimizer steps on, and a scaler unscales the ones its
            # step will check for infs: the host copies, so they move first.
            to_host()
            inner_unscale(opt)

        def step(opt) -> None:
            to_host()
            inner_step(opt)
            on_host[0] = False
            with torch.no_grad():
                for p, host in pairs:
                    p.copy_(host, non_blocking=pin)

        state.optimizers = [optimizer]
        state.step_optimizer = step
        state.unscale_gradients = unscale
