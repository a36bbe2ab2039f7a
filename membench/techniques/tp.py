"""Tensor parallelism with sequence parallelism: torchtitan's plan for Llama-style blocks, over the mesh's tp ranks.

torchtitan's `apply_tp` (torchtitan/models/llama3/infra/parallelize.py), on Hugging Face's names for the same modules
(LlamaForCausalLM and the models built like it: Mistral, Qwen2, Qwen3):

- the token embedding row-wise (vocabulary sharded), its output sharded on the sequence (Shard(1));
- each RMSNorm sequence-parallel (it computes on its 1/tp of the tokens);
- attention's and the MLP's inputs all-gathered to the whole sequence (PrepareModuleInput); q/k/v and gate/up
  column-wise (each rank 1/tp of the heads and of the FFN), o and down row-wise, their outputs reduce-scattered back
  to sequence shards;
- the final norm sequence-parallel, the LM head column-wise with its logits gathered (no loss parallelism).

One difference, forced by Hugging Face's code: LlamaModel reads the sequence length from the embedding's output
(position ids, the causal mask), so that output stays a DTensor (its global shape is the whole sequence) where
torchtitan hands on the local tensor; the residual stream is then DTensors sharded on the sequence, and each block
computes what torchtitan's computes on the same shards.
"""

from __future__ import annotations

from membench.common.errors import UserError
from membench.techniques.base import Technique

# Hugging Face's module names for torchtitan's (wq, wk, wv, wo / w1, w3, w2 / attention_norm, ffn_norm).
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
NORMS = ("input_layernorm", "post_attention_layernorm")


def _divides(tp: int, what: dict[str, int]) -> None:
    for name, size in what.items():
        if size % tp:
            raise UserError(f"technique tp: tp={tp} does not divide the model's {name} ({size}); valid tp sizes "
                            f"divide every one of {', '.join(f'{k}={v}' for k, v in what.items())}")


def _llama_parts(model):
    """(the decoder, its blocks, the LM head) of a Llama-style Hugging Face causal LM, or a UserError saying what
    is missing."""
    decoder, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    blocks = getattr(decoder, "layers", None)
    missing = [] if blocks and head is not None else ["model.layers / lm_head"]
    if blocks:  # every block is built alike: the first one shows the names
        attention, mlp = getattr(blocks[0], "self_attn", None), getattr(blocks[0], "mlp", None)
        missing += [f"self_attn.{n}" for n in ATTENTION if not hasattr(attention, n)]
        missing += [f"mlp.{n}" for n in MLP if not hasattr(mlp, n)]
        missing += [n for n in NORMS if not hasattr(blocks[0], n)]
    if missing or not hasattr(decoder, "embed_tokens") or not hasattr(decoder, "norm"):
        raise UserError("technique tp applies torchtitan's plan for Llama-style blocks (Hugging Face's "
                        "self_attn.q_proj/k_proj/v_proj/o_proj, mlp.gate_proj/up_proj/down_proj, input_layernorm, "
                        "post_attention_layernorm; e.g. hf:llama, hf:mistral, hf:qwen2), and this model has no "
                        + ", ".join(missing or ["model.embed_tokens / model.norm"]))
    if head.weight is decoder.embed_tokens.weight:
        raise UserError("technique tp: this model's LM head shares the embedding's weight (tie_word_embeddings), "
                        "which torchtitan's plan shards two ways (row-wise for the embedding, column-wise for the "
                        "head); valid: a model with its own head weight (the workload's ,tie_word_embeddings=false)")
    return decoder, list(blocks), head


class TensorParallel(Technique):
    """Trades communication in every block for memory: each rank holds 1/tp of every block's weights, gradients and
    optimizer state (attention heads and FFN columns sharded) and 1/tp of the tokens between blocks (sequence
    parallel); attention and the MLP gather the whole sequence on entry and reduce-scatter it on exit.

    torchtitan's plan for Llama-style blocks (membench/techniques/tp.py), over the tp dimension of --mesh
    (--mesh tp=2; with fsdp, --mesh dp_shard=4,tp=2: FSDP2 shards over dp_shard what tp leaves on each rank).
    Runs through torchrun; the ranks of one tp group train on the same batch.
    """

    name = "tp"
    summary = "tensor + sequence parallel (torchtitan's Llama plan): 1/tp of each block's weights and activations"
    cost = "low"
    min_torch = "2.11"  # under 2.9.1 DTensor has no sharding strategy for aten.alias (a CPU run, hf:llama)
    min_torch_for = "DTensor's tensor parallelism as membench drives it, checked on 2.11 and 2.14"
    distributed = True
    conflicts = ("fsdp-offload", "opt-offload", "amp-fp16")
    conflict_reason = ("host-memory offload (fsdp-offload, opt-offload) is not combined with tensor parallelism here "
                       "(fsdp+tp is); amp-fp16's gradient scaler would find infs and skip steps per rank on tp's "
                       "sharded gradients")
    order = 25  # first of the sharding (torchtitan: TP, then activation checkpointing, then FSDP)
    numerics = "batch-split"  # row-wise layers sum partial products across ranks: another order of the same sums
    options = ("mesh",)

    def validate(self, spec, workload) -> None:
        mesh = spec.mesh_of()
        if mesh.tp < 2:
            raise UserError(f"technique tp needs a tp dimension of 2 or more in --mesh (e.g. --mesh tp=2, or "
                            f"--mesh dp_shard=4,tp=2 with fsdp); --mesh is {mesh.text}")
        if mesh.tp != mesh.size and "fsdp" not in spec.techniques:
            raise UserError(f"--mesh {mesh.text}: the data-parallel ranks need fsdp to shard over them "
                            f"(--techniques fsdp+tp), or --mesh tp={mesh.tp} alone")

    def configure(self, state) -> None:
        import torch.distributed as dist

        from membench.techniques.mesh import device_mesh

        if not dist.is_initialized():
            raise UserError(f"technique {self.name} runs under torchrun: use `membench run` (it launches torchrun)")
        decoder, blocks, head = _llama_parts(state.model)
        mesh = device_mesh(state)["tp"]
        config = getattr(state.model, "config", None)
        _divides(mesh.size(), {k: getattr(config, k) for k in (
            "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size")
            if isinstance(getattr(config, k, None), int)} | _tokens(state.workload))
        _apply(decoder, blocks, head, mesh)
        if state.on_model is not None:
            state.on_model(state.model)  # the sharded parameters are new tensors: let the meter see them


# The modules whose parameters the plan shards on dim 0 (row-wise embedding; column-wise layers, biases included).
DIM0 = ("embed_tokens", "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head")


def rows_sharded(name: str) -> bool:
    """Whether the plan shards this parameter (named as model.named_parameters() names it) on its first dimension;
    the sizes it shards divide by tp (TensorParallel.configure checks it)."""
    return name.rpartition(".")[0].rpartition(".")[2] in DIM0


def _tokens(workload) -> dict[str, int]:
    """The sequence length, which sequence parallelism shards (a text workload's tokens per sample)."""
    return {"sequence length": workload.items_per_sample} if workload.unit == "tokens" else {}


def _apply(decoder, blocks, head, mesh) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    parallelize_module(decoder, mesh, {
        # A DTensor out (use_local_output=False): its global shape is the whole sequence, which LlamaModel reads.
        "embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False),
        "norm": SequenceParallel(),
    })
    parallelize_module(head, mesh, ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()))
    gathered = PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                  desired_input_kwarg_layouts={"hidden_states": Replicate()}, use_local_output=True)
    for block in blocks:
        parallelize_module(block, mesh, {
            "input_layernorm": SequenceParallel(),
            "self_attn": gathered,
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            "post_attention_layernorm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                      use_local_output=True),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        })
