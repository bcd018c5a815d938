"""The public API as a caller meets it: Head is made only by Head.load;
check_finite is accepted wherever the non-finite error advises it; float16
and bfloat16 hidden states (what torch engines hold) are widened exactly;
bad arguments are TypeError/ValueError saying what was expected."""
from __future__ import annotations

import numpy as np
import pytest

import muser

from conftest import hidden_states

H, V = 256, 1000


@pytest.fixture
def head(head_file):
    return muser.Head.load(head_file(weight_type="Q5_K", hidden=H, vocab=V))


def test_head_is_made_by_load_only(head):
    with pytest.raises(TypeError, match="Head.load"):
        muser.Head(head._core, path="x", route="graph")


def test_check_finite_is_accepted_everywhere_the_error_advises_it(head, rng):
    x = hidden_states(rng, 2, H)
    x[1, 7] = np.nan
    for call in (lambda **kw: head(x, **kw), lambda **kw: head.argmax(x, **kw), lambda **kw: head.topk(x, 3, **kw),
                 lambda **kw: head.profile(x, **kw)):
        with pytest.raises(muser.NonFiniteError, match="check_finite=False"):
            call()
        call(check_finite=False)  # computes anyway: NaN propagates
    assert head.argmax(x[0], check_finite=False) == head.argmax(x[0])


def test_float16_hidden_states_are_widened_exactly(head, rng):
    x = hidden_states(rng, 3, H).astype(np.float16)
    np.testing.assert_array_equal(head(x), head(x.astype(np.float32)))
    np.testing.assert_array_equal(head(x[1]), head(x.astype(np.float32)[1]))
    assert head.argmax(x[0]) == head.argmax(x[0].astype(np.float32))


def test_bfloat16_hidden_states_are_widened_exactly(head, rng):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="numpy's bfloat16 comes from ml_dtypes")
    x = hidden_states(rng, 3, H).astype(ml_dtypes.bfloat16)
    wide = (x.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(head(x), head(wide))


def test_torch_bfloat16_host_tensors_are_widened_exactly(head, rng):
    torch = pytest.importorskip("torch", reason="needs torch for a bfloat16 tensor")
    x = torch.from_numpy(hidden_states(rng, 3, H)).bfloat16()
    np.testing.assert_array_equal(head(x), head(x.float().numpy()))
    np.testing.assert_array_equal(head(x[0]), head(x.float().numpy()[0]))


@pytest.mark.parametrize("bad,err", [([1, 2], TypeError), ("text", TypeError), (np.zeros((2, 3, H), np.float32), ValueError),
                                     (np.zeros(H + 1, np.float32), ValueError), (np.zeros(H, np.int32), TypeError)])
def test_bad_hidden_states_say_what_was_expected(head, bad, err):
    with pytest.raises(err, match="hidden"):
        head(bad)


@pytest.mark.parametrize("k,err", [(0, ValueError), (V + 1, ValueError), (2.5, TypeError), (True, TypeError)])
def test_bad_k_is_refused(head, rng, k, err):
    with pytest.raises(err, match="k must"):
        head.topk(hidden_states(rng, 1, H)[0], k)
