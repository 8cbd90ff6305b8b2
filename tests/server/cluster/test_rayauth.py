"""The Ray token's file and the checks that need no cluster (server/cluster/rayauth.py); the
real clusters' side is tests/redteam/test_ray_auth.py."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from palaestra.server.cluster import rayauth
from palaestra.server.cluster.connect import ClusterAuthError, check_cluster
from tests.conftest import make_settings


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_new_token_is_readable_by_this_user_only_and_never_overwritten(tmp_path: Path) -> None:
    token = tmp_path / "data" / "ray" / "auth_token"
    rayauth.ensure_token(token, own_folder=True)
    assert mode(token) == 0o600 and mode(token.parent) == 0o700
    first = token.read_text()
    assert len(first) == 64 and int(first, 16) >= 0
    rayauth.ensure_token(token, own_folder=True)
    assert token.read_text() == first


def test_a_token_left_open_to_others_is_closed(tmp_path: Path) -> None:
    token = tmp_path / "ray" / "auth_token"
    token.parent.mkdir(mode=0o755)
    token.write_text("f" * 64)
    token.chmod(0o644)
    rayauth.ensure_token(token, own_folder=True)
    assert mode(token) == 0o600 and mode(token.parent) == 0o700
    theirs = tmp_path / "operator" / "token"  # an operator's folder is theirs: only the file
    theirs.parent.mkdir(mode=0o755)
    theirs.write_text("e" * 64)
    theirs.chmod(0o644)
    rayauth.make_private(theirs, own_folder=False)
    assert mode(theirs) == 0o600 and mode(theirs.parent) == 0o755


def test_an_empty_token_file_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "ray" / "auth_token"
    token.parent.mkdir(mode=0o700)
    token.write_text("\n")
    with pytest.raises(rayauth.RayAuthError, match="empty"):
        rayauth.ensure_token(token, own_folder=True)


def test_the_token_file_defaults_to_the_data_dir(tmp_path: Path) -> None:
    settings = make_settings(data_dir=tmp_path / "data")
    assert rayauth.token_path(settings) == tmp_path / "data" / "ray" / "auth_token"
    named = make_settings(data_dir=tmp_path / "data", ray_token_file=tmp_path / "t")
    assert rayauth.token_path(named) == tmp_path / "t"


def test_rays_own_token_sources_in_rays_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in rayauth.RAY_AUTH_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert rayauth.ray_token_source() is None
    default = tmp_path / ".ray" / "auth_token"
    default.parent.mkdir()
    default.write_text("d" * 64)
    assert rayauth.ray_token_source() == default
    named = tmp_path / "named"
    named.write_text("n" * 64)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(named))
    assert rayauth.ray_token_source() == named
    monkeypatch.setenv("RAY_AUTH_TOKEN", "t" * 64)
    assert rayauth.ray_token_source() == "RAY_AUTH_TOKEN"


def test_a_ray_client_address_is_refused_unless_accepted(tmp_path: Path) -> None:
    """Its authentication cannot be checked (it is not the GCS): the operator must say so."""
    with socket.create_server(("127.0.0.1", 0)) as listening:  # something answers there
        address = f"ray://127.0.0.1:{listening.getsockname()[1]}"
        settings = make_settings(data_dir=tmp_path / "data", ray=address)
        with pytest.raises(ClusterAuthError, match="PALAESTRA_RAY_ALLOW_UNAUTHENTICATED"):
            check_cluster(settings)
    accepted = settings.model_copy(update={"ray_allow_unauthenticated": True})
    assert rayauth.require_auth(accepted, accepted.ray) is False
