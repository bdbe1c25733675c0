"""Progress of a run on stderr, one case at a time, and why the cases not run were not."""
from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any, Iterable, Mapping


class Progress:
    """Progress on stderr: a rich bar ("bar", for a terminal), a plain line every
    LINE_EVERY_S seconds ("lines", for a log or a pipe), or nothing (None).
    `advance(label)` before each case; `advance(None)` after the last."""
    LINE_EVERY_S = 5.0

    def __init__(self, mode: str | bool | None, total: int):
        self.mode = "bar" if mode is True else (mode or None)
        self.total, self._bar = total, None

    def __enter__(self):
        if self.mode == "lines":
            return self._lines()
        if self.mode != "bar":
            return lambda label: None
        # rich only for a bar: a run without one never imports it
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)
        from rich.progress import Progress as Bar

        self._bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), TimeRemainingColumn(),
                             console=Console(stderr=True), transient=True)
        self._bar.start()
        task = self._bar.add_task("cases", total=self.total)
        started = [False]

        def advance(label):
            if started[0]:
                self._bar.advance(task)
            started[0] = label is not None
            if label is not None:
                self._bar.update(task, description=label)
        return advance

    def _lines(self):
        start = last = time.monotonic()
        done = [-1]

        def advance(label):
            nonlocal last
            done[0] += 1
            now = time.monotonic()
            if label is None or now - last >= self.LINE_EVERY_S:
                last = now
                where = f" {label}" if label else " done"
                print(f"[{done[0]}/{self.total}] {now - start:.0f} s{where}", file=sys.stderr, flush=True)
        return advance

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()


#: the decline and skip reasons a summary lists; the rest are counted (all with --verbose)
TOP_REASONS = 5


def not_run_reasons(records: Iterable[Mapping[str, Any]], top: int | None = TOP_REASONS) -> list[str]:
    """Why cases were not run, most frequent first: one line per (verdict, reason) with its
    count, e.g. "42 declined: head-dim-not-served"; `top` None lists all, else the first
    `top` and a line counting the rest."""
    from bundlegen.harness import verdicts as V

    counts: Counter[tuple[str, str]] = Counter()
    for record in records:
        verdict = record.get("verdict")
        if verdict in V.NOT_RUN:
            why = record.get("reason") or " ".join(str(record.get("detail") or "no reason given").split())
            counts[(verdict, why)] += 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ranked if top is None else ranked[:top]
    lines = [f"{n} {verdict}: {why}" for (verdict, why), n in shown]
    if len(ranked) > len(shown):
        rest = sum(n for _, n in ranked[len(shown):])
        lines.append(f"... {len(ranked) - len(shown)} more reasons ({rest} cases); --verbose lists all")
    return lines
