"""Ray token authentication for a job that attaches to an existing Ray cluster (``ray.address`` / ``RAY_ADDRESS``).

Since Ray 2.59 a cluster may require a token from every client: ``ray start --head`` turns token authentication
on by itself when ``RAY_AUTH_MODE`` is unset and a token already exists (``~/.ray/auth_token``, which any local
``ray.init()`` of Ray >= 2.59 writes), and any node started with ``RAY_AUTH_MODE=token`` requires one. A driver
that connects with an explicit address, however, never turns it on by itself: with ``RAY_AUTH_MODE`` unset it
connects without a token and Ray fails after about 30 s with ``ConnectionError`` caused by ``AuthenticationError:
InvalidAuthToken``. The opposite mismatch fails too: a driver in token mode on a cluster without authentication
connects, but its actors die before they run.

:func:`prepare_cluster_auth` makes the driver match the cluster before ``ray.init``. It asks the cluster's GCS
whether it requires a token (one ``GetClusterId`` call without and, when needed, with the token; milliseconds),
finds the token where Ray documents it (:func:`find_token`: ``RAY_AUTH_TOKEN``, then the file named by
``RAY_AUTH_TOKEN_PATH``, then ``~/.ray/auth_token``), switches this process to token mode when the cluster
requires it, and otherwise raises an error that names the fix. See docs/deploy.md, "Attaching a job to an
existing Ray cluster".
"""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

from marti.errors import FailedPreconditionError, UnauthenticatedError

#: Ray's authentication mode variable: ``disabled`` or ``token`` (read by Ray, never written to a file).
AUTH_MODE_ENV = "RAY_AUTH_MODE"
#: The token itself (Ray's first source).
TOKEN_ENV = "RAY_AUTH_TOKEN"
#: A file holding the token (Ray's second source; Ray aborts the process when it is set and unreadable or empty).
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
#: The GCS method the probe calls: the first call every Ray client makes, and one that needs no arguments.
PROBE_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"

#: How to give a job the cluster's token, appended to every error about a missing or refused token.
TOKEN_FIX = (
    f"put the cluster's token (`ray get-auth-token` on its head node prints it) in ~/.ray/auth_token, or set "
    f"{TOKEN_ENV}=<token>, or {TOKEN_PATH_ENV}=<file holding it>"
)


def default_token_path() -> Path:
    """Ray's default token file, ``~/.ray/auth_token`` (the home of ``$HOME``)."""
    return Path.home() / ".ray" / "auth_token"


@dataclass(frozen=True)
class RayToken:
    """A Ray authentication token and where it was found.

    Attributes:
        value: The token, without surrounding whitespace (left out of the repr, so a log line never shows it).
        source: ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH=<file>`` or the default file's path (for messages).
    """

    value: str = field(repr=False)
    source: str


def find_token(environ: MutableMapping[str, str] | None = None) -> RayToken | None:
    """The token Ray would use, from the sources Ray documents, highest precedence first.

    1. ``RAY_AUTH_TOKEN``, when set and not empty;
    2. the file named by ``RAY_AUTH_TOKEN_PATH``, when that variable is set;
    3. ``~/.ray/auth_token`` (:func:`default_token_path`), when it exists and is not empty.

    Args:
        environ: The environment to read; ``None``: ``os.environ``.

    Returns:
        The token, or ``None`` when no source holds one.

    Raises:
        UnauthenticatedError: ``RAY_AUTH_TOKEN_PATH`` is set but its file cannot be read or is empty (Ray treats
            this as fatal and aborts the process, so it is reported here first, with the path).
    """
    environ = os.environ if environ is None else environ
    value = environ.get(TOKEN_ENV, "").strip()
    if value:
        return RayToken(value, TOKEN_ENV)
    path_value = environ.get(TOKEN_PATH_ENV)
    if path_value:
        path = Path(path_value).expanduser()
        try:
            value = path.read_text().strip()
        except OSError as exc:
            raise UnauthenticatedError(
                f"{TOKEN_PATH_ENV}={path_value} cannot be read ({exc.strerror or exc}): write the cluster's token "
                f"to that file, or unset {TOKEN_PATH_ENV}"
            ) from None
        if not value:
            raise UnauthenticatedError(
                f"{TOKEN_PATH_ENV}={path_value} is empty: write the cluster's token to that file, or unset "
                f"{TOKEN_PATH_ENV}"
            )
        return RayToken(value, f"{TOKEN_PATH_ENV}={path_value}")
    path = default_token_path()
    try:
        value = path.read_text().strip()
    except OSError:
        return None
    return RayToken(value, str(path)) if value else None


def gcs_accepts(address: str, token: str | None = None, timeout_s: float = 5.0) -> bool | None:
    """Whether the Ray cluster whose GCS listens at ``address`` (``host:port``) accepts a call with ``token``.

    One ``GetClusterId`` call (:data:`PROBE_METHOD`) with ``authorization: Bearer <token>`` when a token is given.

    Returns:
        ``True``: the call succeeded (no token needed, or this one is the cluster's); ``False``: the GCS answered
        ``UNAUTHENTICATED`` (a token is required, or this one is wrong); ``None``: no answer (unreachable, not a
        Ray GCS, a timeout), left for ``ray.init`` to report.
    """
    import grpc

    metadata = None if token is None else [("authorization", f"Bearer {token}")]
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            PROBE_METHOD, request_serializer=lambda _: b"", response_deserializer=lambda data: data
        )
        try:
            call(None, timeout=timeout_s, metadata=metadata)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            return False if code == grpc.StatusCode.UNAUTHENTICATED else None
    return True


def probe_address(address: str) -> str | None:
    """The ``host:port`` of the GCS to probe for ``address``, or ``None`` for addresses Ray resolves itself.

    ``auto`` (Ray finds the local cluster and turns token mode on by itself when a token exists) and
    ``ray://`` (Ray Client, through the client server rather than the GCS) are left to Ray.
    """
    address = address.strip()
    if not address or address == "auto" or "://" in address:
        return None
    return address


@dataclass
class ClusterAuth:
    """What :func:`prepare_cluster_auth` did to this process, so :meth:`restore` can undo it.

    Attributes:
        mode: The mode the driver attaches with: ``token``, ``disabled``, or ``None`` (left to Ray: an address
            Ray resolves itself, a cluster that did not answer the probe, or a mode this module does not know).
        token_source: Where the token came from when ``mode`` is ``token`` (see :class:`RayToken`).
        changed: Whether :meth:`restore` must put ``RAY_AUTH_MODE`` back: set by :func:`prepare_cluster_auth`
            (and Ray's config reloaded), or about to be set by a local ``ray.init`` (:meth:`before_local_init`).
        previous: ``RAY_AUTH_MODE`` before, ``None`` when unset.
    """

    mode: str | None
    token_source: str | None = None
    changed: bool = False
    previous: str | None = None

    @classmethod
    def before_local_init(cls, environ: MutableMapping[str, str] | None = None) -> ClusterAuth:
        """Remember ``RAY_AUTH_MODE`` before a local ``ray.init``, which sets it to ``token`` (when it turns token
        authentication on) and never unsets it; :meth:`restore` puts it back."""
        environ = os.environ if environ is None else environ
        return cls(mode=None, changed=True, previous=environ.get(AUTH_MODE_ENV))

    def restore(self, environ: MutableMapping[str, str] | None = None) -> None:
        """Put ``RAY_AUTH_MODE`` back as it was (and reload Ray's config) if :func:`prepare_cluster_auth` set it,
        so a later job of this process (a local Ray, another cluster) starts from the user's setting."""
        if not self.changed:
            return
        environ = os.environ if environ is None else environ
        if self.previous is None:
            environ.pop(AUTH_MODE_ENV, None)
        else:
            environ[AUTH_MODE_ENV] = self.previous
        if environ is os.environ:
            _reload_ray_auth_config()
        self.changed = False


def prepare_cluster_auth(
    address: str,
    environ: MutableMapping[str, str] | None = None,
    probe: Callable[[str, str | None], bool | None] = gcs_accepts,
) -> ClusterAuth:
    """Make this process attach to the cluster at ``address`` with the authentication the cluster uses; call it
    before ``ray.init(address=...)``.

    The cluster is asked first (``probe(address, None)``, :func:`gcs_accepts`); then:

    - it requires a token: the token is found as Ray does (:func:`find_token`) and checked against the cluster
      (``probe(address, token)``); ``RAY_AUTH_MODE`` unset is then set to ``token`` (and Ray's in-process config
      reloaded, since Ray reads the variable when it is imported);
    - it requires none: nothing changes (Ray's default, ``disabled``, for an explicit address);
    - it does not answer, or ``address`` is one Ray resolves itself (:func:`probe_address`): nothing changes and
      ``ray.init`` reports what it finds.

    A ``RAY_AUTH_MODE`` other than ``token`` / ``disabled`` is left to Ray untouched.

    Args:
        address: The cluster's address (``ray.address`` or ``RAY_ADDRESS``): ``host:port`` of its GCS.
        environ: The environment to read and set; ``None``: ``os.environ`` (only then is Ray's config reloaded).
        probe: ``probe(gcs_address, token_or_None)``: ``True`` accepted, ``False`` refused as unauthenticated,
            ``None`` no answer (:func:`gcs_accepts`).

    Returns:
        What was done (:class:`ClusterAuth`); call :meth:`ClusterAuth.restore` after ``ray.shutdown``.

    Raises:
        UnauthenticatedError: The cluster requires a token and none is found, or the one found is refused, or
            ``RAY_AUTH_MODE=disabled`` is set; or ``RAY_AUTH_TOKEN_PATH`` names an unreadable or empty file.
            The message names the fix.
        FailedPreconditionError: ``RAY_AUTH_MODE=token`` is set but the cluster does not use token
            authentication (the job's actors would die before they run).
    """
    environ = os.environ if environ is None else environ
    previous = environ.get(AUTH_MODE_ENV)
    mode = None if previous is None else previous.strip().lower()
    if mode not in (None, "", "token", "disabled"):
        return ClusterAuth(mode=None, previous=previous)
    gcs = probe_address(address)
    if gcs is None:
        return ClusterAuth(mode=None, previous=previous)
    open_ = probe(gcs, None)
    if open_ is None:
        return ClusterAuth(mode=None, previous=previous)
    if open_:
        if mode == "token":
            raise FailedPreconditionError(
                f"{AUTH_MODE_ENV}=token is set but the Ray cluster at {address} does not use token "
                f"authentication (its actors would die before they run): unset {AUTH_MODE_ENV}, or start the "
                f"cluster's nodes with {AUTH_MODE_ENV}=token"
            )
        return ClusterAuth(mode="disabled", previous=previous)
    if mode == "disabled":
        raise UnauthenticatedError(
            f"the Ray cluster at {address} requires a token and {AUTH_MODE_ENV}=disabled is set: unset "
            f"{AUTH_MODE_ENV} (or set it to token) and {TOKEN_FIX}"
        )
    token = find_token(environ)
    if token is None:
        raise UnauthenticatedError(
            f"the Ray cluster at {address} requires a token (token authentication is on) and none was found: "
            f"{TOKEN_FIX}"
        )
    if probe(gcs, token.value) is False:
        raise UnauthenticatedError(
            f"the Ray cluster at {address} refused the token from {token.source}: it is not this cluster's "
            f"token; {TOKEN_FIX}"
        )
    auth = ClusterAuth(mode="token", token_source=token.source, previous=previous)
    if mode != "token":
        environ[AUTH_MODE_ENV] = "token"
        auth.changed = True
        if environ is os.environ:
            _reload_ray_auth_config()
    return auth


def _reload_ray_auth_config() -> None:
    """Make the Ray already imported in this process see the current ``RAY_AUTH_MODE`` and token sources.

    Ray reads ``RAY_AUTH_MODE`` into its C++ config when it is imported and caches the token it loads; setting
    the variable afterwards changes nothing (tried: the driver still connects without a token). Ray itself,
    when it turns token mode on for ``ray.init()``, sets the variable and calls ``Config.initialize("")``
    (``ray._private.authentication.authentication_token_setup._enable_token_auth``); this does the same and
    drops the token loader's cache.
    """
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
