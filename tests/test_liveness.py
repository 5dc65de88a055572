from agent.link.liveness import ACK_TIMEOUT, SILENCE, LivenessWatchdog
from agent.config.policies import LivenessPolicy

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


# -- a server that ACKs nothing: each heartbeat proven by the kernel --------------------
def test_the_kernel_proves_each_heartbeat_where_the_server_acks_none():
    wd = fresh()   # opened at 100, server pings every 25 s
    assert not wd.proven_live(100.0) and wd.proof is None
    wd.on_heartbeat_sent(1, 100.0)
    assert wd.next_deadline() == 105.0          # woken to ask the kernel at the ACK deadline
    assert wd.deliveries_due(104.9) == []
    assert wd.deliveries_due(105.0) == [1]
    wd.on_delivery(1, True, 105.0, rtt_s=0.04)
    # the handshake is the application's proof until its first ping
    assert wd.proven_live(105.0) and wd.proof == "tcp-ack+ping" and wd.last_rtt_s == 0.04
    # each heartbeat renews the proof; the server's pings, 25 s apart, the application's
    for n, t in enumerate(range(115, 400, 15), start=2):
        if t % 25 < 15:
            wd.on_server_ping(float(t - t % 25))
        wd.on_heartbeat_sent(n, float(t))
        assert wd.deliveries_due(t + 5.0) == [n]
        wd.on_delivery(n, True, t + 5.0)
        assert wd.check(t + 5.0) is None and wd.proven_live(t + 5.0), t


def test_an_undelivered_heartbeat_ends_the_link_at_its_deadline_not_after_the_ping_interval():
    wd = fresh()
    wd.on_heartbeat_sent(1, 100.0)
    wd.on_delivery(*wd.deliveries_due(105.0), True, 105.0)
    wd.on_heartbeat_sent(2, 115.0)
    assert wd.deliveries_due(120.0) == [2]
    wd.on_delivery(2, False, 120.0)            # the silent drop: bytes left unacknowledged
    assert wd.check(120.0) == ACK_TIMEOUT      # not SILENCE at 130 (the ping interval)


def test_a_live_host_without_its_application_stops_the_proof():
    # a long silence timeout, so that only the proof rule is at work here
    wd = fresh(LivenessPolicy(heartbeat_interval_s=15, ack_timeout_s=5, silence_timeout_s=1000))
    t = 100.0
    for n in range(1, 6):                     # the kernel keeps acknowledging; no ping at all
        wd.on_heartbeat_sent(n, t)
        wd.on_delivery(n, True, t + 5)
        t += 15
    # 2 x 25 s ping interval + 5 s since the handshake: the application is not heard from
    assert wd.proven_live(155.0) and not wd.proven_live(155.1)
    wd.on_server_ping(160.0)
    assert wd.proven_live(160.0)


def test_where_the_kernel_cannot_tell_the_pings_alone_prove_and_nothing_is_a_miss():
    wd = fresh()
    wd.on_heartbeat_sent(1, 100.0)
    wd.on_delivery(*wd.deliveries_due(105.0), None, 105.0)
    wd.on_heartbeat_sent(2, 115.0)
    wd.on_delivery(*wd.deliveries_due(120.0), False, 120.0)  # never armed: not a verdict
    assert wd.check(120.0) is None and not wd.proven_live(120.0) and wd.proof is None
    wd.on_server_ping(125.0)
    assert wd.proven_live(125.0) and wd.proof == "ping"


def test_a_server_that_acks_is_not_asked_about_at_the_kernel():
    wd = fresh()
    wd.on_heartbeat_sent(1, 100.0)
    wd.on_ack(1, 100.05)
    assert wd.deliveries_due(200.0) == []
    wd.on_heartbeat_sent(2, 115.0)
    assert wd.deliveries_due(200.0) == [] and wd.proof == "heartbeat-ack"
