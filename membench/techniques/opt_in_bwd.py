from membench.techniques.base import Technique


class OptimizerInBackward(Technique):
    """Trades optimizer kernel fusion for gradient memory: each parameter is stepped, and its gradient freed,
    as soon as its gradient is accumulated in backward (Tensor.register_post_accumulate_grad_hook).

    At most one parameter's gradient is alive at a time, so the peak no longer holds all gradients. Each
    parameter gets its own optimizer (foreach=False), so no foreach intermediates either.
    """

    name = "opt-in-bwd"
    summary = "step the optimizer inside backward, per parameter: no full set of gradients, no foreach buffers"
    cost = "low"
    conflicts = ("accum",)  # a step per micro-batch would not be accumulation any more
    conflict_reason = "a step per micro-batch would not be accumulation any more"
    order = 60

    def configure(self, state) -> None:
        optimizers = {}
        for p in state.model.parameters():
            if p.requires_grad:
                optimizers[p] = state.make_optimizer([p], foreach=False)
                p.register_post_accumulate_grad_hook(_step_and_free(optimizers[p]))
        state.optimizers = list(optimizers.values())
        state.step_optimizers = False


def _step_and_free(optimizer):
    def hook(param):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return hook
