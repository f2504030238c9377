"""A progress bar for the benchmarks: the current point and the ETA (tqdm).

The bar counts estimated seconds, not points: a point at 128 clients takes
longer than one at 1 (smbtorture connects every client first), so weighting
each point by its expected duration keeps the ETA honest early on.
"""

from __future__ import annotations

import sys

from tqdm import tqdm


def point_weight(nprocs: int, seconds: float) -> float:
    """A point's expected seconds: the run, plus set-up that grows with clients."""
    return seconds + 1.0 + nprocs / 32


def progress_bar(total_weight: float, what: str) -> tqdm:
    """A bar on stderr over ``total_weight`` (the sum of point_weight)."""
    return tqdm(total=total_weight, desc=what, file=sys.stderr, dynamic_ncols=True,
                bar_format="{desc}: {percentage:3.0f}% |{bar}| {elapsed} elapsed, "
                           "ETA {remaining} {postfix}")


def show_current(bar: tqdm, text: str) -> None:
    """Name the point now running after the bar."""
    bar.set_postfix_str(text, refresh=True)


class SweepProgress:
    """The SMB sweep's bar: points of ``rounds`` passes over ``nprocs`` per
    backend, and ``setup_seconds`` per backend and round when each round
    starts its backend afresh (a cluster)."""

    def __init__(self, backends: int, nprocs: list[int], rounds: int, seconds: float,
                 what: str = "bench smb", setup_seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.setup_seconds = setup_seconds
        self.points_per_backend = len(nprocs) * rounds
        self.weight_per_backend = rounds * (setup_seconds + sum(point_weight(n, seconds) for n in nprocs))
        self.done_points = 0
        self.all_points = self.points_per_backend * backends
        self.bar = progress_bar(self.weight_per_backend * backends, what)

    def __enter__(self) -> "SweepProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()

    def start(self, label: str, nprocs: int) -> None:
        show_current(self.bar, f"point {self.done_points + 1}/{self.all_points}: "
                               f"{label}, {nprocs} clients")

    def done(self, nprocs: int, line: str) -> None:
        self.done_points += 1
        self.bar.update(point_weight(nprocs, self.seconds))
        self.bar.write(line)

    def set_up(self) -> None:
        """A backend's set-up of one round is over (started or not)."""
        self.bar.update(self.setup_seconds)

    def skip_point(self, nprocs: int, line: str) -> None:
        """One point that will not run: it leaves the total."""
        self.bar.total -= point_weight(nprocs, self.seconds)
        self.all_points -= 1
        self.bar.write(line)

    def skip(self, label: str, why: str) -> None:
        """A backend that will not run: its points leave the total."""
        self.bar.total -= self.weight_per_backend
        self.all_points -= self.points_per_backend
        self.bar.write(f"skipping {label}: {why}")
