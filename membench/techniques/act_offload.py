from membench.techniques.base import Technique


class ActivationOffload(Technique):
    """Trades host<->device bandwidth for activation memory: every tensor autograd saves for backward is copied
    to host memory in forward and back in backward (torch.autograd.graph.save_on_cpu), so device memory holds
    only the activations of the op being computed. The numbers are unchanged.

    Meaningless on CPU, where activations already live in host memory. Predicted for CUDA: the pinned host copies
    apart from device memory (predict/emulate/off_device.py).
    """

    name = "act-offload"
    summary = "keep saved activations in host memory (save_on_cpu): less device memory, PCIe traffic each step"
    cost = "high"
    devices = ("cuda",)
    order = 45

    def configure(self, state) -> None:
        import torch

        if state.host_memory is not None:  # a CUDA prediction: save_on_cpu as torch does it, its copies apart
            state.forward_contexts.append(state.host_memory.save_on_cpu)
            return
        pin = torch.cuda.is_available()  # pinned host memory makes the copies asynchronous; CPU tests go without
        state.forward_contexts.append(lambda: torch.autograd.graph.save_on_cpu(pin_memory=pin))
