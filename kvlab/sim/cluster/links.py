"""A shared link (PCIe, NIC) that transfers run on: first-come-first-served or processor sharing.

Rule C14 (cluster_sim.md §6.5): a transfer's *service time* is what it would take alone — the
device model's time (:func:`kvlab.tiers.cost.fetch_time_s`, a network ``read_time_s``). Under
``"fifo"`` (the default) transfers run one after another in submission order; under ``"ps"``
(Opal O20, Dynamo's bandwidth-sharing model) every active transfer progresses at
``1 / (number active)`` of the link, so a small transfer is not stuck behind a large one.
The two can disagree in sign for some questions (BLIS), hence a flag.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from kvlab.core.validate import check_choice, check_real, check_str

#: Link sharing disciplines.
LINK_SHARING = ("fifo", "ps")
_EPS = 1e-12


class Link:
    """Transfers sharing one link; completion times on the simulated clock.

    Args:
        name: the link's name (shown in the transfers frame).
        sharing: ``"fifo"`` or ``"ps"`` (see the module docstring).

    Raises ``ValueError`` for an unknown ``sharing``, a negative service time or a submission
    before the link's clock.

    Example:
        >>> link = Link("pcie", "ps")
        >>> link.submit(0.0, 2.0, "a"); link.submit(0.0, 1.0, "b")
        >>> link.next_completion()          # both at half speed: b's 1 s of service ends at 2 s
        2.0
        >>> link.advance(4.0)
        [(2.0, 'b'), (3.0, 'a')]
    """

    def __init__(self, name: str, sharing: str = "fifo") -> None:
        self.name = check_str("name", name, nonempty=True)
        self.sharing = check_choice("sharing", sharing, LINK_SHARING)
        self._clock = 0.0
        self._fifo: deque[tuple[float, Any]] = deque()  # (end_s, job)
        self._busy_until = 0.0
        self._active: list[list] = []  # ps: [remaining_s, order, job]
        self._order = 0
        self._done: list[tuple[float, Any]] = []  # ps: completed during a submit, not yet advanced past
        self.busy_s = 0.0
        """Seconds the link carried at least one transfer (a FIFO link: the sum of services)."""

    @property
    def active(self) -> int:
        """Transfers submitted and not yet reported complete."""
        return len(self._fifo) if self.sharing == "fifo" else len(self._active) + len(self._done)

    def submit(self, now: float, service_s: float, job: Any) -> None:
        """Start ``job`` at ``now`` with ``service_s`` seconds of work (its time alone on the link)."""
        service_s = check_real("service_s", service_s, low=0.0)
        if now < self._clock - _EPS:
            raise ValueError(f"submit at {now} s is before the link's clock {self._clock} s")
        if self.sharing == "fifo":
            start = max(now, self._busy_until)
            self._busy_until = start + service_s
            self.busy_s += service_s
            self._fifo.append((self._busy_until, job))
            self._clock = now
            return
        self._progress(now, self._done)
        self._active.append([service_s, self._order, job])
        self._order += 1

    def next_completion(self) -> float | None:
        """When the next transfer completes, if none is submitted meanwhile (``None``: idle)."""
        if self.sharing == "fifo":
            return self._fifo[0][0] if self._fifo else None
        if self._done:
            return self._done[0][0]
        if not self._active:
            return None
        return self._clock + min(a[0] for a in self._active) * len(self._active)

    def advance(self, now: float) -> list[tuple[float, Any]]:
        """Every transfer complete by ``now``, as ``(end_s, job)`` in completion order."""
        done: list[tuple[float, Any]] = []
        if self.sharing == "fifo":
            while self._fifo and self._fifo[0][0] <= now + _EPS:
                done.append(self._fifo.popleft())
            self._clock = max(self._clock, now)
            return done
        done, self._done = self._done, []
        self._progress(now, done)
        return done

    def _progress(self, now: float, done: list[tuple[float, Any]]) -> None:
        """Processor sharing from the link's clock to ``now``: every active transfer gets
        ``1/k`` of the link; those whose work runs out complete (ties in submission order)."""
        while self._active:
            k = len(self._active)
            least = min(a[0] for a in self._active)
            end = self._clock + least * k
            if end > now + _EPS:
                share = (now - self._clock) / k
                for a in self._active:
                    a[0] -= share
                self.busy_s += now - self._clock
                break
            for a in self._active:
                a[0] -= least
            self.busy_s += end - self._clock
            self._clock = end
            finished = sorted((a for a in self._active if a[0] <= _EPS), key=lambda a: a[1])
            self._active = [a for a in self._active if a[0] > _EPS]
            done.extend((end, a[2]) for a in finished)
        self._clock = max(self._clock, now)
