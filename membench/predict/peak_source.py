"""What a causal LM's predicted peak holds of its loss: the fp32 logits-sized tensors live at it.

An LLM's vocabulary makes its logits the largest tensors of a step, and its loss keeps several of them in fp32:
Hugging Face's ForCausalLMLoss upcasts the whole logits (`logits = logits.float()`, transformers/loss/loss_utils.py),
cross-entropy's log_softmax saves its fp32 output for backward, and backward makes the gradient of nll_loss and of
log_softmax, each as large again. A prediction counts the storages of exactly that size (micro-batch x tokens x
vocabulary x 4 B) live at its peak and names them, with their share of it; chunked-ce makes them a chunk at a time.
"""

from __future__ import annotations

from membench.common.units import fmt_bytes


def logits_note(events: list, measured_from: int, round_to: int, peak_bytes: int, tokens: int,
                vocab: int | None) -> str | None:
    """The sentence naming the fp32 logits-sized tensors at the trace's peak (within the measured step), or None
    where there are none (or the trace is not kept)."""
    if not events or not vocab or not tokens:
        return None
    size = tokens * vocab * 4
    count = _live_at_peak(events, measured_from, round_to, size)
    if not count:
        return None
    share = count * size / peak_bytes if peak_bytes else 0.0
    return (f"{count} fp32 logits-sized tensor{'s' if count > 1 else ''} ({fmt_bytes(size)} each: {tokens} tokens x "
            f"{vocab} vocabulary x 4 B) make {share:.0%} of the peak: the loss's fp32 logits (Hugging Face's "
            "ForCausalLMLoss upcasts them whole: logits.float()), the log-probabilities cross-entropy saves for "
            "backward, and their gradients in backward; chunked-ce makes them one chunk of tokens at a time")


def _live_at_peak(events: list, measured_from: int, round_to: int, size: int) -> int:
    """How many storages of `size` raw bytes are live at the highest point of the measured step's trace."""
    live: dict = {}
    current = matching = 0
    best, at_best = -1, 0
    for index, event in enumerate(events):
        if event.kind == "alloc":
            rounded = -(-event.size // round_to) * round_to
            live[event.key] = (rounded, event.size == size)
            current += rounded
            matching += event.size == size
        elif event.kind == "free" and event.key in live:
            rounded, matched = live.pop(event.key)
            current -= rounded
            matching -= matched
        if index >= measured_from and current > best:
            best, at_best = current, matching
    return at_best


def output_vocabulary(model) -> int | None:
    """The output projection's width: a transformers model's output embeddings, or a module named `head`. None
    where another linear layer is as wide (gpt-tiny's MLP: 256, as its vocabulary), so that tensors of the logits'
    size would not all be the loss's."""
    from torch import nn

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else getattr(model, "head", None)
    vocab = getattr(head, "out_features", None)
    others = [m.out_features for m in model.modules() if isinstance(m, nn.Linear) and m is not head]
    return None if vocab is None or any(width >= vocab for width in others) else vocab
