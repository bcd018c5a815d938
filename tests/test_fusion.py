"""The seam's fusion hook: a route says which adjacent nodes may run as one
kernel, a device fuses those it has a kernel for, and a fused kernel gives
exactly the bytes of its nodes run one by one. The graph route's cap nodes and
the reference route never fuse; the profile names every node a kernel holds;
``muser.ops`` runs the route's own nodes, fused or not, to the same bytes."""
from __future__ import annotations

import numpy as np
import pytest

import muser

from conftest import bits, hidden_states

TYPES = ["Q5_K", "Q6_K", "Q4_K", "Q8_0", "F16", "BF16", "F32"]
Q8_TYPES = {"Q5_K", "Q6_K", "Q4_K", "Q8_0"}
ROUTES = ["reference", "graph", "fused", "canonical"]


@pytest.mark.parametrize("weight_type", TYPES)
@pytest.mark.parametrize("route", ROUTES)
def test_fused_kernels_give_the_unfused_nodes_bytes(head_file, rng, weight_type, route):
    path = head_file(weight_type=weight_type, hidden=512, vocab=777, random_quants=True)
    x = hidden_states(rng, 5, 512)
    for acts in ("f32", "q8") if weight_type in Q8_TYPES else ("f32",):
        fused = muser.Head.load(path, route=route, acts=acts)
        plain = muser.Head.load(path, route=route, acts=acts, fuse=False)
        assert all(len(s) == 1 for s in plain.steps)
        np.testing.assert_array_equal(bits(fused(x)), bits(plain(x)), err_msg=f"{route} {acts}")
        for t in (1, 3):  # batch rows equal single steps through the fused kernels too
            np.testing.assert_array_equal(bits(fused(x[:t])), bits(plain(x)[:t]))


def test_which_nodes_each_route_fuses_on_the_cpu(head_file):
    path = head_file(weight_type="Q8_0", hidden=256, vocab=300)
    steps = {r: muser.Head.load(path, route=r).steps for r in ROUTES}
    assert steps["reference"] == [(label,) for label, _ in muser.Head.load(path, route="reference").nodes]
    assert steps["graph"] == [("final_norm", "final_norm_gamma"), ("lm_head",), ("logit_scale",),
                              ("softcap_scale_in",), ("softcap_tanh",), ("softcap_scale_out",)]
    for r in ("fused", "canonical"):
        assert steps[r] == [("final_norm", "final_norm_gamma"), ("lm_head", "softcap")], r


def test_a_head_without_a_cap_fuses_its_scale(head_file):
    path = head_file(weight_type="Q8_0", hidden=256, vocab=300)
    head = muser.Head.load(path, route="fused", softcap=None)
    assert head.steps == [("final_norm", "final_norm_gamma"), ("lm_head", "logit_scale")]


@pytest.mark.parametrize("route", ["graph", "fused", "canonical", "reference"])
@pytest.mark.parametrize("scale,cap", [(0.196116, 20.0), (1.0, 30.0), (0.0625, 0.0)])
def test_ops_epilogue_runs_the_routes_own_nodes(rng, route, scale, cap):
    x = (rng.standard_normal((3, 1001)) * 40).astype(np.float32)
    ours = muser.ops.epilogue(x, scale, cap, route=route)
    np.testing.assert_array_equal(bits(ours), bits(muser.ops.epilogue(x, scale, cap, route=route, fuse=False)))
    want = x.copy()
    if route == "graph":
        want = want * np.float32(scale) if scale != 1.0 else want
        if cap:
            want = (np.tanh((want * np.float32(np.float32(1) / np.float32(cap))).astype(np.float64))
                    .astype(np.float32) * np.float32(cap))
        np.testing.assert_allclose(ours, want, rtol=2e-6, atol=1e-6)
    assert not np.shares_memory(ours, x)


@pytest.mark.parametrize("order", ["ggml", "canonical"])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_ops_norm_fused_equals_two_nodes(rng, order, kind):
    x = hidden_states(rng, 4, 640)
    gamma = (1 + 0.1 * rng.standard_normal(640)).astype(np.float32)
    fn = muser.ops.rms_norm if kind == "rms" else muser.ops.layer_norm
    np.testing.assert_array_equal(bits(fn(x, gamma, 1e-5, order=order)),
                                  bits(fn(x, gamma, 1e-5, order=order, fuse=False)))
    with pytest.raises(ValueError, match="order"):
        fn(x, gamma, 1e-5, order="fast")
