"""LoRA through peft: the base weights frozen, small adapters on the linear layers trained instead."""

from __future__ import annotations

import importlib.util
import warnings

from membench.common.errors import UserError
from membench.techniques.base import Technique

INSTALL_HINT = 'pip install -e ".[finetune]"'
ALL_LINEAR = "all-linear"  # peft's INCLUDE_LINEAR_LAYERS_SHORTHAND
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def need(package: str, technique: str) -> None:
    """One line where the package a technique runs on is not installed."""
    if importlib.util.find_spec(package) is None:
        raise UserError(f"technique {technique} needs {package}, which is not installed: {INSTALL_HINT}")


# Warnings at import that say nothing about the run: bitsandbytes' CPU backend about an optional kernel package (on
# CPUs with AVX512-BF16), torch's pytree about Enum constants torchao registers (where peft finds torchao).
_QUIET_LOGGERS = ("bitsandbytes.backends.cpu.ops", "torch.utils._pytree")


def quiet_import(packages) -> None:
    import importlib
    import logging

    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        for package in packages:
            importlib.import_module(package)
            if package == "peft":
                importlib.import_module("peft.tuners.lora")
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def linear_names(model) -> list[str]:
    """The qualified names of the model's linear layers (what peft's target_modules match, by suffix)."""
    from torch import nn

    return [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]


def _matches(name: str, target: str) -> bool:
    # peft's check_target_module_exists for a list of names: the full name, or its last components
    return name == target or name.endswith("." + target)


def default_targets(model, blocks) -> list[str] | str | None:
    """peft's own default where it has one for the model type (None: peft looks it up), else every linear layer of
    the workload's blocks (attention and MLP projections), else peft's all-linear."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING:
        return None
    if blocks is not None:
        inside = sorted({name.rpartition(".")[2] for block in blocks(model) for name in linear_names(block) if name})
        if inside:
            return inside
    return ALL_LINEAR


def targets_of(text: str | None, model, blocks) -> list[str] | str | None:
    """--lora-targets as peft's target_modules, every name checked against the model's linear layers."""
    if text is None:
        return default_targets(model, blocks)
    names = [n.strip() for n in text.replace("+", ",").split(",") if n.strip()]
    if names == [ALL_LINEAR]:
        return ALL_LINEAR
    layers = linear_names(model)
    short = sorted({n.rpartition(".")[2] for n in layers})
    for target in names:
        if not any(_matches(layer, target) for layer in layers):
            raise UserError(f"--lora-targets: the model has no linear layer {target!r}; valid: "
                            f"{', '.join(short[:20])}{', ...' if len(short) > 20 else ''}, or {ALL_LINEAR}")
    if not names:
        raise UserError(f"--lora-targets is empty; valid: linear layer names ({', '.join(short[:8])}, ...) or "
                        f"{ALL_LINEAR}")
    return names


def model_on_meta(workload):
    """The workload's model on meta (no memory), to check names against."""
    import torch

    with torch.device("meta"):
        return workload.build_model()


class Lora(Technique):
    """Trains low-rank adapters instead of the model: peft's LoRA (get_peft_model) on the linear layers, every
    base weight frozen (no gradient, no optimizer state), in --base-dtype. Adapters are fp32 over a bf16/fp16
    base, as peft casts them (autocast_adapter_dtype), except under bf16, which keeps everything in bf16.

    What it trains is an adapter, not the model the baseline trains: the equivalence verdict says so instead of
    comparing weights that cannot match.
    """

    name = "lora"
    summary = "train low-rank adapters (peft LoRA) on a frozen base: no base gradients or optimizer state"
    numerics = "precision"  # not the same model: the check reports what it trains (equivalence.py)
    trains = "an adapter"
    conflicts = ("qlora", "opt-offload", "fsdp-offload", "tp")
    conflict_reason = ("qlora is lora on 4-bit base weights: choose one; opt-offload, fsdp-offload and tp over "
                       "a peft model are not supported by membench yet")
    order = 20  # after bf16's cast (10), before ckpt wraps the blocks (30) and fsdp shards them (35)
    options = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "base_dtype")
    cost = "none"
    packages: tuple[str, ...] = ("peft",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Imported before any tracker starts: peft and bitsandbytes make host tensors at import (module constants),
        # which a run that imported them inside its first step would count as its own. Refused in validate where
        # not installed.
        if all(importlib.util.find_spec(p) is not None for p in self.packages):
            quiet_import(self.packages)

    def validate(self, spec, workload) -> None:
        for package in self.packages:
            need(package, self.name)
        if spec.base_dtype is not None and self.stack_param_dtype is not None and \
                DTYPE_NAMES[spec.base_dtype] != self.stack_param_dtype:
            raise UserError(f"--base-dtype {spec.base_dtype} contradicts {self.stack_param_dtype} in "
                            f"{'+'.join(spec.techniques)!r}, which trains every parameter in it")
        if spec.lora_targets is not None:
            targets_of(spec.lora_targets, model_on_meta(workload), workload.blocks)

    def base_dtype(self):
        """The torch dtype of the frozen base weights, or None for the model's own."""
        import torch

        if self.spec.base_dtype is None:
            return None
        return getattr(torch, DTYPE_NAMES[self.spec.base_dtype])

    def build_model(self, build, device):
        dtype = self.base_dtype()
        if dtype is None or self.stack_param_dtype is not None:
            return None
        # as bf16 builds: in fp32 on the host, then cast and move; the adapters come later, in configure
        return build().to(device=device, dtype=dtype)

    def configure(self, state) -> None:
        from peft import LoraConfig, get_peft_model

        spec = self.spec
        self.prepare_base(state)
        target = targets_of(spec.lora_targets, state.model, state.workload.blocks)
        config = LoraConfig(r=spec.lora_rank, lora_alpha=spec.lora_alpha, lora_dropout=spec.lora_dropout,
                            target_modules=target)
        # In place: the PeftModel wrapper is dropped, so the workload's loss and blocks (ckpt, fsdp) see the model
        # they know, its linear layers now peft's lora layers. Under bf16 the adapters stay bf16 too.
        with warnings.catch_warnings():  # peft asks transformers' deprecated is_gradient_checkpointing
            warnings.simplefilter("ignore", FutureWarning)
            get_peft_model(state.model, config, autocast_adapter_dtype=self.stack_param_dtype is None)
        if state.on_model is not None:
            state.on_model(state.model)  # the adapters are new parameters: their gradients' hooks

    def prepare_base(self, state) -> None:
        """The base model before the adapters go on (qlora quantizes its linear layers here)."""
