"""A process that ran a CPU head and then forks (multiprocessing's fork mode,
data-loader workers): the children run steps on the same head and get the
parent's logits. Under OpenMP (GCC's libgomp) such a child hung in its first
step; muser's pool (src/cpp/cpu/thread_pool.cpp) is reset in a forked child.
Every wait has a timeout, so a regression fails instead of hanging the run."""
from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest

import muser
from conftest import hidden_states

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or "fork" not in mp.get_all_start_methods(),
                                reason="needs fork()")

TIMEOUT_S = 30  # a child step takes milliseconds; this only catches a hang

# The parent's head and inputs; fork children inherit them (nothing is pickled).
_inherited: dict = {}


def _child(conn) -> None:
    """Runs in the forked child: a few steps on the parent's head, the logits sent back."""
    head, xs = _inherited["head"], _inherited["xs"]
    conn.send([np.array(head(x)) for x in xs])
    conn.close()


def _run_children(n: int) -> list[list[np.ndarray]]:
    ctx = mp.get_context("fork")
    procs, conns = [], []
    for _ in range(n):
        parent_end, child_end = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(child_end,), daemon=True)
        p.start()
        child_end.close()
        procs.append(p)
        conns.append(parent_end)
    try:
        results = []
        for i, (p, c) in enumerate(zip(procs, conns)):
            assert c.poll(TIMEOUT_S), f"forked child {i} sent nothing within {TIMEOUT_S} s: it hung"
            results.append(c.recv())
            p.join(TIMEOUT_S)
            assert not p.is_alive(), f"forked child {i} did not exit within {TIMEOUT_S} s"
            assert p.exitcode == 0, f"forked child {i} exited with {p.exitcode}"
        return results
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()


@pytest.mark.parametrize("route,acts", [("graph", "f32"), ("canonical", "f32"), ("fused", "q8")])
def test_forked_children_run_the_parents_head(head_file, rng, route, acts):
    # vocab 4096 at threads=2: the matvec is 16 row chunks, so the parent's
    # pool workers exist (and OpenMP's team did) before the fork
    path = head_file(weight_type="Q5_K", hidden=512, vocab=4096)
    head = muser.Head.load(path, route=route, acts=acts, threads=2)
    xs = [hidden_states(rng, t, 512) for t in (1, 4, 8)]
    want = [head(x).copy() for x in xs]
    _inherited.update(head=head, xs=xs)
    try:
        for got in _run_children(2):
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
        # the parent's head still works after its children ran
        np.testing.assert_array_equal(head(xs[1]), want[1])
    finally:
        _inherited.clear()


def test_fork_of_a_fork_child_still_works(head_file, rng):
    """The reset holds in a child of a child (the handler must survive a fork)."""
    path = head_file(weight_type="Q8_0", hidden=256, vocab=4096)
    head = muser.Head.load(path, route="canonical", threads=2)
    x = hidden_states(rng, 4, 256)
    want = head(x).copy()

    def grandchild(conn):
        conn.send(np.array(head(x)))

    def child(conn):
        head(x)  # the child's own pool, then a fork from it
        ctx = mp.get_context("fork")
        r, w = ctx.Pipe(duplex=False)
        p = ctx.Process(target=grandchild, args=(w,))
        p.start()
        got = r.recv() if r.poll(TIMEOUT_S) else None
        p.join(TIMEOUT_S)
        if p.is_alive():
            p.kill()
        conn.send(got)

    ctx = mp.get_context("fork")
    r, w = ctx.Pipe(duplex=False)
    p = ctx.Process(target=child, args=(w,), daemon=False)
    p.start()
    try:
        assert r.poll(2 * TIMEOUT_S), "forked child hung"
        got = r.recv()
        assert got is not None, "the grandchild hung"
        np.testing.assert_array_equal(got, want)
        p.join(TIMEOUT_S)
        assert not p.is_alive()
    finally:
        if p.is_alive():
            p.kill()
            p.join()
