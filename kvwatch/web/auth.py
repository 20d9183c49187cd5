"""Optional bearer-token or basic authentication for the UI, the API and (optionally) metrics."""

from __future__ import annotations

import base64
import binascii
import secrets

from fastapi import HTTPException, Request, status

from kvwatch.web.settings import WebSettings


def _equal(given: str, expected: str) -> bool:
    # Constant time, so response timing does not reveal how much of a guess was right.
    return secrets.compare_digest(given.encode(), expected.encode())


def authorized(settings: WebSettings, authorization: str | None) -> bool:
    """Whether an ``Authorization`` header satisfies the configured credentials."""
    if not settings.auth_required:
        return True
    if not authorization:
        return False
    scheme, _, credentials = authorization.partition(" ")
    scheme = scheme.lower()
    credentials = credentials.strip()
    if scheme == "bearer" and settings.bearer_token is not None:
        return _equal(credentials, settings.bearer_token)
    if scheme == "basic" and settings.basic_auth is not None:
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, sep, password = decoded.partition(":")
        expected_user, expected_password = settings.basic_auth
        # Both comparisons always run: no early exit on a wrong user name.
        ok_user = _equal(user, expected_user)
        ok_password = _equal(password, expected_password)
        return bool(sep) and ok_user and ok_password
    return False


def challenge(settings: WebSettings) -> str:
    """The ``WWW-Authenticate`` value; Basic first so a browser shows its login prompt."""
    schemes = []
    if settings.basic_auth is not None:
        schemes.append('Basic realm="kvwatch", charset="UTF-8"')
    if settings.bearer_token is not None:
        schemes.append('Bearer realm="kvwatch"')
    return ", ".join(schemes)


class RequireAuth:
    """A FastAPI dependency that rejects requests without the configured credentials."""

    def __init__(self, settings: WebSettings) -> None:
        self.settings = settings

    def __call__(self, request: Request) -> None:
        if not authorized(self.settings, request.headers.get("authorization")):
            raise HTTPException(
                status_code=status.HTTP_401_UNAUTHORIZED,
                detail="authentication required",
                headers={"WWW-Authenticate": challenge(self.settings)},
            )
