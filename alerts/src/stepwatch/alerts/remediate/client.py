"""The operator's client for the running remediator's API (used by the CLI and tests).

``token`` is the operator's own token (``remediate_operator_token_file``): the
service records the operator it belongs to; the webhook token is refused there.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from stepwatch.errors import RemediationError


class Client:
    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self.timeout = timeout

    def _call(self, method: str, path: str) -> Any:
        req = urllib.request.Request(
            f"{self.url}{path}",
            method=method,
            data=b"" if method == "POST" else None,
            headers={"Authorization": f"Bearer {self._token}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            text = err.read().decode(errors="replace")[:300]
            raise RemediationError(f"{method} {path}: HTTP {err.code} {text}") from err
        except (urllib.error.URLError, OSError) as err:
            raise RemediationError(f"remediator unreachable at {self.url}: {err}") from err

    def actions(self, status: str | None = None) -> Any:
        return self._call("GET", "/api/actions" + (f"?status={status}" if status else ""))

    def outcomes(self) -> Any:
        return self._call("GET", "/api/outcomes")

    def approve(self, action_id: str) -> Any:
        return self._call("POST", f"/api/approve/{action_id}")

    def close_breaker(self) -> Any:
        return self._call("POST", "/api/close-breaker")

    def breaker(self) -> Any:
        return self._call("GET", "/api/breaker")
