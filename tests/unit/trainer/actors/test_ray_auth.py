"""Token authentication when a job attaches to an existing Ray cluster: where the token is found (Ray's sources,
in Ray's order), what the driver does for a cluster that requires a token or not, and the errors that name the
fix. The cluster is modelled by the probe (``probe(address, token) -> accepted?``); the real GCS probe against a
real `ray start` cluster is in tests/integration/trainer/test_ray_cluster.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from marti.config import load_config
from marti.errors import FailedPreconditionError, UnauthenticatedError
from services.trainer.ray.auth import ClusterAuth, default_token_path, find_token, prepare_cluster_auth
from services.trainer.ray.runtime import cluster_address, ray_init_kwargs

TINY = Path(__file__).resolve().parents[4] / "examples" / "tiny.yaml"
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A HOME of the test's own, without a token file, and no Ray auth variables in the environment."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in AUTH_VARS:
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _write_default_token(home, value: str) -> None:
    (home / ".ray").mkdir(exist_ok=True)
    (home / ".ray" / "auth_token").write_text(value)


class Cluster:
    """A cluster as the probe sees it: its token (``None``: no authentication), the calls made."""

    def __init__(self, token: str | None, answers: bool = True) -> None:
        self.token, self.answers, self.calls = token, answers, []

    def __call__(self, address: str, token: str | None) -> bool | None:
        self.calls.append((address, token))
        if not self.answers:
            return None
        return self.token is None or token == self.token


def test_default_token_path_is_under_home(home):
    assert default_token_path() == home / ".ray" / "auth_token"


def test_find_token_follows_rays_precedence(home):
    _write_default_token(home, "from-file\n")
    named = home / "named"
    named.write_text("  from-path \n")
    assert find_token({"RAY_AUTH_TOKEN": "from-env", "RAY_AUTH_TOKEN_PATH": str(named)}).value == "from-env"
    found = find_token({"RAY_AUTH_TOKEN": "", "RAY_AUTH_TOKEN_PATH": str(named)})
    assert (found.value, found.source) == ("from-path", f"RAY_AUTH_TOKEN_PATH={named}")
    found = find_token({})
    assert (found.value, found.source) == ("from-file", str(home / ".ray" / "auth_token"))


def test_find_token_none_without_any_source(home):
    assert find_token({}) is None
    _write_default_token(home, " \n")
    assert find_token({}) is None  # an empty file holds no token


def test_a_token_path_that_cannot_be_read_or_is_empty_is_an_error_naming_it(home):
    missing = home / "nope"
    with pytest.raises(UnauthenticatedError, match=f"RAY_AUTH_TOKEN_PATH={missing} cannot be read"):
        find_token({"RAY_AUTH_TOKEN_PATH": str(missing)})
    empty = home / "empty"
    empty.write_text("")
    with pytest.raises(UnauthenticatedError, match=f"RAY_AUTH_TOKEN_PATH={empty} is empty"):
        find_token({"RAY_AUTH_TOKEN_PATH": str(empty)})


def test_a_token_cluster_switches_the_driver_to_token_mode_and_restore_undoes_it(home):
    _write_default_token(home, "secret")
    cluster = Cluster("secret")
    environ: dict[str, str] = {}
    auth = prepare_cluster_auth("10.0.0.1:6379", environ=environ, probe=cluster)
    assert (auth.mode, auth.token_source, auth.changed) == ("token", str(home / ".ray" / "auth_token"), True)
    assert environ == {"RAY_AUTH_MODE": "token"}
    assert cluster.calls == [("10.0.0.1:6379", None), ("10.0.0.1:6379", "secret")]
    auth.restore(environ)
    assert environ == {}


def test_a_missing_token_is_an_error_naming_every_source(home):
    with pytest.raises(UnauthenticatedError) as err:
        prepare_cluster_auth("10.0.0.1:6379", environ={}, probe=Cluster("secret"))
    message = str(err.value)
    assert message.startswith("the Ray cluster at 10.0.0.1:6379 requires a token")
    for fix in (
        "ray get-auth-token",
        "~/.ray/auth_token",
        "RAY_AUTH_TOKEN=<token>",
        "RAY_AUTH_TOKEN_PATH=<file",
    ):
        assert fix in message


def test_a_refused_token_is_an_error_naming_its_source(home):
    environ = {"RAY_AUTH_TOKEN": "stale"}
    with pytest.raises(
        UnauthenticatedError, match="refused the token from RAY_AUTH_TOKEN: it is not this cluster's"
    ):
        prepare_cluster_auth("10.0.0.1:6379", environ=environ, probe=Cluster("secret"))
    assert "RAY_AUTH_MODE" not in environ


def test_auth_mode_disabled_on_a_token_cluster_is_an_error(home):
    _write_default_token(home, "secret")
    with pytest.raises(
        UnauthenticatedError, match="requires a token and RAY_AUTH_MODE=disabled is set: unset"
    ):
        prepare_cluster_auth("h:1", environ={"RAY_AUTH_MODE": "disabled"}, probe=Cluster("secret"))


def test_an_explicit_token_mode_is_kept_and_checked(home):
    environ = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "secret"}
    auth = prepare_cluster_auth("h:1", environ=environ, probe=Cluster("secret"))
    assert (auth.mode, auth.changed) == ("token", False)
    auth.restore(environ)
    assert environ["RAY_AUTH_MODE"] == "token"
    with pytest.raises(UnauthenticatedError, match="requires a token .* none was found"):
        prepare_cluster_auth("h:1", environ={"RAY_AUTH_MODE": "token"}, probe=Cluster("secret"))


def test_a_cluster_without_authentication_leaves_the_driver_alone(home):
    _write_default_token(
        home, "secret"
    )  # a token from an earlier local ray.init must not switch token mode on
    environ: dict[str, str] = {}
    auth = prepare_cluster_auth("h:1", environ=environ, probe=Cluster(None))
    assert (auth.mode, auth.changed, environ) == ("disabled", False, {})


def test_token_mode_on_a_cluster_without_authentication_is_an_error(home):
    with pytest.raises(
        FailedPreconditionError, match="does not use token authentication .* unset RAY_AUTH_MODE"
    ):
        prepare_cluster_auth("h:1", environ={"RAY_AUTH_MODE": "token"}, probe=Cluster(None))


def test_what_ray_resolves_itself_is_left_to_ray(home):
    for address in ("auto", "ray://h:10001"):
        cluster = Cluster("secret")
        assert prepare_cluster_auth(address, environ={}, probe=cluster) == ClusterAuth(mode=None)
        assert cluster.calls == []
    cluster = Cluster("secret")  # an unknown mode (a later Ray's) is not second-guessed
    assert prepare_cluster_auth("h:1", environ={"RAY_AUTH_MODE": "k8s"}, probe=cluster).mode is None
    assert cluster.calls == []
    environ: dict[str, str] = {}  # no answer: ray.init reports what it finds
    assert prepare_cluster_auth("h:1", environ=environ, probe=Cluster("secret", answers=False)).mode is None
    assert environ == {}


@pytest.fixture
def ray_config():
    """Reload Ray's in-process config after the test and after ``monkeypatch`` put the environment back (request
    it before ``home``): a local ``ray.init`` earlier in this process may have set ``RAY_AUTH_MODE=token``."""
    yield
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def test_token_mode_reaches_the_ray_already_imported_and_is_undone(ray_config, home):
    """Ray reads RAY_AUTH_MODE when imported: the switch reloads its config, and restore reloads it back."""
    from ray._raylet import AuthenticationMode, get_authentication_mode

    _write_default_token(home, "secret")
    auth = prepare_cluster_auth("h:1", probe=Cluster("secret"))  # os.environ
    try:
        assert os.environ["RAY_AUTH_MODE"] == "token"
        assert get_authentication_mode() == AuthenticationMode.TOKEN
    finally:
        auth.restore()
    assert "RAY_AUTH_MODE" not in os.environ
    assert get_authentication_mode() == AuthenticationMode.DISABLED


def test_cluster_address_and_the_local_path(home, monkeypatch):
    cfg = load_config(TINY)
    assert cluster_address(cfg) is None
    assert "address" not in ray_init_kwargs(cfg) and ray_init_kwargs(cfg)["num_cpus"] == 2
    assert cluster_address(load_config(TINY, ["ray.address=local"])) is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert cluster_address(cfg) == "10.0.0.1:6379"
    assert ray_init_kwargs(cfg)["address"] == "10.0.0.1:6379"
    assert cluster_address(load_config(TINY, ["ray.address=h:1"])) == "h:1"


def test_the_token_is_not_in_the_repr(home):
    _write_default_token(home, "s3cr3t-token")
    token = find_token({})
    assert token is not None and token.value == "s3cr3t-token" and "s3cr3t" not in repr(token)


def test_shutdown_puts_the_auth_mode_back_even_when_the_teardown_fails(monkeypatch):
    """A cluster gone mid-job makes the teardown raise: the next job of the process must still start from the
    user's RAY_AUTH_MODE (here: unset)."""
    import ray

    from services.trainer.ray.runtime import RayRuntime

    runtime = RayRuntime(load_config(TINY))
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # what prepare_cluster_auth set for the job
    runtime._auth = ClusterAuth(mode="token", changed=True, previous=None)
    runtime._pg = object()

    def gone(pg):
        raise ConnectionError("GCS unreachable")

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray.util, "remove_placement_group", gone)
    with pytest.raises(ConnectionError):
        runtime.shutdown()
    assert "RAY_AUTH_MODE" not in os.environ and runtime._auth is None
