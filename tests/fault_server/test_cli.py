"""The ``fault-server`` command line: modes in any order, --help, --list, the control token."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from fault_server import FAULTS, ServerThread

from ..support.wire import cli_server, http_request, raw_exchange

TOKEN = "cli-SECRET-token-42"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "fault_server", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=20, check=False)


def test_help_lists_every_mode() -> None:
    shown = run_cli("--help")
    assert shown.returncode == 0
    assert "{serve,proxy}" in shown.stdout
    assert "serve:" in shown.stdout and "proxy:" in shown.stdout


@pytest.mark.slow
def test_flags_may_come_before_the_mode(fault_server: ServerThread) -> None:
    with cli_server("proxy", "--upstream", fault_server.url()) as (base_url, _):
        answer = raw_exchange(base_url, http_request("GET", "/v1/models"))
    assert answer.status == 200, answer


def test_proxy_without_an_upstream_is_a_usage_error() -> None:
    refused = run_cli("--port", "0", "proxy")
    assert refused.returncode == 2
    assert "proxy mode needs --upstream" in refused.stderr


def test_list_counts_the_faults_without_healthy() -> None:
    listing = run_cli("--list")
    assert listing.returncode == 0
    assert listing.stdout.splitlines()[0] == f"{len(FAULTS) - 1} faults, and healthy:"


@pytest.mark.parametrize("how", ["flag", "env"])
def test_the_control_token_from_a_flag_or_the_environment(how: str) -> None:
    args = ("--control-token", TOKEN) if how == "flag" else ()
    env = {**os.environ, "FAULT_SERVER_CONTROL_TOKEN": TOKEN} if how == "env" else None
    with cli_server(*args, env=env) as (base_url, _):
        refused = raw_exchange(base_url, http_request("GET", "/_fault/stats"))
        allowed = raw_exchange(
            base_url, http_request("GET", "/_fault/stats", b"", {"X-Fault-Token": TOKEN})
        )
    assert refused.status == 401, refused
    assert allowed.status == 200, allowed


def test_beyond_loopback_without_a_token_is_a_usage_error() -> None:
    refused = run_cli("--host", "0.0.0.0", "--port", "0")
    assert refused.returncode == 2
    assert "needs --control-token" in refused.stderr
    assert "--insecure-open-control" in refused.stderr


@pytest.mark.slow
def test_insecure_open_control_says_so_loudly() -> None:
    with cli_server("--host", "0.0.0.0", "--insecure-open-control", stderr=subprocess.PIPE) as (
        base_url,
        proc,
    ):
        assert raw_exchange(base_url, http_request("GET", "/_fault/stats")).status == 200
        assert proc.stderr is not None
        with proc.stderr:
            warning = proc.stderr.readline().decode()
    assert "WARNING" in warning and "ARM FAULTS" in warning


@pytest.mark.slow
def test_stdout_ends_with_the_refused_ports_url() -> None:
    with cli_server() as (base_url, proc):
        assert proc.stdout is not None
        blackhole = proc.stdout.readline().decode().strip()
        refused = proc.stdout.readline().decode().strip()
    assert blackhole.startswith("http://127.0.0.1:") and blackhole.endswith("/v1")
    assert refused.startswith("http://127.0.0.1:") and refused.endswith("/v1")
    assert len({base_url, blackhole.removesuffix("/v1"), refused.removesuffix("/v1")}) == 3
    host, port = refused.removeprefix("http://").removesuffix("/v1").rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=5).close()
