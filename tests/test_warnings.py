"""A deprecation raised inside starlette, uvicorn or redis-py, or met by the project's own code,
fails the test that meets it (pyproject.toml's filterwarnings): each is a real deprecated call
of today's versions, raised as an error where it would otherwise be a line in the summary."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from starlette.exceptions import StarletteDeprecationWarning
from starlette.routing import Router


def test_a_starlette_deprecation_is_an_error() -> None:
    async def lifespan(app: object) -> AsyncIterator[None]:
        yield

    with pytest.raises(StarletteDeprecationWarning, match="generator function lifespans"):
        Router(lifespan=lifespan)  # type: ignore[arg-type]


def test_a_uvicorn_deprecation_is_an_error() -> None:
    module = importlib.import_module("uvicorn.main")  # the package's `main` is the function
    with pytest.raises(DeprecationWarning, match="ServerState is deprecated"):
        _ = module.ServerState


def test_a_redis_deprecation_is_an_error() -> None:
    with pytest.raises(DeprecationWarning, match="auto_close_connection_pool"):
        Redis.from_url("redis://127.0.0.1:6379/0", auto_close_connection_pool=True)


def test_a_deprecation_met_by_the_projects_code_is_an_error() -> None:
    with pytest.raises(PendingDeprecationWarning):
        warnings.warn("met by the tests' own code", PendingDeprecationWarning, stacklevel=1)


def test_another_librarys_deprecation_is_shown_not_raised() -> None:
    with pytest.warns(DeprecationWarning):
        warnings.warn_explicit("elsewhere", DeprecationWarning, "other.py", 1, module="other")
