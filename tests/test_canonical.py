"""route="canonical" on the CPU: equal, bit for bit, to its definition built
from the scalar twins (docs/numerics.md), and identical for every thread
count, batch size and run. The q8 activation mode makes the same promises."""
from __future__ import annotations

import numpy as np
import pytest

import muser
from muser import _core

TYPES = ["Q5_K", "Q6_K", "Q4_K", "Q8_0", "F16", "BF16", "F32"]


def _file(head_file, weight_type: str) -> str:
    return head_file(weight_type=weight_type, hidden=512, vocab=1003)  # 1003: not a multiple of any tile


def _states(rng: np.random.Generator, t: int, h: int) -> np.ndarray:
    x = rng.standard_normal((t, h)).astype(np.float32)
    x[:, rng.integers(0, h, 8)] *= 20
    return x


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.mark.parametrize("weight_type", TYPES)
def test_canonical_route_equals_its_scalar_definition(head_file, rng, weight_type):
    """canonical norm -> gamma -> canonical matvec (the scalar twin) -> canonical
    epilogue (scalar), composed op by op, against the head's fast kernels."""
    path = _file(head_file, weight_type)
    head = muser.Head.load(path, route="canonical")
    s = head.spec
    f = muser.GGUFFile(path)
    gamma = muser.dequantize(f.tensor_bytes(s.norm_weight), "F32", (s.hidden_size,))
    w = np.ascontiguousarray(f.tensor_bytes(s.output_weight).reshape(s.vocab_size, -1))
    x = _states(rng, 5, s.hidden_size)
    normed = muser.ops.rms_norm(x, gamma, s.eps, order="canonical")
    raw = muser.ops.matvec(w, s.output_type, normed, isa="scalar", threads=1)
    expect = _core.ops_softcap_canon(raw, s.applied_scale, s.softcap or 0.0, "scalar")
    assert np.array_equal(_bits(head(x)), _bits(expect))


@pytest.mark.parametrize("weight_type,acts", [("Q5_K", "f32"), ("Q6_K", "f32"), ("Q8_0", "f32"), ("BF16", "f32"),
                                               ("Q5_K", "q8"), ("Q6_K", "q8"), ("Q8_0", "q8")])
def test_bit_identical_for_every_thread_count_batch_size_and_run(head_file, rng, weight_type, acts):
    path = _file(head_file, weight_type)
    x = _states(rng, 17, 512)
    one = muser.Head.load(path, route="canonical", acts=acts, threads=1)
    singles = np.stack([one(x[k]).copy() for k in range(len(x))])
    for threads in (1, 2, 3):
        head = muser.Head.load(path, route="canonical", acts=acts, threads=threads)
        for t in (1, 3, 8, 17):
            for _ in range(2):  # and again: no state carried between runs
                assert np.array_equal(_bits(head(x[:t])), _bits(singles[:t])), (threads, t)


def test_rows_of_a_batch_equal_single_steps_in_any_position(head_file, rng):
    """Row r of a batch does not depend on the other rows: shuffling the batch shuffles the logits."""
    path = _file(head_file, "Q5_K")
    head = muser.Head.load(path, route="canonical")
    x = _states(rng, 9, 512)
    base = head(x).copy()
    perm = rng.permutation(9)
    assert np.array_equal(_bits(head(x[perm])), _bits(base[perm]))


def test_canonical_differs_from_graph_but_both_are_close(head_file, rng):
    """A test that could fail the other way: canonical is its own rounding, not
    an alias of the graph route (they differ in norm order and tanh)."""
    path = _file(head_file, "Q5_K")
    x = _states(rng, 8, 512)
    canon = muser.Head.load(path, route="canonical")(x).copy()
    graph = muser.Head.load(path, route="graph")(x).copy()
    assert not np.array_equal(_bits(canon), _bits(graph))
    assert np.max(np.abs(canon.astype(np.float64) - graph)) < 1e-4
