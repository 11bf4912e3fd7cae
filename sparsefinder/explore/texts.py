"""Custom texts in shareable links: compressed into the URL when short, else named by hash.

A link must reopen the same text. A short text travels in the link itself
(``text=`` urlsafe base64 of its zlib-compressed UTF-8); every custom text is also named by
``textid=`` (the first 16 hex digits of its SHA-256), and the server keeps the texts it has
seen in a bounded :class:`TextStore`, so a reload or a link to a long text works while the
server has it. A link whose text the server does not know gets a clear message, never a
different text.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import threading
import zlib
from collections import OrderedDict

#: Longest encoded text that goes into a link (browsers and proxies cut URLs near 8 KB).
MAX_URL_PAYLOAD = 2000
_ID = re.compile(r"^[0-9a-f]{16}$")


class TextLinkError(ValueError):
    """A link's text cannot be recovered; the message says why and what to do."""


def text_id(text: str) -> str:
    """Content name of a text: the first 16 hex digits of its SHA-256 (UTF-8)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def is_text_id(value: str) -> bool:
    return bool(_ID.match(value))


def encode_text(text: str) -> str | None:
    """The text as a URL-safe payload, or None when it is too long for a link."""
    payload = base64.urlsafe_b64encode(zlib.compress(text.encode("utf-8"), 9)).decode("ascii")
    return payload.rstrip("=") if len(payload) <= MAX_URL_PAYLOAD else None


def decode_text(payload: str, expected_id: str | None = None) -> str:
    """Inverse of :func:`encode_text`; checks the text against ``expected_id`` when given."""
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        text = zlib.decompress(raw, bufsize=1 << 16).decode("utf-8")
    except (binascii.Error, zlib.error, UnicodeDecodeError, ValueError) as error:
        raise TextLinkError(
            "this link's text is damaged (it was probably cut when the link was copied); "
            "paste the text again"
        ) from error
    if expected_id is not None and text_id(text) != expected_id:
        raise TextLinkError("this link's text does not match its textid; paste the text again")
    return text


class TextStore:
    """Texts this server has seen, by :func:`text_id`; bounded (oldest first out), thread-safe
    (a Streamlit server runs sessions on threads)."""

    def __init__(self, max_chars: int = 20_000_000) -> None:
        self.max_chars = max_chars
        self._texts: OrderedDict[str, str] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def put(self, text: str) -> str:
        key = text_id(text)
        with self._lock:
            if key in self._texts:
                self._texts.move_to_end(key)
                return key
            self._texts[key] = text
            self._chars += len(text)
            while self._chars > self.max_chars and len(self._texts) > 1:
                _, old = self._texts.popitem(last=False)
                self._chars -= len(old)
        return key

    def get(self, key: str) -> str | None:
        with self._lock:
            text = self._texts.get(key)
            if text is not None:
                self._texts.move_to_end(key)
            return text


def resolve_text(textid: str, payload: str | None, store: TextStore) -> str:
    """The custom text a link names: from its payload (then remembered) or from the store."""
    if not is_text_id(textid):
        raise TextLinkError(f"textid={textid!r} is not a text name (16 hex digits)")
    if payload:
        text = decode_text(payload, textid)
        store.put(text)
        return text
    text = store.get(textid)
    if text is None:
        raise TextLinkError(
            "this link's text is not available here: it was too long to travel inside the "
            "link and this server has not seen it (links to long texts work only on the "
            "server where the text was pasted, until it restarts); paste the text again"
        )
    return text
