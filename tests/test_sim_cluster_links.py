"""kvlab.sim.cluster.links: FIFO and processor-sharing completion times in closed form (rule C14).

FIFO: ``end_i = max(start_i, end_{i-1}) + service_i``. Processor sharing (Opal O20, Dynamo's
bandwidth sharing): ``k`` active transfers each progress at ``1/k``; checked against a fluid
simulation written here, and for simultaneous submissions against
``C_(k) = C_(k-1) + (n - k + 1)·(s_(k) − s_(k-1))`` (sizes sorted).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_cluster_reference import cluster_trace

from kvlab.sim.cluster import simulate
from kvlab.sim.cluster.links import Link
from kvlab.sim.cluster.routers import Decision, Router


def drive(link: Link, jobs: list[tuple[float, float]]) -> dict[int, float]:
    """Submit ``(start_s, service_s)`` jobs in time order, advancing the link to each submission
    first (as the cluster loop does); job index → completion time."""
    done: dict[int, float] = {}
    for i, (start, service) in enumerate(jobs):
        done.update({job: end for end, job in link.advance(start)})
        link.submit(start, service, i)
    done.update({job: end for end, job in link.advance(math.inf)})
    return done


def fifo_reference(jobs: list[tuple[float, float]]) -> list[float]:
    out, end = [], -math.inf
    for start, service in jobs:
        end = max(start, end) + service
        out.append(end)
    return out


def ps_reference(jobs: list[tuple[float, float]]) -> list[float]:
    """A fluid simulation of processor sharing: between events every active job gets 1/k."""
    out = [math.nan] * len(jobs)
    active: dict[int, float] = {}
    t, i = 0.0, 0
    while i < len(jobs) or active:
        k = len(active)
        finish = t + min(active.values()) * k if active else math.inf
        if i < len(jobs) and jobs[i][0] < finish:
            for j in active:
                active[j] -= (jobs[i][0] - t) / k
            t = jobs[i][0]
            active[i] = jobs[i][1]
            i += 1
            continue
        least = min(active.values())
        for j in list(active):
            active[j] -= least
            if active[j] <= 1e-12:
                out[j] = finish
                del active[j]
        t = finish
    return out


job_lists = st.lists(st.tuples(st.floats(0, 5, allow_nan=False), st.floats(0.01, 2, allow_nan=False)),
                     min_size=1, max_size=12).map(sorted)


@settings(max_examples=25, deadline=None)
@given(job_lists)
def test_fifo_and_ps_match_their_closed_forms(jobs):
    fifo, ps = Link("a", "fifo"), Link("b", "ps")
    got_fifo, got_ps = drive(fifo, jobs), drive(ps, jobs)
    assert [got_fifo[i] for i in range(len(jobs))] == pytest.approx(fifo_reference(jobs), rel=1e-9, abs=1e-9)
    assert [got_ps[i] for i in range(len(jobs))] == pytest.approx(ps_reference(jobs), rel=1e-9, abs=1e-9)
    # both are work-conserving: the same busy time and the same last completion
    assert fifo.busy_s == pytest.approx(sum(s for _, s in jobs), rel=1e-9)
    assert ps.busy_s == pytest.approx(fifo.busy_s, rel=1e-9)
    assert max(got_ps.values()) == pytest.approx(max(got_fifo.values()), rel=1e-9)
    assert fifo.active == ps.active == 0


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 30).map(lambda x: x / 10), min_size=1, max_size=10))
def test_ps_with_simultaneous_submissions_completes_by_size(services):
    link = Link("pcie", "ps")
    for i, s in enumerate(services):
        link.submit(1.0, s, i)
    order = sorted(range(len(services)), key=lambda i: (services[i], i))
    expected, t, prev = {}, 1.0, 0.0
    for k, i in enumerate(order):  # C_(k) = C_(k-1) + (n - k)·(s_(k) − s_(k-1)), k from 0
        t += (len(services) - k) * (services[i] - prev)
        prev = services[i]
        expected[i] = t
    assert link.next_completion() == pytest.approx(expected[order[0]], rel=1e-9)
    done = link.advance(math.inf)
    assert [job for _, job in done] == order  # by size, equal sizes in submission order
    assert [end for end, _ in done] == pytest.approx([expected[i] for i in order], rel=1e-9)


def test_fifo_queues_a_small_transfer_behind_a_large_one_ps_does_not():
    fifo, ps = Link("a", "fifo"), Link("b", "ps")
    for link in (fifo, ps):
        link.submit(0.0, 4.0, "large")
        link.submit(0.0, 1.0, "small")
    assert fifo.advance(10.0) == [(4.0, "large"), (5.0, "small")]
    assert ps.advance(10.0) == [(2.0, "small"), (5.0, "large")]


def test_bad_link_arguments_name_the_field():
    with pytest.raises(ValueError, match="sharing"):
        Link("x", "lifo")
    link = Link("x", "fifo")
    with pytest.raises(ValueError, match="service_s"):
        link.submit(0.0, -1.0, "job")
    link.submit(2.0, 1.0, "job")
    link.advance(3.0)
    with pytest.raises(ValueError, match="before the link's clock"):
        link.submit(1.0, 1.0, "late")


@pytest.mark.parametrize("sharing", ["fifo", "ps"])
def test_a_submission_does_not_swallow_completed_transfers(sharing):
    link = Link("x", sharing)
    link.submit(0.0, 1.0, "a")
    link.submit(1.0, 1.0, "b")  # at a's completion, before anyone advanced the link
    assert link.advance(5.0) == [(1.0, "a"), (2.0, "b")]


class CopyToW1(Router):
    """Every request to w1 after a cache transfer from w0."""

    name = "copy"

    def select(self, request, view, now):  # noqa: ARG002
        return Decision("w1", transfer_from="w0", transfer_blocks=4)


def test_same_instant_transfers_all_complete_under_processor_sharing():
    trace = cluster_trace([(0.0, 10, 2, 1), (0.0, 10, 2, 2)])
    result = simulate(trace, num_workers=2, capacity_blocks=50, router=CopyToW1(), link_sharing="ps")
    assert result.summary.completed_requests == 2
