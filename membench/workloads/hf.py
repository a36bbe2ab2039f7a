"""Hugging Face models by name, from their config alone: no weights are downloaded, so `membench predict` answers
for a 7B model in seconds (built on `meta`, run on fake tensors) and `membench run` trains on synthetic data.

`hf:NAME[,key=value...]`:
- NAME a model type transformers knows (gpt2, llama, bert, vit, ...): transformers' default config for that
  architecture (`AutoConfig.for_model`), offline. `hf:llama` is the 7B Llama shape, `hf:gpt2` GPT-2 small.
- any other NAME (`openai-community/gpt2`, `meta-llama/Llama-2-7b-hf`, a local folder named as a path: `./bert`):
  `AutoConfig.from_pretrained`, from the Hugging Face cache first, then the network.
- key=value overrides config attributes (`hf:gpt2,n_layer=2,n_embd=64`); `head=` picks the head: causal-lm,
  masked-lm, seq-cls or image-cls (default: masked-lm for encoders, else the first the architecture has).

Overrides are checked before any model is built: the value's type against the attribute's, sizes and counts
(`n_layer`, `hidden_size`, `vocab_size`, ...) from 1 to 2**31 - 1, then the model's own checks (built on `meta`,
at most two layers: `n_embd=7` with 12 heads), then the parameter count, extrapolated from those layers: above
MAX_PARAMS no machine holds it; on a real device, parameters whose fp32 bytes exceed the machine's memory are an
out-of-memory refusal before a byte is allocated. Each is one line.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import socket
import sys
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from membench.common.errors import UserError
from membench.common.install import extra_hint
from membench.workloads.base import Batch, Workload

MISSING = "Hugging Face workloads need transformers"  # then how to install it, for this install (extra_hint)
HEADS = ("causal-lm", "masked-lm", "seq-cls", "image-cls")
DEFAULT_SEQ_LEN = 1024  # capped by the model's own context length
MAX_INT = 2**31 - 1  # no config size or count is larger; past it, torch's own index types overflow
# Sizes and counts by the words in their names (n_layer, hidden_size, vocab_size, num_attention_heads, ...): at
# least 1. Token ids (`..._id`) may be 0; floats (layer_norm_epsilon) are not sizes.
_SIZE_WORDS = ("layer", "size", "embd", "head", "dim", "position", "inner", "label", "channel", "expert")
MAX_PARAMS = 2**40  # 1.1e12 parameters, 4 TiB in fp32: more than any machine membench measures or predicts for


def _transformers():
    try:
        import transformers
    except ImportError:
        raise UserError(f"{MISSING}: {extra_hint('hf')}") from None
    # transformers imports torchao, where it is installed (membench[finetune]), as it builds a model; torchao 0.18
    # registers its enums with torch's pytree, which under torch 2.14 warns of each on stderr: not the user's concern.
    import logging

    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    return transformers


def _fp32() -> dict:
    """from_config's keyword for an fp32 model: `dtype` from transformers 4.56, `torch_dtype` before (4.56 renamed
    it; older releases pass an unknown keyword on to the model's __init__, which refuses it)."""
    major, minor = (int(p) for p in _transformers().__version__.split(".")[:2])
    return {"dtype": torch.float32} if (major, minor) >= (4, 56) else {"torch_dtype": torch.float32}


def _auto_classes() -> dict[str, tuple]:
    t = _transformers()
    from transformers.models.auto import modeling_auto as m

    return {
        "causal-lm": (t.AutoModelForCausalLM, m.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
        "masked-lm": (t.AutoModelForMaskedLM, m.MODEL_FOR_MASKED_LM_MAPPING_NAMES),
        "seq-cls": (t.AutoModelForSequenceClassification, m.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES),
        "image-cls": (t.AutoModelForImageClassification, m.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES),
    }


def _value(text: str):
    """An override's value as JSON where it parses (2, 0.1, true, null), else the string itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse(spec: str) -> tuple[str, dict, str | None]:
    """'gpt2,n_layer=2,head=causal-lm' -> ('gpt2', {'n_layer': 2}, 'causal-lm')."""
    name, *items = spec.split(",")
    overrides, head = {}, None
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"workload 'hf:{spec}': {item!r} is not key=value")
        if key.strip() == "head":
            head = value.strip()
            if head not in HEADS:
                raise UserError(f"workload 'hf:{spec}': unknown head {head!r}; valid: {', '.join(HEADS)}")
        else:
            overrides[key.strip()] = _value(value.strip())
    if not name:
        raise UserError("workload 'hf:' needs a model name or type, e.g. hf:gpt2 or hf:meta-llama/Llama-2-7b-hf")
    return name, overrides, head


@functools.lru_cache(maxsize=32)
def load_config(spec: str):
    """The model's config with the overrides applied (cached: plan, worker and predictor all ask)."""
    t = _transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    name, overrides, _ = parse(spec)
    # A bare model type is transformers' config even when a folder of that name is in the working directory (a
    # results folder called `bert`, say); a folder is read only when named as a path (`./bert`, `/data/bert`).
    if name in CONFIG_MAPPING:
        config = t.AutoConfig.for_model(name)
    else:
        local = _cached_or_local(name)
        if Path(name).is_dir() and not (Path(name) / "config.json").is_file():
            # transformers before 5 answers a folder without one with the config of a model type its path names
            # (`./bert`: BERT's defaults), as if it had read it
            raise UserError(f"workload 'hf:{spec}': no config for {name!r}: the folder holds no config.json")
        if not local:
            hub = _hub()
            if hub is None:
                raise UserError(f"workload 'hf:{spec}': {name!r} is not a model type transformers knows, a local "
                                f"folder, nor in the Hugging Face cache, and the hub cannot be reached from here "
                                f"({_hub_unreachable}); a model type (hf:gpt2, hf:llama, hf:bert, ...) needs no "
                                "network")
            print(f"membench: fetching {name}'s config from {hub} ...", file=sys.stderr, flush=True)
        try:
            config = t.AutoConfig.from_pretrained(name, local_files_only=local)
        except (OSError, ValueError) as exc:
            raise UserError(f"workload 'hf:{spec}': no config for {name!r} in the Hugging Face cache or hub "
                            f"({str(exc).splitlines()[0]}); a model type transformers knows (hf:gpt2, hf:llama, "
                            "hf:bert, ...) needs no network") from None
    for key, value in overrides.items():
        _check_override(spec, config, key, value)
        try:
            setattr(config, key, value)
        except Exception as exc:  # noqa: BLE001 - transformers' own validators: TypeError, ValueError, its own
            raise UserError(f"workload 'hf:{spec}': {key}={json.dumps(value)[:40]}: {_first_line(exc)}") from None
    if overrides and name in CONFIG_MAPPING:
        # A model type's config is built again with the overrides as arguments, so that what its __init__ derives
        # from them follows them: LlamaConfig's head_dim is hidden_size // num_attention_heads when not given
        # (set afterwards, hidden_size=64 would keep the default's 128).
        try:
            config = t.AutoConfig.for_model(name, **overrides)
        except Exception as exc:  # noqa: BLE001 - as above
            raise UserError(f"workload 'hf:{spec}': {_first_line(exc)}") from None
    if hasattr(config, "validate"):
        try:
            config.validate()
        except Exception as exc:  # noqa: BLE001 - as above
            raise UserError(f"workload 'hf:{spec}': transformers refuses the config: {_first_line(exc)}") from None
    _check_heads(spec, config)
    config.use_cache = False  # training: no key/value cache kept beside the activations
    return config


def _check_heads(spec: str, config) -> None:
    """Grouped-query attention repeats each key/value head num_attention_heads / num_key_value_heads times
    (transformers' repeat_kv): a count that does not divide is refused here, in one line, rather than failing
    inside the model's forward or, worse, predicted as a model no GPU could run."""
    heads, kv = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if isinstance(heads, int) and isinstance(kv, int) and heads > 0 and kv > 0 and heads % kv:
        raise UserError(f"workload 'hf:{spec}': num_attention_heads={heads} is not a multiple of "
                        f"num_key_value_heads={kv}: each key/value head serves a whole group of query heads")


def _cached_or_local(name: str) -> bool:
    """The config is here already (a local folder, or the Hugging Face cache), or the hub is off (HF_HUB_OFFLINE):
    no network to try."""
    if Path(name).is_dir():
        return True
    import huggingface_hub
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return True
    try:
        return isinstance(huggingface_hub.try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a repo id: from_pretrained says what is wrong with it
        return True


_hub_unreachable = ""


def _hub(timeout_s: float = 3.0) -> str | None:
    """The hub's address if a TCP connection to it opens within timeout_s, else None (the reason kept in
    _hub_unreachable). huggingface_hub itself retries an unreachable hub for about 30 s before failing."""
    global _hub_unreachable
    from huggingface_hub import constants

    endpoint = urllib.parse.urlsplit(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        _hub_unreachable = f"{endpoint.hostname}:{port}: {exc.strerror or exc}"
        return None
    return constants.ENDPOINT


def _first_line(exc: BaseException) -> str:
    """An exception from transformers as one line: its class and the first line that says something."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = " ".join(lines[:2]) if lines else ""
    return f"{type(exc).__name__}: {text[:300]}"


def _kind(value) -> str:
    return ("null" if value is None else "a boolean" if isinstance(value, bool) else
            "an integer" if isinstance(value, int) else "a number" if isinstance(value, float) else
            "text" if isinstance(value, str) else "a list" if isinstance(value, list) else "an object")


def _check_override(spec: str, config, key: str, value) -> None:
    """Type and range of one override, against the attribute's current value: one line naming what is valid."""
    where = f"workload 'hf:{spec}': {key}={json.dumps(value)[:40]}"
    if key.startswith("__") or not key.isidentifier():  # `_attn_implementation` is transformers' own setting
        raise UserError(f"workload 'hf:{spec}': {key!r} is not a config attribute (names starting with __ are "
                        "Python's own)")
    if not hasattr(config, key):
        raise UserError(f"workload 'hf:{spec}': {type(config).__name__} has no attribute {key!r}")
    current = getattr(config, key)
    if callable(current):
        raise UserError(f"workload 'hf:{spec}': {key!r} is a method of {type(config).__name__}, not a setting")
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{where}: a number must be finite")
    if isinstance(current, bool):
        valid = isinstance(value, bool)
    elif isinstance(current, int):
        valid = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(current, float):
        valid = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif current is None:
        valid = isinstance(value, (bool, int, float, str, type(None)))
    else:
        valid = type(value) is type(current)
    if not valid:
        raise UserError(f"{where}: {type(config).__name__}.{key} is {_kind(current)} (now {json.dumps(current)[:40]}), "
                        f"got {_kind(value)}")
    if isinstance(value, int) and not isinstance(value, bool):
        size = any(w in key.lower() for w in _SIZE_WORDS) and not key.endswith("_id")
        low = 1 if size else -MAX_INT
        if not low <= value <= MAX_INT:
            what = "a size or count" if size else "an integer"
            raise UserError(f"{where}: {key} is {what}, from {low} to {MAX_INT}")


def _layers_key(config) -> str | None:
    for key in ("num_hidden_layers", "num_layers", "n_layer"):
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return key
    return None


@functools.lru_cache(maxsize=32)
def parameter_count(spec: str, head: str) -> int:
    """The model's parameter count, from at most two of its layers built on `meta` (no memory), extrapolated:
    each layer of a stack holds the same parameters. Building them runs the model's own checks (heads dividing
    the width, ...), said in one line."""
    config = load_config(spec)
    model_class = _auto_classes()[head][0]
    key = _layers_key(config)
    layers = getattr(config, key) if key else None

    def count(n: int | None) -> int:
        small = copy.deepcopy(config)
        if n is not None and n != layers:
            setattr(small, key, n)
            if isinstance(getattr(small, "layer_types", None), list):
                small.layer_types = small.layer_types[:n]
        try:
            with torch.device("meta"):
                model = model_class.from_config(small, **_fp32())
        except Exception as exc:  # noqa: BLE001 - the model's own consistency checks
            raise UserError(f"workload 'hf:{spec}': transformers cannot build the model from this config: "
                            f"{_first_line(exc)}") from None
        return sum(p.numel() for p in model.parameters())

    if layers is None or layers <= 2:
        return count(None)
    one, two = count(1), count(2)
    return one + (layers - 1) * (two - one)


def _host_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _head(spec: str, config) -> str:
    _, _, head = parse(spec)
    if getattr(config, "is_encoder_decoder", False) and head != "causal-lm":
        # Its loss needs decoder inputs (labels shifted by the config's decoder_start_token_id), which none of the
        # heads below make: refused in one line rather than failing inside the model's forward. A causal-lm head
        # asked for by name (BartForCausalLM) is the decoder alone, which trains as any decoder does.
        raise UserError(f"workload 'hf:{spec}': {config.model_type} is an encoder-decoder model, and membench trains "
                        f"encoder-only and decoder-only ones ({', '.join(HEADS)} heads); wrap it in a "
                        "package.module:factory Workload whose batches carry its decoder inputs")
    classes = _auto_classes()
    if head is None:
        # Encoders that transformers also offers a causal head for (bert, roberta, ...) are trained as masked LMs.
        order = ("masked-lm", "causal-lm", "seq-cls", "image-cls")
        head = next((h for h in order if config.model_type in classes[h][1]), None)
        if head is None:
            raise UserError(f"workload 'hf:{spec}': model type {config.model_type!r} has none of the heads membench "
                            f"trains ({', '.join(HEADS)})")
    elif config.model_type not in classes[head][1]:
        raise UserError(f"workload 'hf:{spec}': model type {config.model_type!r} has no {head} head in transformers")
    return head


def _context(config) -> int | None:
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _build(spec: str, head: str) -> nn.Module:
    config = load_config(spec)
    model_class = _auto_classes()[head][0]
    if torch.empty(0).device.type != "meta":  # a real build (a prediction builds on meta and allocates nothing)
        params = parameter_count(spec, head)
        host = _host_memory()
        if host is not None and params * 4 > host:
            # The host allocator would refuse it part way, or the kernel kill the worker: say it before building.
            raise torch.OutOfMemoryError(
                f"membench: hf:{spec} has {params:,} parameters, {params * 4} bytes in fp32: more than this "
                f"machine's {host} bytes of memory (parameters alone, before gradients and optimizer state)")
    # fp32 like every membench workload (bf16 is a technique), whatever dtype the checkpoint was saved in.
    model = model_class.from_config(config, **_fp32())
    if head == "causal-lm" and getattr(model, "loss_type", "") is None:
        # GPT2LMHeadModel's class name maps to no loss type: transformers warns "`loss_type=None` ... unrecognized"
        # and falls back to ForCausalLM. Naming that same loss keeps the numbers and drops the stray warning.
        model.loss_type = "ForCausalLM"
    return model


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer layers: the ModuleList of same-class modules holding the most parameters."""
    best, best_size = [], -1
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0 and len({type(m) for m in module}) == 1:
            size = sum(p.numel() for p in module.parameters())
            if size > best_size:
                best, best_size = list(module), size
    return best


def _loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    inputs, labels = batch
    key = "pixel_values" if inputs.is_floating_point() else "input_ids"
    # transformers' losses are means (over tokens, or samples), as membench's accumulation needs.
    return model(**{key: inputs, "labels": labels}).loss


def _causal_lm_split(model: nn.Module, batch: Batch) -> tuple:
    """A causal LM's last hidden states (its base model's output), output projection and targets shifted as
    transformers' ForCausalLMLoss shifts the labels (loss/loss_utils.py: padded with -100 by one, then [..., 1:])."""
    ids, labels = batch
    hidden = model.base_model(input_ids=ids).last_hidden_state
    targets = nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
    return hidden, model.get_output_embeddings(), targets


def _text_batch(vocab: int, seq_len: int, labels: Callable[[torch.Tensor, int, torch.Generator], torch.Tensor]):
    def make(batch_size: int, generator: torch.Generator) -> Batch:
        ids = torch.randint(0, vocab, (batch_size, seq_len), generator=generator)
        return ids, labels(ids, batch_size, generator)

    return make


def hf_workload(spec: str, seq_len: int | None = None) -> Workload:
    """A Workload for `hf:<spec>`: the model from its config, synthetic tokens (or images) and the head's loss."""
    config = load_config(spec)
    head = _head(spec, config)
    params = parameter_count(spec, head)
    if params > MAX_PARAMS:
        raise UserError(f"workload 'hf:{spec}': {params:,} parameters ({params * 4 / 2**40:,.0f} TiB in fp32), "
                        f"more than the {MAX_PARAMS:,} any machine membench measures or predicts for holds")
    build = functools.partial(_build, spec, head)
    if head == "image-cls":
        if seq_len is not None:
            raise UserError(f"--seq-len is for text workloads; hf:{spec} is an image model")
        size, channels = config.image_size, getattr(config, "num_channels", 3)
        classes = config.num_labels

        def make_images(batch_size: int, generator: torch.Generator) -> Batch:
            images = torch.randn(batch_size, channels, size, size, generator=generator)
            return images, torch.randint(0, classes, (batch_size,), generator=generator)

        return Workload(build_model=build, make_batch=make_images, loss_fn=_loss, blocks=blocks_of)
    context = _context(config)
    if seq_len is None:
        seq_len = min(DEFAULT_SEQ_LEN, context or DEFAULT_SEQ_LEN)
    elif context is not None and seq_len > context:
        raise UserError(f"--seq-len {seq_len} is longer than hf:{spec}'s context ({context} positions)")
    if head == "seq-cls":
        classes = config.num_labels
        labels = lambda ids, b, gen: torch.randint(0, classes, (b,), generator=gen)  # noqa: E731
    else:  # causal LM: the model shifts the labels itself; masked LM: predict every token
        labels = lambda ids, b, gen: ids.clone()  # noqa: E731
    items = seq_len
    # Logits scaled or capped after the projection (Gemma 2's final_logit_softcapping, Cohere's logit_scale) are
    # the model's own forward: no split stands for them.
    plain_head = head == "causal-lm" and not any(getattr(config, key, None) for key in (
        "final_logit_softcapping", "logit_scale"))
    return Workload(build_model=build, make_batch=_text_batch(config.vocab_size, seq_len, labels), loss_fn=_loss,
                    blocks=blocks_of, items_per_sample=items, unit="tokens",
                    causal_lm=_causal_lm_split if plain_head else None)
