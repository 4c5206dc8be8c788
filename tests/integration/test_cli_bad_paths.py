"""A service command given a folder or file setting it cannot use stops with one line naming it and exit code 2
(operations.md "Bad settings"), as a user meets it: ``marti store --data-dir FILE`` printed a FileExistsError
traceback (exit 1), ``marti up --data-dir FILE`` the broker's NotADirectoryError traceback, and an unreadable
TLS file exited 1; a readable TLS file that is not PEM (or a key not of the certificate) said "could not bind",
exit 1."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _marti(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "marti.command.main", *args], capture_output=True, text=True, timeout=60
    )


def _one_line(out: subprocess.CompletedProcess) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


@pytest.mark.parametrize("service", ["broker", "store"])
def test_a_data_dir_that_is_a_file_is_one_line_exit_2(service, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    out = _marti(service, "--port", "0", "--data-dir", str(afile))
    assert out.returncode == 2, out
    assert (
        _one_line(out)
        == f"marti {service}: error: {service} data dir {afile} is not a folder (a file of that name exists)"
    )
    out = _marti(service, "--port", "0", "--data-dir", str(afile / "sub"))
    assert out.returncode == 2, out
    assert f"data dir {afile / 'sub'} cannot be created: {afile} is a file" in _one_line(out)


@pytest.mark.parametrize("flag", ["--data-dir", "--log-dir"])
def test_marti_up_with_a_folder_flag_that_is_a_file_is_one_line_exit_2(flag, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    out = _marti("up", "--no-trainer", "--ephemeral-ports", flag, str(afile))
    assert out.returncode == 2, out
    what = flag[2:].replace("-", " ")
    assert _one_line(out) == f"marti up: error: {what} {afile} is not a folder (a file of that name exists)"
    assert "SERVING" not in out.stdout


def test_an_unreadable_tls_file_is_one_line_naming_the_setting_exit_2(tmp_path):
    missing = tmp_path / "nope.pem"
    out = _marti("store", "--port", "0", "--tls-cert-file", str(missing), "--tls-key-file", str(missing))
    assert out.returncode == 2, out
    line = _one_line(out)
    assert (
        f"= '{missing}': cannot read the TLS file: No such file or directory" in line
        and "setting tls_" in line
    )


def _self_signed(tmp_path, name: str) -> tuple[str, str]:
    """A self-signed EC certificate and its key made by ``openssl`` (PEM paths)."""
    cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "2", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return str(cert), str(key)


@pytest.mark.parametrize("service", ["broker", "store"])
def test_a_readable_tls_file_that_is_not_pem_is_one_line_naming_the_setting_exit_2(service, tmp_path):
    bad = tmp_path / "bad.pem"
    bad.write_text("not a pem\n")
    out = _marti(service, "--port", "0", "--tls-cert-file", str(bad), "--tls-key-file", str(bad))
    assert out.returncode == 2, out
    assert _one_line(out) == (
        f"marti: error: setting tls_cert_file = '{bad}': not a PEM certificate file "
        "(OpenSSL: NO_CERTIFICATE_OR_CRL_FOUND)"
    )


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_a_key_not_of_the_certificate_or_a_client_ca_not_pem_is_one_line_naming_the_setting_exit_2(tmp_path):
    cert, own_key = _self_signed(tmp_path, "a")
    _, other_key = _self_signed(tmp_path, "b")
    bad = tmp_path / "bad.key"
    bad.write_text("not a pem\n")
    for key in (other_key, str(bad)):
        out = _marti("broker", "--port", "0", "--tls-cert-file", cert, "--tls-key-file", key)
        assert out.returncode == 2, out
        line = _one_line(out)
        assert line.startswith(
            f"marti: error: setting tls_key_file = '{key}': not a PEM private key (unencrypted) of the "
            "certificate in tls_cert_file"
        ), line
    out = _marti(
        "broker",
        "--port",
        "0",
        "--tls-cert-file",
        cert,
        "--tls-key-file",
        own_key,
        "--tls-client-ca-file",
        str(bad),
    )
    assert out.returncode == 2, out
    assert _one_line(out).startswith(
        f"marti: error: setting tls_client_ca_file = '{bad}': not a PEM certificate"
    )


@pytest.mark.parametrize(
    ("host", "hint"),
    [
        ("", "an empty host"),
        ("127.0.0.1:5000", "give the port with --port"),
        ("256.1.1.1", "cannot be resolved"),
    ],
)
def test_a_host_that_cannot_be_bound_is_one_line_naming_the_setting_exit_2(host, hint):
    """``marti broker --host 127.0.0.1:5000`` (or an empty or unresolvable host) printed gRPC's own log line and
    ``could not bind [127.0.0.1:5000]:0``, exit 1; the host is now checked before the bind."""
    out = _marti("broker", "--port", "0", "--host", host)
    assert out.returncode == 2, out
    line = _one_line(out)
    assert line.startswith(f"marti: error: setting host = {host!r}: ") and hint in line, line


@pytest.mark.parametrize(
    ("service", "args", "env", "setting"),
    [
        ("broker", ["--data-dir", ""], {}, "data_dir (--data-dir)"),
        ("store", [], {"MARTI_STORE_DATA_DIR": ""}, "data_dir (MARTI_STORE_DATA_DIR)"),
        ("store", ["--config", ""], {}, "config (--config)"),
        ("env-server", ["--tls-cert-file", "", "--tls-key-file", ""], {}, "tls_cert_file (--tls-cert-file)"),
    ],
)
def test_an_empty_path_setting_is_one_line_naming_it_exit_2(service, args, env, setting):
    """``--data-dir "$DIR"`` with ``DIR`` empty ran the broker in memory (what it held was lost at exit),
    ``--tls-cert-file "" --tls-key-file ""`` served plaintext and ``--config ""`` created no tables, all silently; an
    empty path is now refused naming the setting and where it came from."""
    out = subprocess.run(
        [sys.executable, "-m", "marti.command.main", service, "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, **env),
    )
    assert out.returncode == 2, out
    line = _one_line(out)
    assert line.startswith(f"marti {service}: error: setting {setting} = '': "), line
    assert "an empty path" in line and "leave the setting unset" in line, line


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--data-dir", ""], {}, "data dir '' is an empty path"),
        ([], {"MARTI_DATA_DIR": ""}, "data dir '' is an empty path"),
        (["--log-dir", ""], {}, "log dir '' is an empty path"),
        (["--token", ""], {}, "token '' is empty (--token or MARTI_TOKEN)"),
        ([], {"MARTI_TOKEN": ""}, "token '' is empty (--token or MARTI_TOKEN)"),
    ],
)
def test_marti_up_with_an_empty_folder_flag_or_token_is_one_line_exit_2(args, env, expected):
    """``marti up --data-dir "$DIR"`` with ``DIR`` empty (or an empty ``MARTI_DATA_DIR``) ran every service in
    memory, silently; ``--log-dir ""`` wrote no logs; ``--token "$T"`` with ``T`` unset (or an empty
    ``MARTI_TOKEN``) ran every service without authentication, silently (``marti broker --token ""`` is refused).
    Refused like a folder flag that is a file, before anything starts."""
    out = subprocess.run(
        [sys.executable, "-m", "marti.command.main", "up", "--no-trainer", "--ephemeral-ports", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, **env),
    )
    assert out.returncode == 2, out
    assert _one_line(out).startswith(f"marti up: error: {expected}"), out.stderr
    assert "SERVING" not in out.stdout


def test_marti_up_with_a_service_tls_variable_is_refused_at_once(tmp_path):
    """``MARTI_STORE_TLS_CERT_FILE`` (any path) made ``marti up``'s store serve TLS, which its plaintext
    health check never reached: 60 s, then ``not SERVING ... UNREACHABLE``. Now one line naming the variable."""
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "marti.command.main", "up", "--no-trainer", "--ephemeral-ports"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, MARTI_STORE_TLS_CERT_FILE=str(tmp_path / "cert.pem")),
    )
    assert out.returncode == 2 and time.monotonic() - start < 20, out
    assert _one_line(out).startswith(
        "marti up: error: MARTI_STORE_TLS_CERT_FILE is set: the store would serve TLS"
    ), out.stderr
    assert "SERVING" not in out.stdout


def _read_only(folder: Path) -> None:
    """Make ``folder`` unwritable to this process (``chmod 555``; root ignores modes: ``chattr +i``), or skip."""
    folder.chmod(0o555)
    if os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
        pytest.skip("root ignores chmod and chattr +i failed here: no way to make a folder read-only")
    try:
        (folder / "probe").touch()
    except OSError:
        return
    pytest.skip(f"{folder} stayed writable")


def _writable_again(folder: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
    folder.chmod(0o755)


@pytest.mark.parametrize(
    ("service", "content", "expected"),
    [
        ("broker", None, "broker data dir {d} cannot be written (.lock: "),
        (
            "store",
            "database",
            "store database {d}/store.sqlite cannot be opened (unable to open database file)",
        ),
        ("store", "garbage", "store database {d}/store.sqlite cannot be opened (file is not a database)"),
    ],
)
def test_a_data_dir_that_cannot_be_written_or_read_is_one_line_exit_2(service, content, expected, tmp_path):
    """A read-only data dir (empty, or holding the database made before) and a database file that is not one
    printed a PermissionError or sqlite3 traceback (exit 1); now one line naming the folder or file, exit 2."""
    data = tmp_path / "data"
    data.mkdir()
    if content == "database":
        sqlite3.connect(data / "store.sqlite").close()
        (data / ".lock").touch()
    elif content == "garbage":
        (data / "store.sqlite").write_text("not a database")
    if content != "garbage":
        _read_only(data)
    try:
        out = _marti(service, "--port", "0", "--data-dir", str(data))
    finally:
        _writable_again(data)
    assert out.returncode == 2, out
    assert _one_line(out).startswith(f"marti {service}: error: " + expected.format(d=data)), out.stderr


def test_marti_up_with_a_read_only_log_dir_is_one_line_exit_2(tmp_path):
    """``marti up --log-dir`` on a folder it cannot write printed a PermissionError traceback (exit 1)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    _read_only(logs)
    try:
        out = _marti("up", "--no-trainer", "--ephemeral-ports", "--log-dir", str(logs))
    finally:
        _writable_again(logs)
    assert out.returncode == 2, out
    assert _one_line(out).startswith(f"marti up: error: log dir {logs} cannot be written (broker.log: "), (
        out.stderr
    )
