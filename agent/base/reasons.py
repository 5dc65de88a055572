"""Why a connection ended, or why an attempt failed: the link's vocabulary, as status,
the journal, the report, the watchdog's patience and root's installer say it
(docs/troubleshooting.md)."""
from __future__ import annotations

# The library says "Connection error" for every failed connect; the dialer finds which
# of these it was.
# -- a connection that ended
ACK_TIMEOUT = "ack-timeout"
SILENCE = "silence"
TRANSPORT_ERROR = "transport-error"
SERVER_DISCONNECT = "server-disconnect"
THROTTLE = "throttle"
MESSAGE_TOO_LARGE = "message-too-large"  # the server sent more than the agent takes
MESSAGE_REFUSED = "message-refused"  # the server sent binary: the protocols are JSON text
SHUTDOWN = "shutdown"
DRAINED = "drained"       # the server drained: the link moved to a new connection, proven first
IDLE_REAP = "idle-reap"   # lost after the same idle gap as before: a box reaps idle flows
# -- an attempt that failed, in the order a connect meets them
DNS_FAILED = "dns-failed"                    # the server's name does not resolve
NETWORK_UNREACHABLE = "network-unreachable"  # no route: the device is not on a network
CONNECT_TIMEOUT = "connect-timeout"          # the TCP handshake got no answer
CONNECTION_REFUSED = "connection-refused"    # the server's host answered with a reset
PROXY_UNREACHABLE = "proxy-unreachable"      # the configured proxy cannot be reached
PROXY_AUTH = "proxy-auth"                    # the proxy wants (other) credentials: 407
PROXY_REFUSED = "proxy-refused"              # the proxy would not CONNECT to the server
TLS_UNTRUSTED = "tls-untrusted"              # a certificate the device does not trust
CLOCK_BEHIND = "clock-behind"                # a certificate not valid yet by this clock
TLS_EXPIRED = "tls-expired"                  # expired, or this clock is ahead
TLS_FAILED = "tls-failed"                    # any other TLS handshake failure
CAPTIVE_PORTAL = "captive-portal"            # something else answered: a page, a redirect
HTTP_ERROR = "http-error"                    # an HTTP error status instead of the upgrade
NO_ANSWER = "no-answer"                      # connected, then silence: a hung server
REFUSED = "refused"                          # the server refused the device's credentials
CONNECT_FAILED = "connect-failed"            # none of the above
# The network or the server is out: a fresh process mends none of these, so while the
# link is down for one of them the watchdog's restarts grow further apart
# (watchdog_gate.OutagePatience).
OUTAGE_REASONS = frozenset({DNS_FAILED, NETWORK_UNREACHABLE, CONNECT_TIMEOUT,
                            CONNECTION_REFUSED, NO_ANSWER, PROXY_UNREACHABLE,
                            CAPTIVE_PORTAL})
# Nothing answered: where the device's own network may be the cause (no carrier, no
# lease, a gateway that answers nothing). Every other reason carries an answer from
# beyond the device (a reset, TLS, the proxy, HTTP, the server's words): its network
# works, and the network's healer (device/network.py) does nothing for it.
SILENT_PATH = frozenset({DNS_FAILED, NETWORK_UNREACHABLE, CONNECT_TIMEOUT, NO_ANSWER,
                         PROXY_UNREACHABLE, CONNECT_FAILED, ACK_TIMEOUT, SILENCE,
                         TRANSPORT_ERROR})

# What to do about a failed attempt, in docs/troubleshooting.md's words, shortened: the
# doctor (app/doctor.py) says it beside the reason; tests/test_doctor.py holds the two
# to each other, so the page and the command cannot give different advice.
WHAT_TO_DO = {
    DNS_FAILED: "resolvectl query HOST (or getent hosts HOST) on the screen; behind a proxy, "
                "set [network] proxy: the proxy resolves the name",
    NETWORK_UNREACHABLE: "the cable, Wi-Fi, DHCP: ip route",
    CONNECT_TIMEOUT: "a firewall dropping the port; a site that allows only its proxy: "
                     "set [network] proxy",
    CONNECTION_REFUSED: "the server is down or listens on another port (ScreenTinker: 3001)",
    NO_ANSWER: "the server (or a node behind its balancer) is stuck",
    PROXY_UNREACHABLE: "the proxy's host and port in [network] proxy",
    PROXY_AUTH: "the user and password in [network] proxy, percent-encoded",
    PROXY_REFUSED: "the proxy must allow CONNECT to the server's port",
    TLS_UNTRUSTED: "a TLS-inspecting box: its CA in [server] ca_file (which replaces the "
                   "system's store) or added with update-ca-certificates",
    CLOCK_BEHIND: "NTP: timedatectl; a Pi without an RTC boots at the last saved time",
    TLS_EXPIRED: "the server's certificate, or timedatectl",
    TLS_FAILED: "[network] client_cert for a server that asks for one",
    CAPTIVE_PORTAL: "a hotel or guest network's login page; the queue holds meanwhile",
    HTTP_ERROR: "the URL's path and port; a reverse proxy in front of the server must pass "
                "websockets",
    REFUSED: "the device was deleted on the server: it drops its token and pairs again "
             "(a new code)",
}
