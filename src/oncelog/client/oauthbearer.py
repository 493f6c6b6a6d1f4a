"""OAUTHBEARER tokens for the client (``sasl.mechanism=OAUTHBEARER``), confluent-kafka's way.

Two sources, exactly one of which must be configured (checked at construction, :func:`token_source`):

* ``oauth_cb``: a callable taking the ``sasl.oauthbearer.config`` string (None when unset) and
  returning ``(token_str, expiry_seconds_since_epoch)`` or ``(token_str, expiry, principal,
  extensions_dict)``, confluent-kafka's contract; an ``async def`` callable is awaited by the asyncio
  client, a plain one runs in a worker thread (a token endpoint's HTTP call does not stall the event
  loop, nor a blocking connection's request), bounded by ``request.timeout.ms``.
* ``enable.sasl.oauthbearer.unsecure.jwt=true``: librdkafka's unsecured JWT builder, configured by
  ``sasl.oauthbearer.config`` = space-separated ``principal=NAME`` (required),
  ``principalClaimName=`` (``sub``), ``scope=a,b`` (comma-separated), ``scopeClaimName=`` (``scope``),
  ``lifeSeconds=`` (3600) and ``extension_NAME=VALUE``; a JWS with ``alg: none`` that Kafka's default
  broker-side validator accepts. For development and tests only: anyone can mint one.

:class:`TokenSource` holds the current token for every connection of a client and fetches a new one
when 80% of its lifetime has passed (librdkafka's and the Java client's refresh point), so a
re-authentication (KIP-368: the broker bounds the session by the token's expiry) sends a fresh token.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oncelog.protocol.oauthbearer import check_extensions, scope_items, unsecured_jws

__all__ = ["OAuthToken", "TokenSource", "UnsecuredJwtConfig", "parse_unsecured_config", "token_source"]

log = logging.getLogger("oncelog.client.oauthbearer")

REFRESH_FRACTION = 0.8
RETRY_AFTER_FAILURE = 10.0  # seconds: librdkafka retries a failed token refresh after 10 s
# an expiry this large is milliseconds, not seconds: 1e11 s is the year 5138, epoch milliseconds are ~1.8e12 now
_MILLISECONDS = 1e11


class TokenError(Exception):
    """A token could not be had (oauth_cb raised or returned something unusable)."""


@dataclass(frozen=True)
class OAuthToken:
    value: str = field(repr=False)
    expiry: float  # seconds since the epoch
    principal: str = ""
    extensions: Mapping[str, str] = field(default_factory=dict)
    obtained: float = 0.0

    def stale(self, now: float) -> bool:
        return now >= self.obtained + REFRESH_FRACTION * (self.expiry - self.obtained)


@dataclass(frozen=True)
class UnsecuredJwtConfig:
    principal: str
    principal_claim: str = "sub"
    scope: tuple[str, ...] = ()
    scope_claim: str = "scope"
    life_seconds: int = 3600
    extensions: Mapping[str, str] = field(default_factory=dict)

    def token(self, now: float) -> OAuthToken:
        # iat and exp with millisecond precision, as librdkafka writes them
        iat = math.floor(now * 1000) / 1000
        claims: dict[str, Any] = {self.principal_claim: self.principal, "iat": iat, "exp": iat + self.life_seconds}
        if self.scope:
            claims[self.scope_claim] = list(self.scope)
        return OAuthToken(unsecured_jws(claims), iat + self.life_seconds, self.principal, dict(self.extensions), now)


def parse_unsecured_config(text: str | None) -> UnsecuredJwtConfig:
    """librdkafka's ``sasl.oauthbearer.config`` for its unsecured JWT builder; ValueError with a clear
    message (librdkafka's wording) on anything wrong."""
    if text is None or not text.strip():
        raise ValueError("sasl.oauthbearer.config must give principal=<value> with "
                         "enable.sasl.oauthbearer.unsecure.jwt=true")
    values: dict[str, str] = {}
    extensions: dict[str, str] = {}
    for item in text.split(" "):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if key.startswith("extension_") and sep:
            name = key[len("extension_"):]
            if not name:
                raise ValueError("Invalid sasl.oauthbearer.config: empty 'extension_' key")
            if name in extensions:
                raise ValueError(f"Invalid sasl.oauthbearer.config: multiple '{key}=' entries")
            extensions[name] = value
            continue
        if not sep or key not in ("principal", "principalClaimName", "scope", "scopeClaimName", "lifeSeconds"):
            raise ValueError(f"Unrecognized sasl.oauthbearer.config beginning at: {item} (expected principal=, "
                             "principalClaimName=, scope=, scopeClaimName=, lifeSeconds= or extension_NAME=)")
        if not value:
            raise ValueError(f"Invalid sasl.oauthbearer.config: empty '{key}='")
        if key in values:  # librdkafka refuses a repeated key rather than taking the last one
            raise ValueError(f"Invalid sasl.oauthbearer.config: multiple '{key}=' entries")
        values[key] = value
    if "principal" not in values:
        raise ValueError("Invalid sasl.oauthbearer.config: no principal=<value>")
    life = values.get("lifeSeconds", "3600")
    try:
        life_seconds = int(life)
    except ValueError:
        raise ValueError(f"Invalid sasl.oauthbearer.config: non-integral 'lifeSeconds=': {life}") from None
    if not 0 < life_seconds <= 2**31 - 1:
        raise ValueError(f"Invalid sasl.oauthbearer.config: value out of range of positive int 'lifeSeconds=': "
                         f"{life}")
    try:
        check_extensions(extensions)
    except ValueError as exc:
        raise ValueError(f"Invalid sasl.oauthbearer.config: {exc}") from None
    return UnsecuredJwtConfig(values["principal"], values.get("principalClaimName", "sub"),
                              tuple(scope_items(values.get("scope", ""))), values.get("scopeClaimName", "scope"),
                              life_seconds, extensions)


def _token_from_callback(result: Any, now: float) -> OAuthToken:
    """oauth_cb's answer checked: confluent-kafka's (token_str, expiry[, principal, extensions])."""
    shape = "oauth_cb must return (token_str, expiry_seconds_since_epoch[, principal, extensions])"
    if not isinstance(result, tuple) or len(result) not in (2, 4):
        raise TokenError(f"{shape}, got {type(result).__name__}")
    token, expiry = result[0], result[1]
    principal, extensions = (result[2], result[3]) if len(result) == 4 else ("", {})
    if not isinstance(token, str) or not token or "\x01" in token or " " in token:
        raise TokenError(f"{shape}: the token must be a non-empty string without spaces")
    if isinstance(expiry, bool) or not isinstance(expiry, (int, float)) or not _finite(expiry):
        raise TokenError(f"{shape}: the expiry must be a number of seconds since the epoch, got {expiry!r}")
    if expiry <= now:
        raise TokenError(f"oauth_cb returned a token that has already expired (expiry {expiry}, now {now:.3f}): "
                         "the expiry is in seconds since the epoch")
    if expiry >= _MILLISECONDS:  # far-future seconds (2147483647, 9999999999) are fine, as in confluent-kafka
        raise TokenError(f"oauth_cb returned an expiry of {expiry}, which looks like milliseconds: the expiry is in "
                         f"seconds since the epoch (now {now:.0f})")
    if principal is None:
        principal = ""
    if not isinstance(principal, str):
        raise TokenError(f"{shape}: the principal must be a string")
    if extensions is None:
        extensions = {}
    if not isinstance(extensions, Mapping):
        raise TokenError(f"{shape}: the extensions must be a dict of str to str")
    try:
        check_extensions(extensions)
    except ValueError as exc:
        raise TokenError(f"oauth_cb returned an invalid SASL extension: {exc}") from None
    return OAuthToken(token, float(expiry), principal, dict(extensions), now)


def _finite(number: float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an int beyond a float (10**400): not a usable expiry either
        return False


class TokenSource:
    """The current token of one client, shared by its connections (see the module docstring).

    A refresh that fails (oauth_cb raised, returned something unusable or, asyncio, did not return within
    ``timeout`` seconds) while the current token is still unexpired keeps that token: a WARNING is logged
    and oauth_cb is tried again :data:`RETRY_AFTER_FAILURE` seconds later, as librdkafka does; the failure
    reaches a connection (TokenError) only when no unexpired token is left. Both paths refresh in the
    background while the current token is unexpired and at 80% of its life by a timer: the asyncio one
    (:meth:`atoken`) on its event loop, the blocking one (:meth:`token`, the blocking protocol connection)
    in a worker thread, each call of a plain oauth_cb in a thread of its own bounded by ``timeout``."""

    def __init__(self, oauth_cb: Callable[..., Any] | None, config: str | None,
                 unsecured: UnsecuredJwtConfig | None, clock: Callable[[], float] = time.time,
                 timeout: float | None = None) -> None:
        self.oauth_cb = oauth_cb
        self.config = config
        self.unsecured = unsecured
        self.timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._token: OAuthToken | None = None
        self._retry_at: float | None = None  # after a failed refresh: keep the current token until then
        self._pending: asyncio.Future[OAuthToken] | None = None
        self._timer: asyncio.TimerHandle | None = None  # the asyncio path's next background refresh
        self._used = False  # atoken was called since the last timed refresh (else the timer stops)
        # the blocking path's counterparts: the refresh under way, its timer, token() called since
        self._job: concurrent.futures.Future[OAuthToken] | None = None
        self._btimer: threading.Timer | None = None
        self._bused = False
        # the blocking connections using this source (acquire/release): when the last one is released the
        # timer is cancelled and not re-armed until token() is called again
        self._busers = 0
        self._bstopped = False

    def __repr__(self) -> str:
        return f"TokenSource({'oauth_cb' if self.oauth_cb is not None else 'unsecured JWT'})"

    def _cached(self) -> OAuthToken | None:
        now = self._clock()
        with self._lock:
            token, retry_at = self._token, self._retry_at
        if token is None or now >= token.expiry:
            return None
        if not token.stale(now) or (retry_at is not None and now < retry_at):
            return token
        return None

    def _keep(self, token: OAuthToken) -> OAuthToken:
        with self._lock:
            self._token = token
            self._retry_at = None
        return token

    def _refresh_failed(self, exc: TokenError) -> OAuthToken:
        """The current token when it is still unexpired (retry later), else ``exc``."""
        now = self._clock()
        with self._lock:
            token = self._token
            if token is None or now >= token.expiry:
                raise exc
            first = self._retry_at is None or now >= self._retry_at
            if first:
                self._retry_at = now + RETRY_AFTER_FAILURE
        if first:
            log.warning("cannot refresh the OAUTHBEARER token: %s; keeping the current one (expires in %.0f s), "
                        "retrying in %.0f s", exc, token.expiry - now, RETRY_AFTER_FAILURE)
        return token

    def _call(self) -> Any:
        assert self.oauth_cb is not None
        try:
            return self.oauth_cb(self.config)
        except Exception as exc:  # noqa: BLE001 - the user's callback: its failure becomes one clear error
            raise TokenError(f"oauth_cb raised {type(exc).__name__}: {exc}") from None

    def _call_in_thread(self, done: Callable[[bool, Any], None]) -> threading.Thread:
        """Call a plain oauth_cb in a daemon thread of its own (a hung callback must not keep the
        interpreter from exiting, which a ThreadPoolExecutor's worker does: it is joined at exit) and
        hand ``done(True, result)`` or ``done(False, TokenError)`` its outcome. Whatever the callback
        raises, a BaseException too (SystemExit, KeyboardInterrupt, a library's own), is its failure,
        reported with its real cause: in this thread it can only come from the callback itself (signals
        go to the main thread), and it must not end the thread silently or as a stray traceback."""

        def call() -> None:
            try:
                outcome: tuple[bool, Any] = (True, self._call())
            except TokenError as exc:
                outcome = (False, exc)
            except BaseException as exc:  # noqa: BLE001 - see the docstring
                outcome = (False, TokenError(f"oauth_cb raised {type(exc).__name__}: {exc}"))
            done(*outcome)

        caller = threading.Thread(target=call, name="oncelog-oauth-cb", daemon=True)
        caller.start()
        return caller

    def acquire(self) -> None:
        """A blocking connection starts using this source (its token refresh timer may run)."""
        with self._lock:
            self._busers += 1
            self._bstopped = False

    def release(self) -> None:
        """A blocking connection that called :meth:`acquire` is closed; after the last one the
        refresh timer is cancelled (no oauth_cb call for a closed client, no thread left sleeping) and
        not re-armed, also by a refresh still under way, until token() is called again."""
        with self._lock:
            self._busers = max(self._busers - 1, 0)
            if self._busers:
                return
            self._bstopped = True
            self._bused = False
            timer, self._btimer = self._btimer, None
        if timer is not None:
            timer.cancel()

    def token(self) -> OAuthToken:
        """The current token (blocking), :meth:`atoken`'s rules: past the refresh point, while the current
        token is unexpired, it is returned at once and the new one is fetched in a worker thread; only
        without an unexpired token does the caller wait for the fetch (bounded by ``timeout``), which
        concurrent callers share. librdkafka calls oauth_cb from its background thread in the same way."""
        with self._lock:
            self._bused = True
            self._bstopped = False
        cached = self._cached()
        if cached is not None:
            return cached
        if self.unsecured is not None:
            return self._keep(self.unsecured.token(self._clock()))
        # the token valid now, read before the refresh starts (its thread may replace it at once)
        now = self._clock()
        with self._lock:
            current = self._token
        job = self._bstart()
        if current is not None and now < current.expiry:
            return current  # still valid: the refresh goes on in the background
        return job.result()

    def _bstart(self) -> concurrent.futures.Future[OAuthToken]:
        """The blocking path's refresh under way, or a new one in a daemon thread (a hung oauth_cb must not
        keep the interpreter from exiting)."""
        with self._lock:
            job = self._job
            if job is not None and not job.done():
                return job
            job = self._job = concurrent.futures.Future()
        threading.Thread(target=self._brefresh, args=(job,), name="oncelog-oauth-refresh", daemon=True).start()
        return job

    def _brefresh(self, job: concurrent.futures.Future[OAuthToken]) -> None:
        """One call of oauth_cb, bounded by ``timeout`` (a call that does not return in time is abandoned
        in its thread, so the next refresh calls oauth_cb again), as :meth:`_refresh`."""
        try:
            try:
                try:
                    token = self._keep(_token_from_callback(self._bcall(), self._clock()))
                except TokenError as exc:
                    token = self._refresh_failed(exc)
            except TokenError as exc:
                job.set_exception(exc)
            else:
                job.set_result(token)
        except BaseException as exc:  # noqa: BLE001 - never leave a waiter hanging
            if not job.done():
                job.set_exception(TokenError(f"oauth_cb failed: {exc}"))
        finally:
            self._bschedule()

    def _bcall(self) -> Any:
        """oauth_cb's result, called in a thread of its own that is waited for at most ``timeout``."""
        box: list[tuple[bool, Any]] = []
        caller = self._call_in_thread(lambda ok, value: box.append((ok, value)))
        caller.join(self.timeout)
        if not box:
            if not caller.is_alive():  # cannot happen (_call_in_thread always reports), but never misreport
                raise TokenError("oauth_cb ended without a result")
            assert self.timeout is not None
            raise TokenError(f"oauth_cb did not return within {self.timeout * 1000:.0f} ms (request.timeout.ms)")
        ok, result = box[0]
        if not ok:
            raise result
        if inspect.isawaitable(result):
            close = getattr(result, "close", None)
            if close is not None:
                close()
            raise TokenError("oauth_cb is a coroutine function: the blocking connection needs a plain callable")
        return result

    def _bschedule(self) -> None:
        """The blocking path's refresh timer, as :meth:`_schedule`: the next refresh at 80% of the current
        token's life, or when the retry pause after a failed refresh ends; it stops once token() has not
        been called since the last timed refresh, or once the last connection that acquired this source
        has released it (closed)."""
        now = self._clock()
        with self._lock:
            if self._btimer is not None:
                self._btimer.cancel()
                self._btimer = None
            if self._bstopped:
                return
            token, retry_at = self._token, self._retry_at
            if token is None or now >= token.expiry:
                return
            if retry_at is not None and now < retry_at:
                delay = retry_at - now
            else:
                delay = token.obtained + REFRESH_FRACTION * (token.expiry - token.obtained) - now
            timer = threading.Timer(min(max(delay, 0.0), 86400.0), lambda: self._on_btimer(timer))
            self._btimer = timer
            timer.daemon = True
            timer.start()

    def _on_btimer(self, timer: threading.Timer) -> None:
        with self._lock:
            if self._btimer is not timer:
                return  # replaced by a newer one meanwhile
            self._btimer = None
            if not self._bused or self._bstopped:
                return
        if self._cached() is None:
            self._bused = False
            self._bstart()  # its end schedules the next
        else:
            self._bschedule()

    async def atoken(self) -> OAuthToken:
        """The current token (asyncio). Past the refresh point, while the current token is still
        unexpired, it is returned at once and the new one is fetched in the background (librdkafka and
        the Java client never make a connection wait for a refresh while a valid token is cached); only
        without an unexpired token does the caller wait for the fetch, which concurrent callers share."""
        self._used = True
        cached = self._cached()
        if cached is not None:
            return cached
        if self.unsecured is not None:
            return self._keep(self.unsecured.token(self._clock()))
        pending = self._start(asyncio.get_running_loop())
        now = self._clock()
        with self._lock:
            current = self._token
        if current is not None and now < current.expiry:
            return current  # still valid: the refresh goes on in the background
        return await asyncio.shield(pending)

    def _start(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[OAuthToken]:
        """The refresh under way, or a new one."""
        pending = self._pending
        if pending is None or pending.done() or pending.get_loop() is not loop:
            pending = self._pending = loop.create_task(self._refresh())
            # retrieved here, so that a failure whose waiters were all cancelled (or a background refresh
            # nobody waits for) is not logged by asyncio
            pending.add_done_callback(lambda t: t.cancelled() or t.exception())
        return pending

    def _schedule(self) -> None:
        """Start the next refresh in the background at 80% of the current token's life (librdkafka's and
        the Java client's refresh timer), or when the retry pause after a failed refresh ends, so that a
        re-authentication, due at 85-95% of the session, finds the new token ready rather than sending
        the old one for a session that ends with it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = self._clock()
        with self._lock:
            token, retry_at = self._token, self._retry_at
        if token is None or now >= token.expiry:
            return  # nothing valid to keep using: the next caller waits for a fetch
        if retry_at is not None and now < retry_at:
            delay = retry_at - now
        else:
            delay = token.obtained + REFRESH_FRACTION * (token.expiry - token.obtained) - now
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(min(max(delay, 0.0), 86400.0), self._on_timer, loop)

    def _on_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        if not self._used or loop.is_closed():
            return  # nobody asked for a token since the last timed refresh (a closed client): stop
        if self._cached() is None:
            self._used = False
            self._start(loop)  # stale and not waiting out a failure: refresh (its end schedules the next)
        else:
            self._schedule()

    async def _refresh(self) -> OAuthToken:
        """One call of oauth_cb, bounded by ``timeout``: a callback that does not return in time is
        abandoned (cancelled when it is a coroutine; a worker thread cannot be stopped), so the next
        refresh calls oauth_cb again rather than waiting on the same hung call."""
        cancelled = False
        try:
            try:
                return await asyncio.wait_for(self._fetch(), self.timeout)
            except asyncio.TimeoutError:
                assert self.timeout is not None
                return self._refresh_failed(TokenError(f"oauth_cb did not return within "
                                                       f"{self.timeout * 1000:.0f} ms (request.timeout.ms)"))
            except TokenError as exc:
                return self._refresh_failed(exc)
        except asyncio.CancelledError:
            cancelled = True  # the client's loop is shutting down: no next refresh
            raise
        finally:
            if not cancelled:
                self._schedule()

    def _in_thread(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
        """A plain oauth_cb's outcome on ``loop``, called by :meth:`_call_in_thread` (not in the loop's
        default executor, whose workers Python joins at exit: a hung callback would keep a closed client's
        process from exiting)."""
        fut: asyncio.Future[Any] = loop.create_future()

        def done(ok: bool, value: Any) -> None:
            try:
                loop.call_soon_threadsafe(_settle, fut, ok, value)
            except RuntimeError:
                pass  # the loop is closed (the client too): nobody waits for this outcome

        self._call_in_thread(done)
        return fut

    async def _fetch(self) -> OAuthToken:
        assert self.oauth_cb is not None
        if inspect.iscoroutinefunction(self.oauth_cb):
            result: Any = self._call()  # the coroutine; its own exceptions come when awaited below
        else:
            result = await self._in_thread(asyncio.get_running_loop())
        if inspect.isawaitable(result):  # an async def, an object with an async __call__, a returned coroutine
            try:
                result = await result
            except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                raise  # asyncio's own: a cancelled refresh, or an interrupt that stops the loop as usual
            except BaseException as exc:  # noqa: BLE001 - the user's callback: its failure becomes one clear error
                raise TokenError(f"oauth_cb raised {type(exc).__name__}: {exc}") from None
        return self._keep(_token_from_callback(result, self._clock()))


def _settle(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if not fut.done():  # not abandoned meanwhile (timeout, cancelled)
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def token_source(values: Mapping[str, Any]) -> TokenSource:
    """The TokenSource of ``sasl.mechanism=OAUTHBEARER``; ValueError (the caller's ConfigError) when
    neither or both of oauth_cb and enable.sasl.oauthbearer.unsecure.jwt are given."""
    cb, unsecure, config = values["oauth_cb"], values["enable.sasl.oauthbearer.unsecure.jwt"], \
        values["sasl.oauthbearer.config"]
    if cb is not None and unsecure:
        raise ValueError("oauth_cb and enable.sasl.oauthbearer.unsecure.jwt=true are mutually exclusive "
                         "(as in librdkafka): set one")
    if cb is None and not unsecure:
        raise ValueError("sasl.mechanism=OAUTHBEARER needs a token: set oauth_cb (a callable returning "
                         "(token_str, expiry_seconds_since_epoch)) or enable.sasl.oauthbearer.unsecure.jwt=true "
                         "with sasl.oauthbearer.config=\"principal=NAME\" (unsigned tokens, for development)")
    if unsecure:
        return TokenSource(None, config, parse_unsecured_config(config))
    timeout_ms = values.get("request.timeout.ms")
    return TokenSource(cb, config, None, timeout=timeout_ms / 1000 if timeout_ms else None)
