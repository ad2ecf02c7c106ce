"""The request protocol between the mock vLLM connector and the mock LMCache server, and the prefix keys both use.

JSON objects over a ZMQ REQ/REP pair, one request and one reply at a time. Requests carry `op`:
`register` (the engine's group_tokens_per_block; the reply carries the chunk size to use, or an error the connector
raises), `lookup` (chunk keys of a prompt; the reply says how many leading keys are stored), `store` (chunk keys
plus the bytes one chunk occupies), `clear`, and `ping`. Replies carry `ok` and either the result or `error`.

Keys are chained hashes: key i covers the salt and every token up to the end of chunk i, so a key names a whole
prefix, exactly like LMCache's prefix hashes, and a different `cache_salt` never matches. The same function keys the
vLLM mock's local prefix cache at its block size.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from glm53.errors import Glm53Error

OPS = ("register", "lookup", "store", "clear", "ping")


def prefix_keys(salt: str, tokens: Sequence[int], block: int, limit: int | None = None) -> list[str]:
    """One key per whole `block`-token prefix of `tokens[:limit]`; key i names the salt and tokens[: (i+1)*block]."""
    end = len(tokens) if limit is None else min(limit, len(tokens))
    digest = hashlib.blake2b(salt.encode(), digest_size=16).digest()
    keys = []
    for start in range(0, end - end % block, block):
        chunk = ",".join(map(str, tokens[start : start + block])).encode()
        digest = hashlib.blake2b(digest + chunk, digest_size=16).digest()
        keys.append(digest.hex())
    return keys


def encode(message: Mapping[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def decode(data: bytes) -> dict[str, Any]:
    """A message object, or a one-line error for anything that is not a JSON object with a known `op`/`ok`."""
    try:
        message = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise Glm53Error("malformed message: not JSON") from None
    if not isinstance(message, dict):
        raise Glm53Error("malformed message: not a JSON object")
    return message


def reply_ok(**fields: Any) -> dict[str, Any]:
    return {"ok": True, **fields}


def reply_error(error: str) -> dict[str, Any]:
    return {"ok": False, "error": error}
