"""engine.loader against transformers: the default GGUF, tiny GGUFs of every tensor type, and
tiny Hugging Face directories (plain and sharded)."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType

from engine.default_model import default_model_path
from engine.loader import ModelFiles, load_model_files

CONFIG_KEYS = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "rms_norm_eps",
    "max_position_embeddings",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "model_type",
]


def hf_rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return params.get("rope_theta", getattr(config, "rope_theta", None))


def assert_config_matches(ours: dict, reference) -> None:
    for key in CONFIG_KEYS:
        assert ours[key] == getattr(reference, key), key
    assert ours["rope_theta"] == pytest.approx(hf_rope_theta(reference))
    # Qwen2's config has no head_dim attribute: it is hidden_size / heads there.
    head_dim = getattr(reference, "head_dim", None)
    if head_dim is None:
        head_dim = reference.hidden_size // reference.num_attention_heads
    assert ours["head_dim"] == head_dim


def assert_state_dict_matches(files: ModelFiles, reference_model) -> None:
    """Tensor by tensor, exact; a tied model's lm_head is the embedding."""
    expected = reference_model.state_dict()
    got = dict(files.weights())
    if files.hf_config["tie_word_embeddings"]:
        assert "lm_head.weight" not in got
        assert torch.equal(expected.pop("lm_head.weight"), got["model.embed_tokens.weight"])
    assert sorted(got) == sorted(expected)
    for name, tensor in got.items():
        assert tensor.shape == expected[name].shape, name
        assert tensor.dtype == expected[name].dtype, name
        assert torch.equal(tensor, expected[name]), name


# the default model ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def default_reference():
    """transformers' model loaded from the default GGUF (dequantized to float32)."""
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def default_files():
    return load_model_files(None)


def test_default_gguf_weights_equal_transformers(default_files, default_reference):
    assert default_files.source == "gguf"
    assert default_files.path == default_model_path()
    assert_state_dict_matches(default_files, default_reference)


def test_default_gguf_config_equals_transformers(default_files, default_reference):
    config = default_files.hf_config
    assert_config_matches(config, default_reference.config)
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["rope_scaling"] is None
    assert config["torch_dtype"] == "float32"
    assert default_files.generation_config == {}
    assert default_files.quantization_config is None


def test_default_gguf_raw_tensors_dequantize_to_weights(default_files):
    weights = dict(default_files.weights())
    type_names = set()
    for name, type_name, data, shape in default_files.gguf_tensors():
        type_names.add(type_name)
        values = gguf.quants.dequantize(data, QType[type_name])
        assert tuple(weights[name].shape) == shape, name
        assert np.array_equal(values, weights[name].numpy()), name
    assert type_names == {"F32", "Q4_1", "Q8_0"}


# tiny GGUF files written here, one per tensor type ----------------------------------------------

TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    rope_theta=20000.0,
    bos_token_id=1,
    eos_token_id=2,
)
GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
# Every supported type appears on some matrix; norms stay F32 as llama.cpp writes them.
TYPE_OF = {
    "token_embd": QType.Q8_0,
    "output": QType.Q4_1,
    "attn_q": QType.F16,
    "attn_k": QType.Q4_1,
    "attn_v": QType.BF16,
    "attn_output": QType.Q8_0,
    "ffn_gate": QType.Q4_1,
    "ffn_up": QType.F16,
    "ffn_down": QType.Q4_1,
}
# Largest error of one value: half a step of the format (Q4_1: range/15/2, Q8_0: amax/127/2).
TOLERANCE = {QType.F32: 0.0, QType.F16: 1e-3, QType.BF16: 1e-2, QType.Q8_0: 0.01, QType.Q4_1: 0.1}


def llama_cpp_name(hf_name: str) -> str:
    if hf_name in GGUF_NAMES:
        return GGUF_NAMES[hf_name]
    _, _, layer, module, *rest = hf_name.split(".")
    module_name = ".".join([module, *rest[:-1]])
    return f"blk.{layer}.{GGUF_NAMES[module_name]}.{rest[-1]}"


def llama_cpp_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: rotary halves become interleaved pairs."""
    return (
        weights.reshape(num_heads, 2, weights.shape[0] // num_heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def type_for(gguf_name: str, types: dict[str, QType] = TYPE_OF) -> QType:
    module = gguf_name.split(".")[-2]  # blk.0.attn_q.weight -> attn_q; output.weight -> output
    return types.get(module, QType.F32)


def write_tiny_gguf(path, model, arch: str, types: dict[str, QType] = TYPE_OF) -> None:
    """Write ``model`` the way llama.cpp's converter would, with the ``types`` tensor types."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(TINY["rope_theta"])
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    # GPT-2's byte alphabet, one token short, plus one merged token.
    alphabet = [*map(chr, range(ord("!"), ord("~") + 1)), *map(chr, range(ord("¡"), ord("¬") + 1))]
    alphabet += [*map(chr, range(ord("®"), ord("ÿ") + 1)), *map(chr, range(256, 324))]
    writer.add_token_list([*alphabet[:255], alphabet[0] + alphabet[1]])
    writer.add_token_merges([f"{alphabet[0]} {alphabet[1]}"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        name = llama_cpp_name(hf_name)
        values = tensor.numpy().astype(np.float32)
        if arch == "llama" and ".attn_q." in name:
            values = llama_cpp_permute(values, config.num_attention_heads)
        if arch == "llama" and ".attn_k." in name:
            values = llama_cpp_permute(values, config.num_key_value_heads)
        qtype = type_for(name, types) if values.ndim == 2 else QType.F32
        if qtype == QType.F16:
            writer.add_tensor(name, values.astype(np.float16))
        elif qtype == QType.F32:
            writer.add_tensor(name, values)
        else:
            writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module", params=["llama-untied", "llama-tied", "qwen2-bias"])
def tiny_gguf(request, tmp_path_factory):
    import transformers

    kind, variant = request.param.split("-")
    overrides = dict(TINY, tie_word_embeddings=variant == "tied")
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**overrides))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**overrides))
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.uniform_(-1, 1)
    path = tmp_path_factory.mktemp(request.param) / "tiny.gguf"
    write_tiny_gguf(path, model.eval(), kind)
    return model, path


def test_tiny_gguf_weights_are_the_original_within_quantization_error(tiny_gguf):
    """Independent of transformers: the loaded tensors are the model's, un-permuted."""
    model, path = tiny_gguf
    files = load_model_files(path)
    original = model.state_dict()
    for name, tensor in files.weights():
        qtype = type_for(llama_cpp_name(name)) if tensor.ndim == 2 else QType.F32
        error = (tensor - original[name]).abs().max().item()
        assert error <= TOLERANCE[qtype], (name, qtype.name, error)
    assert files.hf_config["tie_word_embeddings"] == model.config.tie_word_embeddings
    weights = dict(files.weights())
    for name, type_name, data, shape in files.gguf_tensors():
        values = gguf.quants.dequantize(data, QType[type_name])
        assert tuple(weights[name].shape) == shape, name
        assert np.array_equal(values.reshape(shape), weights[name].numpy()), (name, type_name)


def test_tiny_gguf_equals_transformers(tiny_gguf):
    from transformers import AutoModelForCausalLM

    model, path = tiny_gguf
    reference = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    files = load_model_files(path)
    assert_state_dict_matches(files, reference)
    assert_config_matches(files.hf_config, reference.config)
    assert files.hf_config["architectures"] == [type(model).__name__]
    assert files.hf_config["attention_bias"] == (type(model).__name__ == "Qwen2ForCausalLM")


@pytest.mark.gpu
def test_q4_1_gguf_stays_packed_on_cuda_and_generates_as_on_cpu(tmp_path):
    """A GGUF whose linears are all Q4_1 (as the default model's mostly are): on CUDA they
    load packed into Int4Linear (the fused qkv and gate_up too) and run on the INT4 kernel;
    greedy tokens equal the CPU path's, which dequantizes at load."""
    import transformers

    from engine.llm import LLM
    from engine.quant.int4_linear import Int4Linear
    from engine.sampling_params import SamplingParams

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.uniform_(-1, 1)
    path = tmp_path / "q4_1.gguf"
    linears = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    write_tiny_gguf(path, model.eval(), "llama", {**TYPE_OF, **dict.fromkeys(linears, QType.Q4_1)})
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompts = [[1, 5, 9, 33, 120], [1, 200, 17]]
    tokens = {}
    for device in ("cpu", "cuda"):
        llm = LLM(str(path), device=device, dtype="float32", kv_cache_memory_bytes=1 << 24)
        assert llm.engine.weight_format == ("gguf-q4_1" if device == "cuda" else "dense")
        if device == "cuda":
            layer = llm.engine.runner.model.layers[0]
            for module in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
                assert isinstance(module, Int4Linear), type(module)
        outs = llm.generate(prompts, params)
        tokens[device] = [list(o.outputs[0].token_ids) for o in outs]
    assert tokens["cuda"] == tokens["cpu"]


def test_gguf_with_unsupported_architecture_raises(tmp_path):
    path = tmp_path / "falcon.gguf"
    writer = gguf.GGUFWriter(str(path), "falcon")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="'falcon' is not supported"):
        load_model_files(path)


def test_not_a_gguf_file_raises(tmp_path):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ValueError, match="GGUF"):
        load_model_files(path)


# tiny Hugging Face directories -------------------------------------------------------------------


def write_tiny_tokenizer(path) -> None:
    """A byte-level BPE tokenizer.json and a tokenizer_config.json with a chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {c: i + 3 for i, c in enumerate(sorted(alphabet))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    tokenizer.save(str(path / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": {"content": "</s>", "special": True},
        "unk_token": "<unk>",
        "add_bos_token": True,
        "chat_template": "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config))


HF_CASES = {
    # name: (architecture, config overrides, max_shard_size or None, dtype)
    "llama-untied-llama3rope": (
        "llama",
        dict(
            tie_word_embeddings=False,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
        None,
        torch.float32,
    ),
    "llama-tied-sharded-bf16": ("llama", dict(tie_word_embeddings=True), "40KB", torch.bfloat16),
    "qwen2-sharded": ("qwen2", dict(tie_word_embeddings=False), "30KB", torch.float32),
}


@pytest.fixture(scope="module", params=sorted(HF_CASES))
def tiny_hf_dir(request, tmp_path_factory):
    import transformers

    kind, overrides, max_shard_size, dtype = HF_CASES[request.param]
    config_class, model_class = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[kind]
    torch.manual_seed(0)
    model = model_class(config_class(**(TINY | overrides))).to(dtype).eval()
    path = tmp_path_factory.mktemp(request.param)
    if max_shard_size is None:
        model.save_pretrained(path)
    else:
        model.save_pretrained(path, max_shard_size=max_shard_size)
    write_tiny_tokenizer(path)
    return model, path, max_shard_size is not None


def test_hf_dir_weights_are_identical(tiny_hf_dir):
    model, path, is_sharded = tiny_hf_dir
    assert (path / "model.safetensors.index.json").is_file() == is_sharded
    if is_sharded:
        assert len(list(path.glob("*.safetensors"))) > 1
    files = load_model_files(path)
    assert files.source == "hf"
    assert_state_dict_matches(files, model)


def test_hf_dir_config_and_tokenizer(tiny_hf_dir):
    model, path, _ = tiny_hf_dir
    files = load_model_files(str(path))
    config = files.hf_config
    assert_config_matches(config, model.config)
    assert config["architectures"] == [type(model).__name__]
    assert config["torch_dtype"] == str(model.dtype).removeprefix("torch.")
    expected_scaling = model.config.rope_parameters.get("rope_type", "default")
    if expected_scaling == "default":
        assert config["rope_scaling"] is None
    else:
        assert config["rope_scaling"]["rope_type"] == expected_scaling
        assert config["rope_scaling"]["factor"] == 8.0
    assert files.generation_config["eos_token_id"] == 2
    assert files.quantization_config is None
    tokenizer = files.tokenizer
    assert tokenizer.bos_token_id == 1 and tokenizer.eos_token_ids == {2}
    ids = tokenizer.encode("hé ✓")
    assert ids[0] == 1 and tokenizer.decode(ids) == "hé ✓"
    messages = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(messages) == "user: hi\n"
    with pytest.raises(ValueError, match="gguf_tensors"):
        files.gguf_tensors()


def test_hf_dir_quantize_config_json(tiny_hf_dir, tmp_path):
    import shutil

    _, path, _ = tiny_hf_dir
    copy = shutil.copytree(path, tmp_path / "model")
    quantize_config = {"bits": 4, "group_size": 128, "desc_act": False}
    (copy / "quantize_config.json").write_text(json.dumps(quantize_config))
    assert load_model_files(copy).quantization_config == quantize_config


def test_hf_dir_without_generation_config_ends_on_config_eos(tiny_hf_dir, tmp_path):
    import shutil

    _, path, _ = tiny_hf_dir
    copy = shutil.copytree(path, tmp_path / "model")
    (copy / "generation_config.json").unlink()
    config = json.loads((copy / "config.json").read_text())
    config["eos_token_id"] = [2, 0]
    (copy / "config.json").write_text(json.dumps(config))
    files = load_model_files(copy)
    assert files.generation_config == {}
    assert files.tokenizer.eos_token_ids == {0, 2}


@pytest.mark.parametrize(
    ("remove", "error", "match"),
    [
        ("config.json", FileNotFoundError, "config.json"),
        ("tokenizer.json", FileNotFoundError, "tokenizer.json"),
        ("*.safetensors", FileNotFoundError, "safetensors"),
        ("model-00001-*.safetensors", FileNotFoundError, "shards missing"),
    ],
)
def test_hf_dir_missing_files_raise(tmp_path, remove, error, match):
    import transformers

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))
    if remove.startswith("model-"):
        model.save_pretrained(tmp_path, max_shard_size="40KB")
    else:
        model.save_pretrained(tmp_path)
    write_tiny_tokenizer(tmp_path)
    for file in tmp_path.glob(remove):
        file.unlink()
    with pytest.raises(error, match=match):
        load_model_files(tmp_path)


def test_bad_paths_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model_files(tmp_path / "nowhere")
    text_file = tmp_path / "weights.bin"
    text_file.write_text("x")
    with pytest.raises(ValueError, match="neither a directory nor a .gguf file"):
        load_model_files(text_file)
