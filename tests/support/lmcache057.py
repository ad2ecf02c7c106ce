"""What the real negotiating LMCache generation (lmcache 0.5.7rc2) and the real engine wrote, captured 2026-12-01
(tests/fixtures/logs/README.md says how), for the tests that read its lines."""

from __future__ import annotations

from pathlib import Path

CAPTURED = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "lmcache-0.5.7rc2"


def captured(run: str, process: str) -> list[str]:
    """The lines of one captured log: `run` default or min2000, `process` vllm or lmcache."""
    return (CAPTURED / f"{run}-{process}.log").read_text(errors="replace").splitlines()


# The seed's negotiation line as the real server logged it, decorated (LMCache 0.5.6 never logs it).
NEGOTIATED = next(
    line
    for line in captured("default", "lmcache")
    if "Negotiated LMCache MP chunk size to 1152 (configured_min=256, required_alignment=1152)" in line
)
