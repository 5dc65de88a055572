import random

import pytest

from agent.base.backoff import Backoff, BackoffPolicy


def test_ceiling_doubles_up_to_cap():
    b = Backoff(BackoffPolicy(base_s=1, cap_s=60, jitter="none"))
    delays = [b.next_delay() for _ in range(10)]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]


def test_full_jitter_stays_within_ceiling_and_spreads():
    b = Backoff(BackoffPolicy(base_s=1, cap_s=60, jitter="full"), random.Random(7))
    for attempt in range(12):
        ceiling = b.ceiling()
        d = b.next_delay()
        assert 0 <= d <= ceiling
    # the spread is what breaks lock-step: 500 devices at attempt 3 don't pick one instant
    samples = []
    for seed in range(500):
        bb = Backoff(BackoffPolicy(base_s=1, cap_s=60), random.Random(seed))
        bb.attempts = 3
        samples.append(bb.next_delay())
    assert max(samples) - min(samples) > 7.0
    bins = {}
    for s in samples:
        bins[int(s * 10)] = bins.get(int(s * 10), 0) + 1
    assert max(bins.values()) < 25  # uniform over 8 s: ~6 per 100 ms, never 5% at once


def test_equal_jitter_keeps_at_least_half():
    b = Backoff(BackoffPolicy(base_s=2, cap_s=60, jitter="equal"), random.Random(1))
    for _ in range(10):
        ceiling = b.ceiling()
        d = b.next_delay()
        assert ceiling / 2 <= d <= ceiling


def test_never_gives_up_and_never_overflows():
    b = Backoff(BackoffPolicy(base_s=1, cap_s=60, jitter="none"))
    for _ in range(5000):
        d = b.next_delay()
    assert d == 60 and b.attempts == 5000


def test_reset_starts_over():
    b = Backoff(BackoffPolicy(base_s=1, cap_s=60, jitter="none"))
    for _ in range(5):
        b.next_delay()
    b.reset()
    assert b.next_delay() == 1


@pytest.mark.parametrize("mode", ["full", "equal", "none"])
def test_modes_are_deterministic_with_a_seeded_rng(mode):
    a = Backoff(BackoffPolicy(jitter=mode), random.Random(3))
    b = Backoff(BackoffPolicy(jitter=mode), random.Random(3))
    assert [a.next_delay() for _ in range(6)] == [b.next_delay() for _ in range(6)]
