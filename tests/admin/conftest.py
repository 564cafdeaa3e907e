"""Users for the admin tests: a superuser, and staff with only some permissions."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User


def staff_with(*codenames: str) -> User:
    """Return a staff user holding exactly the alkstore_django permissions ``codenames``."""
    user = User.objects.create(username=f"staff-{'-'.join(codenames) or 'none'}", is_staff=True)
    perms = Permission.objects.filter(
        content_type__app_label="alkstore_django", codename__in=codenames
    )
    user.user_permissions.set(perms)
    return user


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
