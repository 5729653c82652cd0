"""Who may see the console and act through it. Pure checks over a request's headers and cookies.
Runs in: the console's web server.

* It listens on loopback unless ``--allow-remote``; then a token is required (``--token-file``
  or ``RINGMASTER_CONSOLE_TOKEN``; never a command-line argument, which ``ps`` shows), and every
  page asks for it: as ``Authorization: Bearer <token>``, as the password of HTTP basic auth
  (any user name), or as the session cookie the login form sets (an HMAC of the token, not the
  token itself; HttpOnly, SameSite=Strict).
* An action is a POST carrying the CSRF token of the page it came from: a random cookie of the
  browser's (SameSite=Strict) that the form repeats (double submit), and an Origin, when the
  browser sends one, that is the console's own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

SESSION_COOKIE = "ringmaster_console"
CSRF_COOKIE = "ringmaster_csrf"
CSRF_FIELD = "csrf"


@dataclass(frozen=True)
class Guard:
    token: str | None  # None: no token asked (loopback without --token-file)
    read_only: bool = False
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))  # signs the session cookie

    def session_value(self) -> str:
        assert self.token is not None
        return hmac.new(self.key, self.token.encode(), hashlib.sha256).hexdigest()

    def token_matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def allowed(self, headers: Mapping[str, str], cookies: Mapping[str, str]) -> bool:
        """Whether this request may see the console."""
        if self.token is None:
            return True
        auth = headers.get("authorization", "")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and self.token_matches(value.strip()):
            return True
        if scheme.lower() == "basic":
            try:
                _, _, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return False
            if self.token_matches(password):
                return True
        session = cookies.get(SESSION_COOKIE, "")
        return bool(session) and hmac.compare_digest(session, self.session_value())

    @staticmethod
    def csrf_ok(form_value: str, cookies: Mapping[str, str], origin: str | None, host: str | None) -> bool:
        """A POST's CSRF check: the form repeats the browser's cookie; an Origin is our own."""
        cookie = cookies.get(CSRF_COOKIE, "")
        if not cookie or not hmac.compare_digest(form_value.encode(), cookie.encode()):
            return False
        if origin is not None and origin != "null":
            return host is not None and origin.split("://", 1)[-1] == host
        return origin is None


def new_csrf() -> str:
    return secrets.token_urlsafe(24)
