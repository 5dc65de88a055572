from agent.link.liveness import ACK_TIMEOUT, SILENCE, LivenessPolicy, LivenessWatchdog

POLICY = LivenessPolicy(heartbeat_interval_s=15, ack_timeout_s=5, missed_acks=1)


def fresh(policy=POLICY, now=100.0, ping=25.0):
    wd = LivenessWatchdog(policy)
    wd.reset(now, ping)
    return wd


def test_ack_watchdog_is_disarmed_until_the_first_ack():
    wd = fresh()
    wd.on_heartbeat_sent(1, 100.0)
    # no ACK ever: only silence can end it, at the server-ping-derived bound
    assert wd.check(106.0) is None
    assert wd.check(129.9) is None
    assert wd.check(130.0) == SILENCE


def test_missed_ack_after_arming_is_detected_at_ack_timeout():
    wd = fresh()
    wd.on_heartbeat_sent(1, 100.0)
    assert wd.on_ack(1, 100.05) is not None
    wd.on_heartbeat_sent(2, 115.0)
    assert wd.check(119.99) is None
    assert wd.next_deadline() == 120.0
    assert wd.check(120.0) == ACK_TIMEOUT


def test_ack_for_another_seq_does_not_count():
    wd = fresh()
    wd.on_heartbeat_sent(1, 100.0)
    wd.on_ack(1, 100.1)
    wd.on_heartbeat_sent(2, 115.0)
    assert wd.on_ack(99, 116.0) is None
    assert wd.check(120.0) == ACK_TIMEOUT


def test_missed_acks_counts_consecutive_misses():
    wd = fresh(LivenessPolicy(heartbeat_interval_s=15, ack_timeout_s=5, missed_acks=2,
                              silence_timeout_s=1000))
    wd.on_heartbeat_sent(1, 100.0)
    wd.on_ack(1, 100.1)
    wd.on_heartbeat_sent(2, 115.0)
    assert wd.check(120.0) is None and wd.consecutive_misses == 1
    wd.on_heartbeat_sent(3, 130.0)
    wd.on_ack(3, 130.2)  # a later ACK clears the streak
    assert wd.consecutive_misses == 0
    wd.on_heartbeat_sent(4, 145.0)
    wd.on_heartbeat_sent(5, 160.0)
    assert wd.check(150.0) is None
    assert wd.check(165.0) == ACK_TIMEOUT


def test_any_inbound_packet_defers_silence():
    wd = fresh()
    for t in range(100, 400, 20):  # server pings every 20 s, nothing else
        wd.on_inbound(float(t))
        assert wd.check(t + 19.9) is None


def test_silence_is_bounded_by_configuration_when_given():
    wd = fresh(LivenessPolicy(heartbeat_interval_s=2, ack_timeout_s=1, silence_timeout_s=3.5))
    assert wd.check(103.4) is None
    assert wd.check(103.5) == SILENCE


def test_derived_silence_follows_heartbeats_once_armed_with_short_pings():
    wd = fresh(LivenessPolicy(heartbeat_interval_s=15, ack_timeout_s=5, missed_acks=3), ping=5.0)
    assert wd.silence_timeout() == 20.0
    wd.on_heartbeat_sent(1, 100.0)
    wd.on_ack(1, 100.1)
    assert wd.silence_timeout() == 50.0  # never before the ACK watchdog's own verdict


def test_proven_live_needs_a_recent_ack():
    wd = fresh()
    assert not wd.proven_live(100.0)
    wd.on_heartbeat_sent(1, 100.0)
    wd.on_ack(1, 100.2)
    # the next heartbeat (115.0) is ACKed at once, but taken in only with the turn of
    # the one after it (130.0), and that one's own ACK may take 5 s
    assert wd.proven_live(135.2)
    assert not wd.proven_live(135.3)


def test_pending_heartbeats_stay_bounded_without_acks():
    wd = fresh()
    for seq in range(1, 10_000):
        wd.on_heartbeat_sent(seq, 100.0 + seq)
    assert len(wd._pending) <= 64


def test_rtt_is_measured_from_send_to_ack():
    wd = fresh()
    wd.on_heartbeat_sent(7, 100.0)
    assert abs(wd.on_ack(7, 100.042) - 0.042) < 1e-9
    assert wd.acked == 1 and wd.last_ack_at == 100.042
