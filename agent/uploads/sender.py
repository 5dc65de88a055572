"""HTTP for the upload queue: one POST per item (or per proof-of-play batch).

Every request carries ``Idempotency-Key`` (the item id), so a retry after a lost
answer is stored once at the server. An item is done only on the server's receipt: a
2xx that echoes the key (uploads) or names the record (proof of play). Anything else a
site puts in the server's place (a captive portal's 200 login page, a redirect, which
is never followed: a token must not travel to another host) holds the whole queue as
the server being out of reach, and is never a verdict on the item.

Header values are checked here, once, before requests sees them (it encodes them
latin-1 and raises on anything else): a token that breaks the token rule (a file from an
older build, say) holds the queue as a credential problem, an item whose header values
are not printable ASCII is refused for good with the reason. Neither is an exception
out of the uploads loop.
"""
from __future__ import annotations

import json
import re

import requests
import urllib3

from ..base.egress import Egress
from ..base.http import HostileAnswer, read_capped
from ..base.identifiers import token_problem, usable_device_id
from ..runtime.deadline import deadline
from .schedule import AUTH, OK, PERMANENT, TRANSIENT, UNREACHABLE, Outcome, classify
from .store import Item

TIMEOUT = (5.0, 30.0)  # connect, read
MAX_ANSWER_BYTES = 64 * 1024
HEADER_VALUE_RE = re.compile(r"[\x21-\x7e]+")   # visible ASCII: no encoding, no line breaks
# a 2xx without the server's receipt: a captive portal's page, a middlebox's answer
_NOT_THE_SERVER = Outcome(UNREACHABLE, "a 2xx without the server's receipt: something "
                                       "else answered for the server")


class UploadSender:
    def __init__(self, server_url: str, identity, egress: Egress = Egress()):
        """``identity`` is (device_id, token), or a callable returning it or None."""
        self.server_url = server_url
        self._identity = identity if callable(identity) else (lambda: identity)
        self.session = egress.session(server_url)

    @property
    def ready(self) -> bool:
        return self._identity() is not None

    def _credentials(self) -> tuple[str, dict] | Outcome:
        """(the device's URL, its Authorization header), or why they cannot be sent."""
        identity = self._identity()
        if identity is None:   # unpaired since the worker looked at ``ready``
            return Outcome(AUTH, "not paired")
        device_id, token = identity
        if not usable_device_id(device_id):
            return Outcome(AUTH, "device id: not usable in a URL")
        problem = token_problem("token", token)
        if problem:
            return Outcome(AUTH, f"{problem}; not sent")
        return f"{self.server_url}/api/v1/devices/{device_id}", {"Authorization": f"Bearer {token}"}

    def send_one(self, item: Item) -> Outcome:
        creds = self._credentials()
        if isinstance(creds, Outcome):
            return creds
        problem = _header_problem(("Idempotency-Key", item.id), ("X-Upload-Kind", item.kind))
        if problem:
            return Outcome(PERMANENT, problem)
        base, auth = creds
        headers = {**auth, "Idempotency-Key": item.id, "X-Upload-Kind": item.kind,
                   "Content-Type": "application/octet-stream"}
        outcome, body = self._post(f"{base}/uploads", headers, item.payload)
        if outcome.kind == OK and not (isinstance(body, dict) and body.get("id") == item.id):
            return _NOT_THE_SERVER
        return outcome

    def send_batch(self, items: list[Item]) -> dict[str, Outcome]:
        """Proof-of-play records in one request; the server ACKs them by id."""
        creds = self._credentials()
        if isinstance(creds, Outcome):
            return {i.id: creds for i in items}
        outcomes, records, carried = {}, [], []
        for item in items:
            problem = _header_problem(("Idempotency-Key", item.id))
            if problem:
                outcomes[item.id] = Outcome(PERMANENT, problem)
                continue
            records.append(_record(item))
            carried.append(item)
        if not carried:
            return outcomes
        base, auth = creds
        headers = {**auth, "Idempotency-Key": carried[0].id + f"+{len(carried)}",
                   "Content-Type": "application/json"}
        outcome, body = self._post(f"{base}/proof-of-play", headers,
                                   b'{"records": [' + b", ".join(records) + b"]}")
        if outcome.kind == OK and not (isinstance(body, dict)
                                       and isinstance(body.get("acked"), list)):
            outcome = _NOT_THE_SERVER
        if outcome.kind != OK:
            return {**outcomes, **{i.id: outcome for i in carried}}
        acked = {a for a in body["acked"] if isinstance(a, str)}
        missing = Outcome(TRANSIENT, "not acknowledged in the batch answer")
        return {**outcomes, **{i.id: (outcome if i.id in acked else missing) for i in carried}}

    def _post(self, url: str, headers: dict, body: bytes):
        try:
            # one bound from the first byte to the last: a trickled answer ends with it
            with deadline(sum(TIMEOUT)):
                r = self.session.post(url, data=body, headers=headers, timeout=TIMEOUT,
                                      allow_redirects=False, stream=True)
                raw = read_capped(r, MAX_ANSWER_BYTES)
                r.close()
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as e:
            # r.raw.read() raises urllib3's own errors (ReadTimeoutError, ProtocolError,
            # DecodeError), which are not RequestExceptions
            why = f"{type(e).__name__}: {e}" if isinstance(e, HostileAnswer) else type(e).__name__
            return classify(None, error=why), None
        outcome = classify(r.status_code, r.headers.get("Retry-After"))
        try:
            parsed = json.loads(raw) if raw and len(raw) <= MAX_ANSWER_BYTES else None
        except (ValueError, RecursionError):   # nested past the parser's depth: no answer
            parsed = None
        return outcome, parsed


def _record(item: Item) -> bytes:
    """One record of a batch, encoded on its own: the record as JSON, or its text where it
    is not JSON or is nested deeper than the encoder goes (the parser stops a level later)."""
    try:
        return json.dumps({"id": item.id, "record": json.loads(item.payload)}).encode()
    except (ValueError, RecursionError):
        return json.dumps({"id": item.id, "record": item.payload.decode("utf-8", "replace")}).encode()


def _header_problem(*fields: tuple[str, object]) -> str | None:
    for name, value in fields:
        if not isinstance(value, str) or HEADER_VALUE_RE.fullmatch(value) is None:
            return f"{name}: not printable ASCII, cannot be sent in a header"
    return None
