"""Progress lines for long jobs: rates (texts/s, tokens/s, ...) and an ETA where the total is known."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("tpu_mlm.progress")


class Progress:
    """Counts named quantities and logs their totals and rates at most every ``interval`` seconds.

    ``fraction_done`` returns how much of the whole job is done (0..1), or ``None`` when that is unknown;
    the ETA comes from it."""

    def __init__(self, what: str, fraction_done: Callable[[], float | None] = lambda: None, interval: float = 10.0):
        self.what = what
        self.fraction_done = fraction_done
        self.interval = interval
        self.started = self.last_logged = time.monotonic()
        self.counts: dict[str, int] = {}

    def update(self, **increments: int) -> None:
        for name, increment in increments.items():
            self.counts[name] = self.counts.get(name, 0) + increment
        now = time.monotonic()
        if now - self.last_logged >= self.interval:
            self.last_logged = now
            log.info("%s", self.line(now))

    def line(self, now: float | None = None) -> str:
        elapsed = max((now or time.monotonic()) - self.started, 1e-9)
        parts = [f"{name} {count:,} ({count / elapsed:,.0f}/s)" for name, count in self.counts.items()]
        fraction = self.fraction_done()
        if fraction:
            remaining = elapsed * (1 - fraction) / fraction
            parts.append(f"{fraction:.0%} done, ETA {_clock(remaining)}")
        return f"{self.what}: " + ", ".join(parts) + f", elapsed {_clock(elapsed)}"


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
