"""A client for a remote reward server speaking OpenRLHF's ``--remote_rm_url`` HTTP protocol.

The protocol (as OpenRLHF's ``remote_rm_fn_ray`` / ``request_api_wrapper`` and its ``serve_rm`` server use it):
one ``POST`` to the URL (OpenRLHF's server serves ``/get_reward``) with a JSON body of three lists, one entry
per completion::

    {"query": [prompt + completion, ...], "prompts": [prompt, ...], "labels": [label, ...]}

and a ``200`` answer whose JSON object has a ``rewards`` list of numbers, one per ``query`` entry, in order
(other keys, such as OpenRLHF's ``scores`` or ``extra_logs``, are ignored). ``query`` is the prompt text followed
by the completion text, exactly as the scorer was given them; ``labels`` holds the ``label_key`` column's values
(``""`` for each completion when ``label_key`` is ``None``).

Limits: each ``POST`` carries at most ``batch_size`` completions; each attempt may take ``timeout_s`` seconds to
connect, and again ``timeout_s`` between bytes of the request and of the answer (httpx's per-phase timeouts); a
connection error, a timeout or a ``5xx`` answer is retried ``retries`` times, after ``backoff_s``, then twice that,
and so on. A ``4xx`` answer or a malformed answer is not retried.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from marti.errors import DeadlineExceededError, InvalidArgumentError, MartiError, UnavailableError
from marti.plumbing.arguments import checked
from marti.rewards.base import check_batch, check_scores, shorten

__all__ = ["RemoteRewardScorer"]


class RemoteRewardScorer:
    """Scores completions by POSTing them to a remote reward server (OpenRLHF ``--remote_rm_url`` protocol).

    Args:
        url: The server's endpoint, ``http://`` or ``https://`` (e.g. ``"http://rm-host:5000/get_reward"``).
        label_key: The dataset column sent as ``labels``; ``None`` sends ``""`` for each completion.
        timeout_s: Seconds each attempt may wait to connect, and between bytes of the request and the answer
            (> 0).
        retries: Further attempts after a connection error, a timeout or a ``5xx`` answer (>= 0).
        backoff_s: Seconds before the first retry, doubled before each next one (>= 0).
        batch_size: Completions per ``POST`` (>= 1); a larger call is split into several requests, in order.

    Attributes:
        name: ``"remote reward server 'URL'"``, how errors name it.

    Raises:
        InvalidArgumentError: A malformed URL or an out-of-range limit (named with its value).
    """

    @checked(own=("url",))
    def __init__(
        self,
        url: str,
        *,
        label_key: str | None = "label",
        timeout_s: float = 60.0,
        retries: int = 3,
        backoff_s: float = 1.0,
        batch_size: int = 64,
    ) -> None:
        _check_url(url)
        for arg, value in (("timeout_s", timeout_s), ("batch_size", batch_size)):
            if value <= 0:
                raise InvalidArgumentError(f"RemoteRewardScorer: {arg} must be > 0, got {value!r}")
        for arg, value in (("retries", retries), ("backoff_s", backoff_s)):
            if value < 0:
                raise InvalidArgumentError(f"RemoteRewardScorer: {arg} must be >= 0, got {value!r}")
        self.url, self.timeout_s, self.retries, self.backoff_s = (
            url,
            float(timeout_s),
            retries,
            float(backoff_s),
        )
        self.batch_size, self.label_key = batch_size, label_key
        self.name = f"remote reward server {url!r}"
        self._client: httpx.Client | None = None

    @checked
    def score(
        self, prompts: Sequence[str], completions: Sequence[str], columns: Mapping[str, Sequence[Any]]
    ) -> list[float]:
        """POST the completions in batches of ``batch_size`` (the ``label_key`` column sent as ``labels``) and
        return the server's rewards, checked (arguments and result as :meth:`RewardScorer.score`).

        Raises:
            InvalidArgumentError: The inputs disagree in length; the ``label_key`` column is missing or holds
                values JSON cannot carry; the server answered a ``4xx`` (or another non-``2xx`` that is not a
                ``5xx``), something that is not JSON, JSON without a ``rewards`` list, or rewards of the wrong
                length or that are not finite numbers (index and value named). Each names the URL.
            DeadlineExceededError: Every attempt timed out (URL, ``timeout_s`` and attempts named).
            UnavailableError: Every attempt failed to connect or got a ``5xx`` (URL, last cause named).
        """
        n = check_batch(prompts, completions, columns, scorer=self.name)
        labels = self._labels(columns, n)
        out: list[float] = []
        for start in range(0, n, self.batch_size):
            end = min(start + self.batch_size, n)
            body = self._encode(prompts[start:end], completions[start:end], labels[start:end])
            where = f"{self.name} (completions {start}..{end - 1} of {n})"
            out += check_scores(self._post(body, where), end - start, scorer=where)
        return out

    def close(self) -> None:
        """Close the HTTP connection pool (a later :meth:`score` opens a new one)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> RemoteRewardScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the connection pool (a Ray actor rebuilds it on first use)."""
        return {**self.__dict__, "_client": None}

    def _labels(self, columns: Mapping[str, Sequence[Any]], n: int) -> list[Any]:
        """The ``labels`` list: the ``label_key`` column, or ``""`` each when ``label_key`` is ``None``."""
        if self.label_key is None:
            return [""] * n
        if self.label_key not in columns:
            raise InvalidArgumentError(
                f"{self.name}: label_key column {self.label_key!r} is not among the dataset columns "
                f"{sorted(columns)} (set label_key=None to send empty labels)"
            )
        return list(columns[self.label_key])

    def _encode(self, prompts: Sequence[str], completions: Sequence[str], labels: Sequence[Any]) -> bytes:
        """The JSON body of one request (UTF-8; labels JSON cannot carry are refused, named)."""
        payload = {
            "query": [p + c for p, c in zip(prompts, completions, strict=True)],
            "prompts": list(prompts),
            "labels": list(labels),
        }
        try:
            return json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"{self.name}: the labels (column {self.label_key!r}) cannot be sent as JSON: {exc}"
            ) from None

    def _post(self, body: bytes, where: str) -> Any:
        """POST ``body`` with retries; the answer's ``rewards`` value (unchecked), or the typed error."""
        last: MartiError | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = self._http().post(
                    self.url, content=body, headers={"Content-Type": "application/json"}
                )
            except httpx.TimeoutException as exc:
                last = DeadlineExceededError(
                    f"{where}: no answer within timeout_s={self.timeout_s:g} s ({type(exc).__name__}) "
                    f"after {attempt + 1} attempt(s) (retries={self.retries})"
                )
                continue
            except httpx.TransportError as exc:
                last = UnavailableError(
                    f"{where}: unreachable ({type(exc).__name__}: {exc}) after {attempt + 1} attempt(s) "
                    f"(retries={self.retries})"
                )
                continue
            if response.status_code >= 500:
                last = UnavailableError(
                    f"{where}: answered HTTP {response.status_code} ({shorten(response.text)}) after "
                    f"{attempt + 1} attempt(s) (retries={self.retries})"
                )
                continue
            return _rewards(response, where)
        assert last is not None
        raise last

    def _http(self) -> httpx.Client:
        """The connection pool, made on first use."""
        if self._client is None:
            self._client = httpx.Client(timeout=httpx.Timeout(self.timeout_s), trust_env=False)
        return self._client


def _rewards(response: httpx.Response, where: str) -> Any:
    """The ``rewards`` value of a non-5xx answer; a refusal or a malformed answer raises, naming ``where``."""
    if not response.is_success:
        raise InvalidArgumentError(
            f"{where}: answered HTTP {response.status_code} ({shorten(response.text)}), not a 2xx; only "
            "connection errors, timeouts and 5xx answers are retried"
        )
    try:
        answer = response.json()
    except ValueError:
        raise InvalidArgumentError(
            f"{where}: answered something that is not JSON ({shorten(response.text)}); expected "
            '{"rewards": [...]}'
        ) from None
    if not isinstance(answer, dict) or "rewards" not in answer:
        raise InvalidArgumentError(
            f"{where}: the answer has no 'rewards' list ({shorten(answer)}); expected " + '{"rewards": [...]}'
        )
    return answer["rewards"]


def _check_url(url: Any) -> None:
    """Refuse anything but an ``http(s)://host...`` URL, naming it."""
    try:
        parsed = httpx.URL(url) if isinstance(url, str) else None
    except (httpx.InvalidURL, ValueError, TypeError):
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise InvalidArgumentError(
            f"RemoteRewardScorer: url must be an http:// or https:// URL with a host, got {shorten(url)}"
        )
