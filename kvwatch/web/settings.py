"""How the web layer is exposed: authentication and how much of an answer it may show."""

from __future__ import annotations

from dataclasses import dataclass

from kvwatch.limits import ANSWER_EXCERPT_CHARS


@dataclass(frozen=True, slots=True, kw_only=True)
class WebSettings:
    """Settings of the UI and API (the ``web:`` section of the configuration).

    With neither ``bearer_token`` nor ``basic_auth`` the UI and API are open: kvwatch listens
    on 127.0.0.1 by default for that reason. ``protect_metrics`` puts ``/metrics``,
    ``/healthz`` and ``/readyz`` behind the same credentials (off by default, because
    Prometheus and kubelets rarely carry them).

    Answer excerpts are shown because they are evidence, but in exactly the incident kvwatch
    exists to catch they hold *other users'* data: ``answer_excerpts=False`` withholds them
    from UI and API, and ``excerpt_chars`` bounds what is shown.
    """

    bearer_token: str | None = None
    basic_auth: tuple[str, str] | None = None  # (user, password)
    protect_metrics: bool = False
    answer_excerpts: bool = True
    excerpt_chars: int = ANSWER_EXCERPT_CHARS
    external_url: str | None = None  # as alerts' generatorURL uses it; for absolute links

    def __post_init__(self) -> None:
        if self.excerpt_chars < 0:
            raise ValueError(f"excerpt_chars must not be negative, got {self.excerpt_chars}")
        if self.bearer_token is not None and not self.bearer_token:
            raise ValueError("bearer_token must not be empty (omit it to disable)")
        if self.basic_auth is not None and not all(self.basic_auth):
            raise ValueError("basic_auth needs a non-empty user and password")

    @property
    def auth_required(self) -> bool:
        return self.bearer_token is not None or self.basic_auth is not None

    def excerpt(self, text: str | None) -> str | None:
        """The part of a stored answer excerpt these settings allow to be shown."""
        if text is None or not self.answer_excerpts:
            return None
        if len(text) <= self.excerpt_chars:
            return text
        return text[: self.excerpt_chars] + "…"
