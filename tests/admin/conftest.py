"""Fixtures for the admin tests: fast password hashing, a client logged in as limited staff."""

from __future__ import annotations

import pytest

from tests.helpers import staff_with


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    # admin_client's superuser gets a password; a slow hasher would dominate the run.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def staff_client(client):
    """Return a function logging ``client`` in as staff with the given permissions."""

    def login(*codenames: str):
        client.force_login(staff_with(*codenames))
        return client

    return login
