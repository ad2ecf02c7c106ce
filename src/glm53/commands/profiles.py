"""`glm53 profiles`: print the model profiles, as a table for people or as JSON for the Helm chart and scripts.

The chart's `files/profiles.json` is generated from exactly `glm53 profiles --json`, so that output is stable: keys
sorted, two-space indent, one trailing newline.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from glm53.commands.parser import command_parser
from glm53.profiles import PROFILES, ModelProfile, ServingFlag, get_profile, profile_as_dict


def profiles_json(profiles: Sequence[ModelProfile]) -> str:
    """The JSON document `--json` prints: `{name: profile_as_dict(profile)}`, sorted and indented."""
    return json.dumps({p.name: profile_as_dict(p) for p in profiles}, indent=2, sort_keys=True)


def _groups_text(profile: ModelProfile) -> str:
    measured = ", ".join(f"N={n} at TP {tp}" for tp, n in sorted(profile.unified_block_size_by_tp.items()))
    shape = (
        "[" + ", ".join("N" if g.tokens_per_block is None else str(g.tokens_per_block) for g in profile.groups) + "]"
    )
    return f"{shape} ({measured})" if measured else shape


def _flag_text(flag: ServingFlag) -> str:
    return f"{flag.flag} {flag.value}" if flag.value is not None else f"no {flag.flag} ({flag.why})"


def profile_text(profile: ModelProfile) -> str:
    """A readable block for one profile: identity, geometry, chunk sizes, flags, notes."""
    yes_no = {True: "yes", False: "no"}
    # A fact no seed states is None: show it as unverified rather than folding it into "no" (see profiles.basis).
    known = {True: "yes", False: "no", None: "unverified"}
    rows = [
        ("model", f"{profile.model_id} ({profile.architecture}, {profile.num_layers} layers)"),
        ("layers", ", ".join(f"{count} {kind}" for kind, count in profile.layer_mix.items())),
        ("tensor parallel", f"{profile.tensor_parallel_size} ({profile.gpus} GPUs per replica)"),
        ("groups", _groups_text(profile)),
        ("strict prefix", yes_no[profile.strict_prefix]),
        (
            "chunk size",
            f"{profile.recommended_chunk_size} (validated: {', '.join(map(str, profile.validated_chunk_sizes))})",
        ),
        ("prefix caching", "required" if profile.prefix_caching_required else "optional"),
        ("separate groups", "required" if profile.separate_object_groups_required else "not needed"),
        ("kv cache dtype", f"{profile.kv_cache_dtype} (FP8 on Hopper: {known[profile.fp8_kv_cache_hopper]})"),
        ("batch invariant", known[profile.batch_invariant]),
        ("text only", _flag_text(profile.text_only_flag)),
        ("serving extras", " ".join(_flag_text(f) for f in profile.serving_extras)),
        (
            "MTP",
            f"{profile.mtp_speculative_tokens} speculative tokens, "
            f"{'validated' if profile.mtp_validated_with_lmcache else 'not validated'} with LMCache",
        ),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [f"{profile.name}: {profile.display_name}"]
    lines += [f"  {label.ljust(width)}  {value}" for label, value in rows]
    lines += [f"  - {note}" for note in profile.notes]
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    parser = command_parser("profiles", "Print the model profiles.")
    parser.add_argument("name", nargs="?", help=f"one profile: {', '.join(PROFILES)} (default: all)")
    parser.add_argument("--json", action="store_true", help="machine-readable output (what the Helm chart reads)")
    args = parser.parse_args(list(argv))
    selected = [get_profile(args.name)] if args.name else list(PROFILES.values())
    print(profiles_json(selected) if args.json else "\n\n".join(profile_text(p) for p in selected))
    return 0
