"""The API key at the door: a caller without it, or with a wrong one, gets a 401 in OpenAI's error
shape from the router and from the worker alike (the same middleware); a key set but blank
refuses to start rather than leave the API open."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from strata.common.openai.auth import api_key_check, api_key_from

KEY = "sk-tenant-a-3f9c"


async def ok(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": []})


def app() -> web.Application:
    application = web.Application(middlewares=[api_key_check(KEY)])
    application.router.add_get("/v1/models", ok)
    application.router.add_get("/health", ok)
    return application


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {KEY[:-1]}"},
        {"Authorization": f"Bearer {KEY}x"},
        {"Authorization": KEY},  # no scheme
        {"Authorization": f"Basic {KEY}"},
        {"X-Api-Key": KEY},
    ],
)
async def test_a_caller_without_the_key_gets_an_openai_style_401(headers: dict[str, str]) -> None:
    async with TestClient(TestServer(app())) as client:
        reply = await client.get("/v1/models", headers=headers)
        assert reply.status == 401
        error = (await reply.json())["error"]
        assert error["type"] == "authentication_error" and "API key" in error["message"]
        assert KEY not in await reply.text()  # the answer never echoes the key


async def test_the_key_opens_the_api_and_probes_need_none() -> None:
    async with TestClient(TestServer(app())) as client:
        assert (await client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})).status == 200
        assert (await client.get("/health")).status == 200


def test_the_key_comes_from_the_environment_and_blank_is_refused() -> None:
    assert api_key_from({}) is None
    assert api_key_from({"STRATA_API_KEY": f"{KEY}\n"}) == KEY  # a Secret made from a file
    for blank in ("", " ", "\n"):
        with pytest.raises(ValueError, match="STRATA_API_KEY is set but empty"):
            api_key_from({"STRATA_API_KEY": blank})
