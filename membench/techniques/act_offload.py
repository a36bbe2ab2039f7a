from membench.techniques.base import Technique


class ActivationOffload(Technique):
    """Trades host<->device bandwidth for activation memory: every tensor autograd saves for backward is copied
    to host memory in forward and back in backward (torch.autograd.graph.save_on_cpu), so device memory holds
    only the activations of the op being computed. The numbers are unchanged.

    Meaningless on CPU, where activations already live in host memory.
    """

    name = "act-offload"
    summary = "keep saved activations in host memory (save_on_cpu): less device memory, PCIe traffic each step"
    cost = "high"
    devices = ("cuda",)
    predictable = False  # on CPU, host and device memory are one
    order = 45

    def configure(self, state) -> None:
        import torch

        pin = torch.cuda.is_available()  # pinned host memory makes the copies asynchronous; CPU tests go without
        state.forward_contexts.append(lambda: torch.autograd.graph.save_on_cpu(pin_memory=pin))
