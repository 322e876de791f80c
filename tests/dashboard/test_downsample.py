import itertools
import math

import numpy as np
import pytest

from dashboard.charts.downsample import (
    bin_columns,
    downsample,
    downsample_indices,
    downsample_many,
    select_window,
    window_downsample,
)

METHODS = ["minmax", "lttb"]


def noisy_kl(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    steps = np.arange(n)
    values = 1e-3 + 1e-4 * rng.standard_normal(n)
    return steps, values


@pytest.mark.parametrize("method", METHODS)
def test_one_step_spike_in_100k_points_survives_to_500(method):
    steps, values = noisy_kl(100_000)
    values[61_803] = 0.5  # a one-step KL spike, 5000x the baseline level
    x, y = downsample(steps, values, 500, method)
    assert len(x) <= 500
    assert 61_803 in x.tolist()
    assert y.max() == 0.5


@pytest.mark.parametrize("method", METHODS)
def test_negative_spike_survives(method):
    steps, values = noisy_kl(20_000, seed=1)
    values[777] = -3.0  # e.g. a cosine between policy and aux gradients dipping
    x, y = downsample(steps, values, 200, method)
    assert y.min() == -3.0 and 777 in x.tolist()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("max_points", [4, 5, 7, 100, 501])
def test_size_bound_and_strictly_increasing_steps(method, max_points):
    steps, values = noisy_kl(10_007, seed=2)
    x, y = downsample(steps, values, max_points, method)
    assert 0 < len(x) <= max_points
    assert np.all(np.diff(x) > 0)
    assert x[0] == 0 and x[-1] == 10_006  # first and last points kept
    assert len(x) == len(y)


def test_minmax_keeps_global_envelope_and_each_bucket_extreme():
    steps = np.arange(1_000)
    values = np.sin(steps / 7.0) * (1 + steps / 1000)
    x, y = downsample(steps, values, 102, "minmax")
    assert y.max() == values.max() and y.min() == values.min()
    # The interior is split into 50 equal-count buckets; each keeps its min and max.
    edges = np.linspace(1, 999, 51).astype(int)
    kept = set(x.tolist())
    for lo, hi in itertools.pairwise(edges):
        bucket = values[lo:hi]
        assert lo + int(np.argmin(bucket)) in kept
        assert lo + int(np.argmax(bucket)) in kept


def test_short_series_comes_back_whole():
    x, y = downsample([1, 2, 3], [0.1, None, 0.3], 500)
    assert x.tolist() == [1, 2, 3]
    assert y[0] == 0.1 and math.isnan(y[1]) and y[2] == 0.3


def test_unsorted_steps_are_sorted():
    x, y = downsample([3, 1, 2], [30.0, 10.0, 20.0], 10)
    assert x.tolist() == [1, 2, 3] and y.tolist() == [10.0, 20.0, 30.0]


@pytest.mark.parametrize("method", METHODS)
def test_gaps_stay_gaps(method):
    steps = np.arange(5_000)
    values: list[float | None] = list(np.linspace(0.0, 1.0, 5_000))
    for i in range(1_000, 1_200):
        values[i] = None  # metric not logged for a while
    values[3_000] = float("nan")  # a one-step NaN
    values[4_000] = float("inf")  # not drawable either
    x, y = downsample(steps, values, 300, method)
    assert len(x) <= 300 and np.all(np.diff(x) > 0)
    gap_steps = x[np.isnan(y)].tolist()
    assert gap_steps == [1_000, 3_000, 4_000]  # one NaN at the first step of each gap
    assert not np.any(np.isinf(y))
    assert 999 in x.tolist() and 1_200 in x.tolist()  # segments keep their ends


def test_gaps_denser_than_the_budget_still_bounded_and_keep_spike():
    steps, values = noisy_kl(10_000, seed=3)
    values[::2] = np.nan  # every other step missing: 5,000 gaps
    values[5_001] = 1.0
    x, y = downsample(steps, values, 100)
    assert len(x) <= 100 and np.all(np.diff(x) > 0)
    assert np.nanmax(y) == 1.0


def test_indices_point_into_original_unsorted_arrays():
    steps = np.array([5, 4, 3, 2, 1, 0] * 1 + list(range(6, 1000)))
    values = np.cos(steps.astype(float))
    idx = downsample_indices(steps, values, 50)
    assert np.all(np.diff(steps[idx]) > 0)
    assert np.array_equal(values[idx], np.cos(steps[idx].astype(float)))


def test_bad_arguments():
    with pytest.raises(ValueError, match="method"):
        downsample([1, 2], [1.0, 2.0], 10, method="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_points"):
        downsample([1, 2], [1.0, 2.0], 3)
    with pytest.raises(ValueError, match="equal length"):
        downsample([1, 2], [1.0], 10)


def test_select_window_keeps_one_neighbour_each_side():
    steps = np.arange(0, 100, 10)
    x, _ = select_window(steps, steps * 1.0, 25, 55)
    assert x.tolist() == [20, 30, 40, 50, 60]
    x, _ = select_window(steps, steps * 1.0, None, 5)
    assert x.tolist() == [0, 10]
    x, _ = select_window(steps, steps * 1.0, 95, None)
    assert x.tolist() == [90]


def test_zoomed_window_is_full_resolution():
    steps, values = noisy_kl(2_000, seed=4)
    x, y = window_downsample(steps, values, 500, start=1_000, end=1_300)
    assert x.tolist() == list(range(999, 1_302))  # every step, plus the two neighbours
    assert np.array_equal(y, values[999:1_302])
    x, _ = window_downsample(steps, values, 500)
    assert len(x) <= 500


def test_bin_columns_averages_and_keeps_distributions():
    steps = np.arange(6)
    load = np.array([[1.0, 0.0, 0.5, 0.5, 0.2, np.nan], [0.0, 1.0, 0.5, 0.5, 0.8, np.nan]])
    x, z = bin_columns(steps, load, 3)
    assert x.tolist() == [0, 2, 4]
    np.testing.assert_allclose(z[:, 0], [0.5, 0.5])
    np.testing.assert_allclose(z[:, 2], [0.2, 0.8])  # the NaN column is left out of the mean
    np.testing.assert_allclose(z.sum(axis=0), 1.0)
    x, z = bin_columns(steps, load, 10)
    assert z.shape == (2, 6)


def test_downsample_many_equals_downsample_of_each_series():
    """The vectorised path picks exactly the points of the one-series path: ties,
    gaps (sparse and denser than the budget), unsorted steps, short series."""
    rng = np.random.default_rng(1)
    cases = []
    for _ in range(120):
        n = int(rng.integers(1, 2500))
        y = rng.normal(size=n).round(int(rng.integers(0, 3)))  # rounding makes ties
        if rng.random() < 0.5:
            y[rng.random(n) < rng.choice([0.001, 0.01, 0.3])] = np.nan
        x = np.arange(n) * 3
        if rng.random() < 0.2:
            x = rng.permutation(x)
        cases.append((x, y))
    for max_points in (4, 5, 7, 50, 500):
        for (x, y), (mx, my) in zip(cases, downsample_many(cases, max_points), strict=True):
            ex, ey = downsample(x, y, max_points)
            assert np.array_equal(ex, mx) and np.array_equal(ey, my, equal_nan=True)
