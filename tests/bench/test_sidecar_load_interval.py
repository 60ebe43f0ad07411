"""bench.sidecar_load's bootstrap interval around a p95 ratio (bench.sidecar_load_level)."""

from __future__ import annotations

import numpy as np

from bench.sidecar_load_level import p95_ratio_interval


def test_the_interval_holds_the_ratio_and_widens_with_fewer_samples() -> None:
    rng = np.random.default_rng(7)
    one = rng.gamma(4.0, 5.0, size=40)  # ~20 ms with a tail, as one conversation's queries
    many = rng.gamma(4.0, 10.0, size=640)  # twice as slow
    ratio = float(np.percentile(many, 95) / np.percentile(one, 95))
    low, high = p95_ratio_interval(many, one)
    assert low < ratio < high
    # 40 samples under the ratio against 640 above: most of the width is the 40's.
    wide = high - low
    low_big, high_big = p95_ratio_interval(many, rng.gamma(4.0, 5.0, size=640))
    assert high_big - low_big < wide / 2


def test_the_same_samples_print_the_same_interval() -> None:
    one, many = [10.0, 12.0, 30.0, 11.0] * 10, [25.0, 40.0, 61.0, 22.0] * 40
    assert p95_ratio_interval(many, one) == p95_ratio_interval(many, one)


def test_identical_samples_give_a_point_and_no_samples_give_zero() -> None:
    assert p95_ratio_interval([20.0] * 40, [10.0] * 40) == (2.0, 2.0)
    assert p95_ratio_interval([], [10.0]) == (0.0, 0.0)
