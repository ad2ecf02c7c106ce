"""The fault table: what one fault did to the requests around it and to the cache, from the load's outcomes (pure)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from glm53.pod.faults.load import Outcome
from glm53.pod.kubelet import RestartEvent


@dataclass(frozen=True)
class FaultWindow:
    """One fault as it played out, in the load's seconds: when it was injected, when it was over (a freeze resumed, an
    idle spell ended), when observing it ended, the restarts the kubelet made meanwhile and when the restarted
    containers passed their startup probes again."""

    fault: str
    injected_s: float
    ended_s: float
    restarts: tuple[RestartEvent, ...]
    over_s: float | None = None
    started_again: tuple[RestartEvent, ...] = ()


@dataclass(frozen=True)
class FaultRow:
    fault: str
    sent: int
    failed: int
    hung: int
    # Seconds from the fault to the first document stored that LMCache then found whole; None: never within the window.
    hits_back_s: float | None
    hit_tokens: int
    expected_tokens: int
    restarted: str
    # Seconds from the fault until it was over: the sidecar answering again (its startup probe passed) or the freeze
    # or idle spell ended. No cache can serve before that, so the recovery is what follows it.
    over_after_s: float = 0.0
    # What LMCache found, after the fault, for documents stored before it (sent again once the hits were back), and
    # the most it could have found; None: none was sent again. Without an L2 tier a restarted server has none of them.
    kept_tokens: int | None = None
    kept_expected: int = 0
    # The chart's alerts a real Prometheus raised from the fault on and whether each cleared by the row's end
    # (glm53.pod.prometheus.AlertsSeen); None: no Prometheus watched this fault.
    alerts: str | None = None

    @property
    def kept_share(self) -> float | None:
        return None if self.kept_tokens is None or not self.kept_expected else self.kept_tokens / self.kept_expected

    @property
    def recovery_s(self) -> float | None:
        """Seconds from the fault being over to LMCache's hits being back."""
        return None if self.hits_back_s is None else round(max(0.0, self.hits_back_s - self.over_after_s), 1)

    @property
    def hit_share(self) -> float | None:
        return self.hit_tokens / self.expected_tokens if self.expected_tokens else None


def row(window: FaultWindow, outcomes: Sequence[Outcome]) -> FaultRow:
    """The table row of `window`: the requests that started in it, and the reloads of documents stored in it."""
    inside = [o for o in outcomes if window.injected_s <= o.started_s < window.ended_s]
    stored_after = [
        o for o in inside if o.kind == "reload" and o.stored_at_s is not None and o.stored_at_s >= window.injected_s
    ]
    whole = [o for o in stored_after if o.hit_tokens is not None and o.hit_tokens >= o.expected_tokens > 0]
    back = min((o.stored_at_s for o in whole if o.stored_at_s is not None), default=None)
    after = [o for o in stored_after if back is not None and o.stored_at_s is not None and o.stored_at_s >= back]
    counts: dict[str, int] = {}
    for event in window.restarts:
        counts[event.container] = counts.get(event.container, 0) + 1
    over = max([window.over_s or window.injected_s, *(e.at_s for e in window.started_again)])
    return FaultRow(
        fault=window.fault,
        sent=len(inside),
        failed=sum(1 for o in inside if o.failed),
        hung=sum(1 for o in inside if o.hung),
        hits_back_s=None if back is None else round(back - window.injected_s, 1),
        hit_tokens=sum(o.hit_tokens or 0 for o in after),
        expected_tokens=sum(o.expected_tokens for o in after),
        restarted=", ".join(f"{name} x{count}" for name, count in sorted(counts.items())) or "none",
        over_after_s=round(over - window.injected_s, 1),
    )


def with_revisits(current: FaultRow, revisits: Sequence[Outcome]) -> FaultRow:
    """`current` with the documents stored before the fault, sent again after it: their requests count as sent (and
    failed or hung), their hits as what the cache kept through the fault."""
    if not revisits:
        return current
    return dataclasses.replace(
        current,
        sent=current.sent + len(revisits),
        failed=current.failed + sum(1 for o in revisits if o.failed),
        hung=current.hung + sum(1 for o in revisits if o.hung),
        kept_tokens=sum(o.hit_tokens or 0 for o in revisits),
        kept_expected=sum(o.expected_tokens for o in revisits),
    )


# A fault's window may end once this many reloads of documents stored after the hits came back were seen: one whole
# hit could be luck, three in a row say the new server stores and serves again.
CONFIRMING_RELOADS = 3


def hits_confirmed(current: FaultRow, window: FaultWindow, outcomes: Sequence[Outcome]) -> bool:
    """Whether `current` (the row of `window` so far) has its hits back and confirmed by CONFIRMING_RELOADS reloads
    of documents stored since: the condition on which a watch of a fault ends, rather than a fixed observing time."""
    if current.hits_back_s is None:
        return False
    since = window.injected_s + current.hits_back_s
    confirming = [o for o in outcomes if o.kind == "reload" and (o.stored_at_s or 0.0) >= since]
    return len(confirming) >= CONFIRMING_RELOADS


HEADER = (
    "fault",
    "sent",
    "failed",
    "hung",
    "over after",
    "hits back after",
    "hit tokens after recovery",
    "stored before, hit after",
    "restarted",
)


ALERTS_HEADER = "alerts raised (at the row's end)"


def format_table(title: str, rows: Sequence[FaultRow]) -> list[str]:
    """A plain-text table, one line per fault, under `title`: "over after" counts from the fault, "hits back after"
    from the fault being over. The alerts column only when a Prometheus watched some fault ("-": not this one)."""
    with_alerts = any(r.alerts is not None for r in rows)
    header: tuple[str, ...] = (*HEADER, ALERTS_HEADER) if with_alerts else HEADER
    cells: list[tuple[str, ...]] = [header]
    for r in rows:
        back = "never" if r.recovery_s is None else f"{r.recovery_s:g} s"
        share = r.hit_share
        hits = _share(r.hit_tokens, r.expected_tokens, share)
        over = f"{r.over_after_s:g} s"
        kept = "-" if r.kept_tokens is None else _share(r.kept_tokens, r.kept_expected, r.kept_share)
        measured = (r.fault, str(r.sent), str(r.failed), str(r.hung), over, back, hits, kept, r.restarted)
        cells.append((*measured, r.alerts or "-") if with_alerts else measured)
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    lines = [title]
    for index, line in enumerate(cells):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return lines


def _share(tokens: int, expected: int, share: float | None) -> str:
    return f"{tokens}/{expected}" + ("" if share is None else f" ({share:.0%})")
