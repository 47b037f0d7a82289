"""The ``openai`` backend: servers someone else already runs, one per num_steps or one for all.

Nothing is launched or stopped. ``preflight`` checks before the sweep measures anything that every planned
num_steps has an endpoint and that every endpoint answers. Acceptance comes from the server's spec-decode
counters when its ``/metrics`` page has vLLM's (or spectune's) counters; else it is 1.0 at num_steps 0
(:func:`spectune.backends.snapshots.zero_steps_acceptance`, never the tokens-per-chunk proxy, which a server streaming
several
tokens per chunk would push above 1), and the tokens-per-chunk proxy
(:func:`spectune.backends.snapshots.chunk_proxy_acceptance`)
at K > 0. A server shared with other traffic makes counter deltas cover that traffic too.
"""

from __future__ import annotations

from typing import Sequence

from spectune.backends.base import Backend
from spectune.backends.options import BackendOptions, Endpoint
from spectune.backends.snapshots import Acceptance, SpecSnapshot, has_counters, zero_steps_acceptance
from spectune.backends.http import auth_headers, check_reachable, normalize_base_url
from spectune.backends.prometheus import scrape_running, scrape_snapshot
from spectune.backends.redact import redact_text
from spectune.core.errors import UserError
from spectune.core.json_types import JsonObject
from spectune.loadgen.record import RequestRecord

ALL_STEPS = -1


class EndpointSet:
    """num_steps -> base URL of a running server; key ``-1`` serves every num_steps.

    Raises (constructor):
        UserError: no endpoints, a malformed URL (named), or a num_steps key below -1.
    """

    def __init__(self, endpoints: dict[int, str] | None, what: str = "endpoint") -> None:
        if not endpoints:
            raise UserError(f"no {what} given: pass --endpoint http://HOST:PORT (or STEPS=URL, one per num_steps)")
        self.urls: dict[int, str] = {}
        for steps, url in endpoints.items():
            if int(steps) < ALL_STEPS:
                raise UserError(f"bad num_steps {steps} for endpoint {url}: use K >= 0 (or one URL for all)")
            self.urls[int(steps)] = normalize_base_url(url, what)

    def url_for(self, steps: int) -> str:
        """The base URL serving num_steps ``steps``.

        Raises:
            UserError: no endpoint for that num_steps (listing the configured ones).
        """
        url = self.urls.get(steps, self.urls.get(ALL_STEPS))
        if url is None:
            have = ", ".join(f"{k}={v}" for k, v in sorted(self.urls.items()))
            raise UserError(f"no endpoint for num_steps {steps} (have {have}): add --endpoint {steps}=URL")
        return url

    def describe(self) -> dict[str, str]:
        """JSON-friendly mapping (``"all"`` for the shared URL); credentials in URLs are masked."""
        return {("all" if k == ALL_STEPS else str(k)): redact_text(v) for k, v in sorted(self.urls.items())}


class OpenAIBackend(Backend):
    """Already-running OpenAI-compatible servers (vLLM, SGLang, TGI, llama.cpp, spectune serve, ...)."""

    name = "openai"

    def __init__(self, options: BackendOptions) -> None:
        self.options = options
        self.endpoints = EndpointSet(options.endpoints)
        self.headers = auth_headers(options.api_key_env)
        self._steps: int | None = None
        self._url: str | None = None

    async def preflight(self, steps_list: Sequence[int]) -> list[str]:
        """Check every planned num_steps has an endpoint and every endpoint answers.

        Raises:
            UserError: a missing endpoint or an unreachable/unhealthy one (named).
        """
        urls = {self.endpoints.url_for(k) for k in steps_list}
        for url in sorted(urls):
            await check_reachable(url, self.headers)
        return []

    async def start(self, steps: int) -> Endpoint:
        """Select (and re-check) the endpoint for ``steps``.

        Raises:
            UserError: no endpoint for ``steps``, or it does not answer.
        """
        url = self.endpoints.url_for(steps)
        await check_reachable(url, self.headers)
        self._steps, self._url = steps, url
        return Endpoint(url, None)

    async def stop(self) -> None:
        """Nothing to stop: the servers are not ours."""
        self._url = None

    async def snapshot(self) -> SpecSnapshot | None:
        """vLLM-style or spectune counters from ``/metrics`` when the server has them, else None."""
        if self._url is None:
            return None
        return await scrape_snapshot(self._url, headers=self.headers)

    async def running_requests(self) -> tuple[float, str] | None:
        """vLLM's, SGLang's, spectune's or llama.cpp's running-requests gauge from ``/metrics``, or None."""
        return None if self._url is None else await scrape_running(self._url, headers=self.headers)

    def acceptance(self, before: SpecSnapshot | None, after: SpecSnapshot | None,
                   records: Sequence[RequestRecord]) -> Acceptance:
        """Counter deltas when the server has them; else 1.0 at num_steps 0; else the tokens-per-chunk proxy."""
        if self._steps == 0 and not has_counters(before, after):
            return zero_steps_acceptance(records)
        return super().acceptance(before, after, records)

    def schedule_setting(self) -> str | None:
        """The servers are not spectune's: what they draft is set where they were started."""
        return ("the server behind that --endpoint was started with another num_steps or schedule (or ignores it): "
                "check its speculative flags, or give each num_steps its own server with --endpoint K=URL")

    def describe(self) -> JsonObject:
        """Backend name and endpoint URLs (never the API key)."""
        return {"backend": self.name, "endpoints": self.endpoints.describe(), "api_key_env": self.options.api_key_env}
