"""HTTP for the upload queue: one POST per item (or per proof-of-play batch).

Every request carries ``Idempotency-Key`` (the item id), so a retry after a lost
answer is stored once at the server. Redirects are not followed: a token must not
travel to another host.
"""
from __future__ import annotations

import json

import requests
import urllib3

from .schedule import Outcome, classify, OK, TRANSIENT
from .store import Item

TIMEOUT = (5.0, 30.0)  # connect, read
MAX_ANSWER_BYTES = 64 * 1024


class UploadSender:
    def __init__(self, server_url: str, identity, ca_file: str | None = None):
        """``identity`` is (device_id, token), or a callable returning it or None."""
        self.server_url = server_url
        self._identity = identity if callable(identity) else (lambda: identity)
        self._verify: bool | str = ca_file or True
        self.session = requests.Session()

    @property
    def ready(self) -> bool:
        return self._identity() is not None

    @property
    def base(self) -> str:
        return f"{self.server_url}/api/v1/devices/{self._identity()[0]}"

    @property
    def _headers(self) -> dict:
        return {"Authorization": f"Bearer {self._identity()[1]}"}

    def send_one(self, item: Item) -> Outcome:
        headers = {**self._headers, "Idempotency-Key": item.id, "X-Upload-Kind": item.kind,
                   "Content-Type": "application/octet-stream"}
        return self._post(f"{self.base}/uploads", headers, item.payload)[0]

    def send_batch(self, items: list[Item]) -> dict[str, Outcome]:
        """Proof-of-play records in one request; the server ACKs them by id."""
        records = []
        for item in items:
            try:
                data = json.loads(item.payload)
            except ValueError:
                data = item.payload.decode("utf-8", "replace")
            records.append({"id": item.id, "record": data})
        headers = {**self._headers, "Idempotency-Key": items[0].id + f"+{len(items)}",
                   "Content-Type": "application/json"}
        outcome, body = self._post(f"{self.base}/proof-of-play", headers,
                                   json.dumps({"records": records}).encode())
        if outcome.kind != OK:
            return {i.id: outcome for i in items}
        acked = set()
        if isinstance(body, dict) and isinstance(body.get("acked"), list):
            acked = {a for a in body["acked"] if isinstance(a, str)}
        missing = Outcome(TRANSIENT, "not acknowledged in the batch answer")
        return {i.id: (outcome if i.id in acked else missing) for i in items}

    def _post(self, url: str, headers: dict, body: bytes):
        try:
            r = self.session.post(url, data=body, headers=headers, timeout=TIMEOUT,
                                  verify=self._verify, allow_redirects=False, stream=True)
            raw = r.raw.read(MAX_ANSWER_BYTES + 1, decode_content=True) if r.raw else b""
            r.close()
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as e:
            # r.raw.read() raises urllib3's own errors (ReadTimeoutError, ProtocolError,
            # DecodeError), which are not RequestExceptions
            return classify(None, error=f"{type(e).__name__}"), None
        if 300 <= r.status_code < 400:
            return classify(400, error="redirect refused"), None
        outcome = classify(r.status_code, r.headers.get("Retry-After"))
        try:
            parsed = json.loads(raw) if raw and len(raw) <= MAX_ANSWER_BYTES else None
        except ValueError:
            parsed = None
        return outcome, parsed
