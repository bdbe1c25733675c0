"""Progress of a run on stderr, one case at a time, and why the cases not run were not."""
from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any, Iterable, Mapping


class Progress:
    """Progress on stderr: a rich bar ("bar", for a terminal), a plain line every
    LINE_EVERY_S seconds ("lines", for a log or a pipe), or nothing (None).
    `advance(label)` before each case (label: "level/group/case-id", maybe followed by
    " [device]"); `advance(None)` after the last. With `predicted` (case id -> predicted
    seconds, the calibrated cost model's) the time left is the predicted seconds of the
    cases not yet finished shared by the `workers`: it falls as cases finish instead of
    being scaled from the first cases' pace (the 50-run deterministic cases first made
    that double mid-run)."""
    LINE_EVERY_S = 5.0

    def __init__(self, mode: str | bool | None, total: int,
                 predicted: Mapping[str, float] | None = None, workers: int = 1):
        self.mode = "bar" if mode is True else (mode or None)
        self.total, self._bar = total, None
        self.predicted, self.workers = dict(predicted or {}), max(1, workers)
        self._left = sum(self.predicted.values())
        self._running: list[str] = []

    def left_s(self, label: str | None) -> float | None:
        """Seconds predicted for the cases not yet finished once `label` starts (the cases
        started before it by a worker now free count as finished); None without predictions."""
        if not self.predicted:
            return None
        if len(self._running) >= self.workers:
            self._left -= self.predicted.get(self._running.pop(0), 0.0)
        if label is not None:
            self._running.append(case_of(label))
        else:
            self._left, self._running = 0.0, []
        return max(0.0, self._left) / self.workers

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

        left = (TextColumn("{task.fields[left]}") if self.predicted else TimeRemainingColumn())
        self._bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), left, console=Console(stderr=True), transient=True)
        self._bar.start()
        task = self._bar.add_task("cases", total=self.total, left="")
        started = [False]

        def advance(label):
            if started[0]:
                self._bar.advance(task)
            started[0] = label is not None
            eta = self.left_s(label)
            if label is not None:
                self._bar.update(task, description=label,
                                 left="" if eta is None else f"~{clock(eta)} left (predicted)")
        return advance

    def _lines(self):
        start = last = time.monotonic()
        done = [-1]

        def advance(label):
            nonlocal last
            done[0] += 1
            now = time.monotonic()
            eta = self.left_s(label)
            if label is None or now - last >= self.LINE_EVERY_S:
                last = now
                where = f" {label}" if label else " done"
                left = "" if eta is None or label is None else f", ~{clock(eta)} left (predicted)"
                print(f"[{done[0]}/{self.total}] {now - start:.0f} s{left}{where}", file=sys.stderr, flush=True)
        return advance

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()


def case_of(label: str) -> str:
    """The case id of a progress label ("quick/shapes/0a1b2c3d4e5f [cuda:0]")."""
    return label.split(" ", 1)[0].rsplit("/", 1)[-1]


def clock(seconds: float) -> str:
    """0:42, 3:05, 1:02:09."""
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


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
