"""CPU time that other processes use on a shared machine while a benchmark runs.

Benchmarks on a shared development machine (another user's tests, a profiler)
measure that load as much as their own code. `CpuMonitor` samples, in a
background thread, every process's CPU time and accumulates what processes
outside this process's tree used, so a benchmark can wait for a quiet machine
and record how quiet it was in each measured window.
"""

from __future__ import annotations

import os
import threading
import time


class CpuMonitor:
    """CPU time that processes outside this benchmark use while it runs.

    The machine may be shared (another user's tests). A background thread
    samples every process's CPU time each `interval_s` and accumulates what
    processes outside this process's tree (the sides, their Ray workers) used.
    A process that starts and ends between two samples is missed, so the share
    is a lower bound. `wait_quiet` holds a side back until others are idle.
    """

    def __init__(self, interval_s: float = 0.5) -> None:
        import psutil  # with accelerate, which TRL needs

        self._psutil = psutil
        self.interval_s = interval_s
        self.num_cpus = os.cpu_count() or 1
        self.samples: list[tuple[float, float]] = []  # (epoch s, cumulative CPU s of others)
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> CpuMonitor:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        procs = list(self._psutil.process_iter(["pid", "ppid", "cpu_times"]))
        parent = {p.info["pid"]: p.info["ppid"] for p in procs}
        me = os.getpid()

        def ours(pid: int) -> bool:
            for _ in range(64):  # the tree is shallow; the bound guards a ppid cycle
                if pid == me:
                    return True
                if pid not in parent or pid in (0, 1):
                    return False
                pid = parent[pid]
            return False

        first = not self.samples
        used, now = 0.0, {}
        for p in procs:
            times = p.info["cpu_times"]
            if times is None:
                continue
            now[p.info["pid"]] = cpu = times.user + times.system
            if not first and not ours(p.info["pid"]):
                used += max(0.0, cpu - self._last.get(p.info["pid"], 0.0))
        self._last = now
        total = self.samples[-1][1] + used if self.samples else 0.0
        self.samples.append((time.time(), total))

    def other_frac(self, start: float, end: float) -> float:
        """Share of all cores that other processes used between two epoch times.

        Over the samples that bracket the window: the last at or before `start`
        and the first at or after `end` (the window's edges to within `interval_s`).
        """
        before = [s for s in self.samples if s[0] <= start] or self.samples[:1]
        after = [s for s in self.samples if s[0] >= end] or self.samples[-1:]
        (t0, used0), (t1, used1) = before[-1], after[0]
        return (used1 - used0) / (max(t1 - t0, 1e-9) * self.num_cpus)

    def wait_quiet(self, *, max_frac: float, window_s: float, timeout_s: float) -> float:
        """Wait until others used under `max_frac` of the cores for `window_s`; seconds waited."""
        t0 = time.time()
        time.sleep(window_s)
        while self.other_frac(time.time() - window_s, time.time() - self.interval_s) > max_frac:
            if time.time() - t0 > timeout_s:
                break
            time.sleep(1.0)
        return time.time() - t0
