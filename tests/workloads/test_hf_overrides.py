"""`hf:NAME,key=value` overrides as a hostile or careless user writes them: the type, the range, the model's own
consistency checks and the parameter count are each one line (a UserError: exit 2) before any model is built;
parameters that exceed this machine's memory are an out-of-memory refusal before a byte is allocated."""

from __future__ import annotations

import io

import pytest
import torch

from membench.common.errors import UserError
from membench.workloads import load_workload

pytest.importorskip("transformers")
from membench.workloads import hf  # noqa: E402


@pytest.mark.parametrize(("override", "said"), [
    ("n_layer=abc", "n_layer=\"abc\": GPT2Config.n_layer is an integer (now 12), got text"),
    ("n_layer=1e30", "n_layer=1e+30: GPT2Config.n_layer is an integer (now 12), got a number"),
    ("n_layer=null", "n_layer=null: GPT2Config.n_layer is an integer (now 12), got null"),
    ("n_layer=None", "GPT2Config.n_layer is an integer (now 12), got text"),
    ("n_layer=true", "GPT2Config.n_layer is an integer (now 12), got a boolean"),
    ("__class__=x", "'__class__' is not a config attribute"),
    ("to_dict=1", "'to_dict' is a method of GPT2Config, not a setting"),
    ("hidden_size=-4", "hidden_size=-4: hidden_size is a size or count, from 1 to 2147483647"),
    ("vocab_size=0", "vocab_size=0: vocab_size is a size or count, from 1 to 2147483647"),
    ("n_layer=-1", "n_layer is a size or count, from 1 to 2147483647"),
    ("n_layer=99999999999", "n_layer is a size or count, from 1 to 2147483647"),
    ("layer_norm_epsilon=1e400", "a number must be finite"),
    ("n_embd=7", "transformers cannot build the model from this config: ValueError: `embed_dim` must be "
                 "divisible by num_heads (got `embed_dim`: 7 and `num_heads`: 12)"),
    ("nonsense=1", "GPT2Config has no attribute 'nonsense'"),
])
def test_a_bad_override_is_one_line(override, said):
    with pytest.raises(UserError) as exc:
        load_workload(f"hf:gpt2,{override}", seq_len=8)
    text = str(exc.value)
    assert said in text and f"hf:gpt2,{override}" in text and "\n" not in text and len(text) < 400


def test_the_parameter_count_is_exact_from_two_layers():
    """Extrapolated from one and two layers on meta: GPT-2 small has 124,439,808 parameters (tied embeddings
    counted once), and each of its 12 blocks 7,087,872 (4 x 768^2 + 4 x 768 attention, 8 x 768^2 + 5 x 768
    MLP, 4 x 768 two LayerNorms: 12 x 768^2 + 13 x 768)."""
    per_block = 12 * 768**2 + 13 * 768
    assert per_block == 7_087_872
    assert hf.parameter_count("gpt2", "causal-lm") == 124_439_808
    assert hf.parameter_count("gpt2,n_layer=30", "causal-lm") == 124_439_808 + 18 * per_block


def test_a_model_no_machine_holds_is_refused_before_building():
    """A million GPT-2 blocks: 7.1e12 parameters, past MAX_PARAMS (2**40), counted from two blocks on meta."""
    with pytest.raises(UserError, match="7,087,911,385,344 parameters .* more than the 1,099,511,627,776"):
        load_workload("hf:gpt2,n_layer=1000000", seq_len=8)


def test_parameters_beyond_the_machine_are_an_oom_before_a_byte_is_allocated(monkeypatch):
    """On a real device the fp32 parameters are compared with the machine's memory before building: out of
    memory (the run's status `oom`), not a worker killed by the kernel part way."""
    workload = load_workload("hf:gpt2,n_layer=2,n_embd=64,n_head=2", seq_len=8)
    params = hf.parameter_count("gpt2,n_layer=2,n_embd=64,n_head=2", "causal-lm")
    monkeypatch.setattr(hf, "_host_memory", lambda: params * 4 - 1)
    with pytest.raises(torch.OutOfMemoryError, match=f"{params * 4} bytes in fp32: more than this machine's "
                                                    f"{params * 4 - 1} bytes"):
        workload.build_model()
    monkeypatch.setattr(hf, "_host_memory", lambda: params * 4)
    assert sum(p.numel() for p in workload.build_model().parameters()) == params


def test_a_model_name_off_the_cache_fails_at_once_when_the_hub_cannot_be_reached(monkeypatch):
    """Offline, huggingface_hub retries for about 30 s before failing: membench tries one connection (3 s at
    most) first and says what it found, without asking transformers to reach the network."""
    import transformers

    asked = []
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", lambda *a, **k: asked.append(k))

    def refuse(address, timeout):
        assert timeout <= 3
        raise OSError(-2, "Name or service not known")

    monkeypatch.setattr(hf.socket, "create_connection", refuse)
    with pytest.raises(UserError, match=r"'nobody/no-such-model-xyz' is not a model type transformers knows, a "
                                        r"local folder, nor in the Hugging Face cache, and the hub cannot be reached "
                                        r"from here \(huggingface.co:443: Name or service not known\)"):
        load_workload("hf:nobody/no-such-model-xyz")
    assert asked == []


def test_a_model_name_is_fetched_saying_so_and_a_local_folder_never_asks_the_hub(monkeypatch, tmp_path, capsys):
    import transformers

    asked = []

    def from_pretrained(name, **kwargs):
        asked.append((name, kwargs))
        raise OSError("planted: no such repository")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", from_pretrained)
    monkeypatch.setattr(hf.socket, "create_connection", lambda address, timeout: io.StringIO())  # opens
    with pytest.raises(UserError, match="planted: no such repository"):
        load_workload("hf:nobody/another-model-xyz")
    assert asked == [("nobody/another-model-xyz", {"local_files_only": False})]
    said = capsys.readouterr().err
    assert "membench: fetching nobody/another-model-xyz's config from https://huggingface.co ..." in said
    monkeypatch.setattr(hf.socket, "create_connection", None)  # a local folder: no connection tried
    with pytest.raises(UserError, match=r"no config for '.+': the folder holds no config.json$"):
        load_workload(f"hf:{tmp_path}")  # transformers 4.x answered BERT's config for an empty ./bert
    assert len(asked) == 1
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UserError):
        load_workload(f"hf:{tmp_path}")
    assert asked[-1] == (str(tmp_path), {"local_files_only": True})


def test_what_a_config_derives_from_an_override_follows_it():
    # LlamaConfig derives head_dim = hidden_size // num_attention_heads when it is not given: the 7B's 4096 / 32 =
    # 128 by default. Overridden sizes must carry it along, else q_proj of a 256-wide model would be [4096, 256].
    assert hf.load_config("llama").head_dim == 128
    assert hf.load_config("llama,hidden_size=256").head_dim == 8
    assert hf.load_config("llama,hidden_size=256,num_attention_heads=4").head_dim == 64
    assert hf.load_config("llama,hidden_size=256,head_dim=16").head_dim == 16
    model = load_workload("hf:llama,num_hidden_layers=1,hidden_size=64,num_attention_heads=4,vocab_size=32").build_model
    with torch.device("meta"):
        q = model().model.layers[0].self_attn.q_proj.weight
    assert tuple(q.shape) == (64, 64)


@pytest.mark.parametrize("version, keyword", [("4.44.2", "torch_dtype"), ("4.55.4", "torch_dtype"),
                                              ("4.56.0", "dtype"), ("5.23.0", "dtype"), ("4.57.0.dev0", "dtype")])
def test_the_fp32_keyword_is_the_installed_transformers_own(version, keyword, monkeypatch):
    """transformers 4.56 renamed from_config's torch_dtype to dtype; pyproject allows 4.40, whose models refuse
    `dtype` (a TypeError from GPT2LMHeadModel.__init__, seen with 4.44.2)."""
    import transformers

    monkeypatch.setattr(transformers, "__version__", version)
    assert hf._fp32() == {keyword: torch.float32}


def test_key_value_heads_that_do_not_divide_the_heads_are_refused():
    """4 query heads in groups over 3 key/value heads: transformers' repeat_kv cannot make the groups."""
    spec = "hf:llama,num_hidden_layers=1,hidden_size=64,num_attention_heads=4,num_key_value_heads=3,vocab_size=32"
    with pytest.raises(UserError, match="num_attention_heads=4 is not a multiple of num_key_value_heads=3"):
        load_workload(spec, seq_len=8)
    load_workload(spec.replace("num_key_value_heads=3", "num_key_value_heads=2"), seq_len=8)  # 2 groups of 2
