"""QLoRA: LoRA adapters over base weights stored in bitsandbytes' 4-bit format."""

from __future__ import annotations

from membench.common.errors import UserError
from membench.techniques.lora import DTYPE_NAMES, Lora


def skipped_modules(model) -> set[str]:
    """The linear layers left unquantized, as transformers' bitsandbytes quantizer leaves them
    (transformers/quantizers/base.py get_keys_to_not_convert): for a PreTrainedModel the output embeddings (the LM
    head), tied weights' modules and the module of the last parameter; for any other model, that last module."""
    try:
        from transformers import PreTrainedModel
        from transformers.quantizers.base import get_keys_to_not_convert
    except ImportError:
        PreTrainedModel = None
    if PreTrainedModel is not None and isinstance(model, PreTrainedModel):
        return set(get_keys_to_not_convert(model))
    last = list(model.named_parameters())[-1][0]
    return {last.rpartition(".")[0]}


def _skipped(name: str, skip: set[str]) -> bool:
    # transformers' should_convert_module: the name itself, or a module under it
    return any(name == s or name.startswith(s + ".") for s in skip)


class Qlora(Lora):
    """LoRA (as `lora`) over base weights in bitsandbytes' 4-bit format: each linear layer but the LM head becomes
    a `bnb.nn.Linear4bit` whose weight is quantized as bitsandbytes quantizes it (`Params4bit` moved to the device:
    half a byte per weight packed in uint8, an fp32 absmax per block of 64, with --double-quant that absmax in
    uint8 with an fp32 absmax per 256 blocks, an offset and the code tables). Each matmul dequantizes its weight to
    --compute-dtype for the moment it computes (predict/emulate/bnb4bit.py). The other frozen weights (embeddings,
    norms, the LM head) are kept in --base-dtype, by default the compute dtype (as a model loaded in it).
    """

    name = "qlora"
    summary = ("lora over base weights in bitsandbytes 4-bit (NF4): a quarter of bf16's bytes, each weight "
               "dequantized at its matmul")
    conflicts = ("lora", "opt-offload", "fsdp-offload", "tp", "fsdp")
    conflict_reason = ("qlora is lora on 4-bit base weights: choose one; FSDP, offloading and tensor parallelism of "
                       "4-bit weights are not supported by membench yet")
    options = (*Lora.options, "quant_type", "double_quant", "compute_dtype")
    packages = ("peft", "bitsandbytes")
    cost = "low"  # a dequantization kernel before each matmul, forward and backward

    def validate(self, spec, workload) -> None:
        super().validate(spec, workload)
        if self.stack_param_dtype is not None and DTYPE_NAMES[spec.compute_dtype] != self.stack_param_dtype:
            raise UserError(f"--compute-dtype {spec.compute_dtype} contradicts {self.stack_param_dtype} in "
                            f"{'+'.join(spec.techniques)!r}: use --compute-dtype "
                            f"{'bf16' if self.stack_param_dtype == 'bfloat16' else 'fp32'}")

    def base_dtype(self):
        import torch

        if self.spec.base_dtype is None:
            return getattr(torch, DTYPE_NAMES[self.spec.compute_dtype])
        return super().base_dtype()

    def prepare_base(self, state) -> None:
        import bitsandbytes as bnb
        import torch
        functional = bnb.functional
        tables = dict(functional.name2qmap)  # its code tables, made on the device at the first quantization
        spec, model = self.spec, state.model
        compute = getattr(torch, DTYPE_NAMES[spec.compute_dtype])
        skip = skipped_modules(model)
        for name, module in list(model.named_modules()):
            if type(module) is not torch.nn.Linear or _skipped(name, skip):
                continue
            model.set_submodule(name, _quantized(bnb, module, spec, compute, state.device))
            del module
        # A prediction's fake tables must not stay in bitsandbytes' module-level cache (a later real run in this
        # process would read them): kept here instead, for as long as the run, as the cache would keep them.
        self.tables = {k: v for k, v in functional.name2qmap.items() if k not in tables}
        functional.name2qmap.clear()
        functional.name2qmap.update(tables)


def _quantized(bnb, module, spec, compute, device):
    """`module` as bitsandbytes' Linear4bit, its weight quantized as Params4bit.to(device) quantizes it
    (Params4bit._quantize: quantize_4bit of the contiguous weight, blocks of 64, uint8 storage)."""
    import torch

    from membench import private

    with private.no_dispatch_modes():  # its placeholder weight on meta, unseen: replaced at once
        new = bnb.nn.Linear4bit(module.in_features, module.out_features, module.bias is not None, compute,
                                compress_statistics=spec.double_quant, quant_type=spec.quant_type, device="meta")
    options = dict(compress_statistics=spec.double_quant, quant_type=spec.quant_type, quant_storage=torch.uint8)
    if not private.is_fake(module.weight):
        new.weight = bnb.nn.Params4bit(module.weight.data, requires_grad=False, module=new, **options).to(device)
    else:
        # A prediction: Params4bit cannot wrap a FakeTensor (it is made by Tensor._make_subclass), so its quantization
        # is run as _quantize runs it, into a plain parameter that carries Params4bit's attributes.
        packed, state = bnb.functional.quantize_4bit(module.weight.data.contiguous().to(device), blocksize=64,
                                                     **options)
        weight = torch.nn.Parameter(packed, requires_grad=False)
        for key, value in dict(quant_state=state, blocksize=64, bnb_quantized=True, module=new, **options).items():
            setattr(weight, key, value)
        new.weight, new.quant_state = weight, state
    new.bias = module.bias
    new.requires_grad_(False)
    _register_state(new)
    return new


def _register_state(layer) -> None:
    """The quantization state's tensors as non-persistent buffers of the layer, so that the memory trackers count
    them with the parameters (they are the base weights, in bitsandbytes' layout; nothing else holds them)."""
    state = layer.weight.quant_state
    parts = {"absmax": state.absmax, "quant_map": state.code, "offset": state.offset}
    if state.state2 is not None:
        parts.update(nested_absmax=state.state2.absmax, nested_quant_map=state.state2.code)
    for key, tensor in parts.items():
        if tensor is not None:
            layer.register_buffer(f"weight_{key}", tensor, persistent=False)
