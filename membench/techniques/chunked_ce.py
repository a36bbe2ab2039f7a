from membench.common.errors import UserError
from membench.techniques.base import Technique

CHUNKS = 8  # torchtune's CEWithChunkedOutputLoss(num_output_chunks=8)
IGNORE_INDEX = -100


class ChunkedCrossEntropy(Technique):
    """Trades a few smaller matmuls for the fp32 logits: a causal LM's output projection runs on the hidden states
    one chunk of tokens at a time, and each chunk's logits are upcast to fp32 and reduced to a summed cross-entropy
    on their own, as torchtune's CEWithChunkedOutputLoss does (torchtune/modules/loss/ce_chunked_output_loss.py,
    with its TransformerDecoder's `[self.output(chunk) for chunk in h.tensor_split(num_output_chunks, dim=1)]`):
    the chunks' logits in the model's dtype all exist until the loss returns, but only one chunk's fp32 copy at a
    time, where Hugging Face's ForCausalLMLoss upcasts the whole logits tensor (`logits.float()`). Its backward
    likewise makes one chunk's fp32 gradients at a time. The loss is the same sum over the same tokens divided by
    their count, in another order of additions.

    For causal-LM workloads only (gpt-*, hf: causal LMs without logit scaling or capping).
    """

    name = "chunked-ce"
    summary = "logits projected and upcast to fp32 one chunk of tokens at a time (torchtune's chunked CE)"
    numerics = "rounding"
    cost = "low"
    # FSDP2's and tensor parallelism's hooks are on the model's own forward, which this loss goes around.
    conflicts = ("fsdp", "fsdp-offload", "tp")
    conflict_reason = "chunked-ce calls the model's trunk and output projection apart, around FSDP's and TP's hooks"
    order = 5

    def validate(self, spec, workload) -> None:
        if workload.causal_lm is None:
            raise UserError(f"chunked-ce needs a causal language model (gpt-*, or an hf: causal LM whose logits are "
                            f"neither scaled nor capped); {spec.workload} is not one")

    def configure(self, state) -> None:
        import dataclasses

        split = state.workload.causal_lm

        def loss_fn(model, batch):
            return chunked_loss(*split(model, batch))

        state.workload = dataclasses.replace(state.workload, loss_fn=loss_fn)


def chunked_loss(hidden, head, targets, chunks: int = CHUNKS):
    """torchtune's CEWithChunkedOutputLoss.forward on the model's chunked output: the mean over the tokens that
    have a target."""
    import torch.nn.functional as F

    total_elements = (targets != IGNORE_INDEX).sum()
    logits = [head(chunk) for chunk in hidden.tensor_split(chunks, dim=1)]
    labels = [chunk.reshape(-1) for chunk in targets.tensor_split(chunks, dim=1)]
    total_loss = 0.0
    for logits_chunk, labels_chunk in zip(logits, labels):
        logits_chunk = logits_chunk.reshape(-1, logits_chunk.size(-1))
        total_loss += F.cross_entropy(logits_chunk.float(), labels_chunk, ignore_index=IGNORE_INDEX, reduction="sum")
    return total_loss / total_elements
