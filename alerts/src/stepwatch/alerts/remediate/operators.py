"""Who may operate the remediator (approve, close the breaker, read its API), and who they are.

Two credentials, two jobs: the webhook token is what Alertmanager holds and is
accepted on the webhook only; each operator has a token of their own, listed in
the operators file (``remediate_operators_file``), one ``name:token`` a line
(``#`` comments and blank lines ignored). The name recorded for an operator's
action is the one whose token was presented — never a header the sender
chooses. Tokens are compared in constant time, every one of them whatever
matched, and never logged or echoed in an error.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

from stepwatch.alerts.remediate import identity
from stepwatch.errors import ConfigError


@dataclass(frozen=True)
class Operators:
    """The operators' names and tokens; empty: no operator endpoint answers."""

    tokens: tuple[tuple[str, bytes], ...] = ()

    @property
    def configured(self) -> bool:
        return bool(self.tokens)

    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.tokens)

    def holds(self, token: str) -> bool:
        """Whether ``token`` is one of the operators' tokens (constant time)."""
        return self._match(token.encode()) is not None

    def who(self, header: str | None) -> str | None:
        """The operator whose token ``Authorization: Bearer <token>`` carries, else None."""
        given = bearer(header)
        return self._match(given) if given else None

    def _match(self, given: bytes) -> str | None:
        found = None
        for name, token in self.tokens:  # no early exit: the time does not say which matched
            if hmac.compare_digest(given, token) and found is None:
                found = name
        return found


def bearer(header: str | None) -> bytes:
    """The token of an ``Authorization: Bearer <token>`` header; b'' for any other header."""
    scheme, _, given = (header or "").partition(" ")
    return given.strip().encode() if scheme.lower() == "bearer" else b""


def parse(text: str, where: str) -> Operators:
    """``name:token`` lines. Every problem is one line naming the line, never the token."""
    tokens: list[tuple[str, bytes]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, token = (part.strip() for part in line.partition(":"))
        if not sep or not token:
            raise ConfigError(f"{where}: line {number}: expected name:token")
        if not identity.OWNER.fullmatch(name):
            raise ConfigError(
                f"{where}: line {number}: operator name {identity.shown(name)} "
                "is not a plain name (letters, digits, . _ @ -; at most 64)"
            )
        if any(ch.isspace() for ch in token):
            raise ConfigError(f"{where}: line {number}: a token has no spaces")
        tokens.append((name, token.encode()))
    _unique(where, tokens)
    return Operators(tuple(tokens))


def load(path: str | Path) -> Operators:
    """The operators file; a file that names no operator is an error, not an open door."""
    where = f"remediate_operators_file {Path(path).name}"
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"remediate_operators_file {path}: cannot read: {err.strerror}") from err
    operators = parse(text, where)
    if not operators.configured:
        raise ConfigError(f"{where}: names no operator (one name:token a line)")
    return operators


def _unique(where: str, tokens: list[tuple[str, bytes]]) -> None:
    names = [name for name, _ in tokens]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{where}: operator(s) listed twice: {', '.join(twice)}")
    values = [token for _, token in tokens]
    shared = sorted({n for n, t in tokens if values.count(t) > 1})
    if shared:  # one token, two names: who acted could not be told
        raise ConfigError(f"{where}: operators share a token: {', '.join(shared)}")
