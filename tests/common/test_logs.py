"""JSON log lines that survive quotes, newlines and tracebacks, with the request id on them."""

from __future__ import annotations

import json
import logging

from strata.common.logs import REQUEST_ID, JsonFormatter
from strata.common.openai.request_id import request_id


def record(msg: str, *args: object, exc: bool = False, **extra: object) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError('bad "value"\nsecond line')
        except ValueError:
            import sys

            exc_info = sys.exc_info()
    rec = logging.LogRecord("strata.test", logging.ERROR, __file__, 1, msg, args, exc_info)
    rec.__dict__.update(extra)
    return rec


def test_quotes_newlines_and_tracebacks_stay_one_json_line() -> None:
    line = JsonFormatter().format(record('said "%s"\nthen left', "hi", exc=True, tokens=3))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["msg"] == 'said "hi"\nthen left' and entry["level"] == "ERROR"
    assert entry["tokens"] == 3 and entry["logger"] == "strata.test"
    assert 'ValueError: bad "value"' in entry["exc"] and "Traceback" in entry["exc"]


def test_request_id_from_the_context() -> None:
    token = REQUEST_ID.set("req-1")
    try:
        assert json.loads(JsonFormatter().format(record("x")))["request_id"] == "req-1"
    finally:
        REQUEST_ID.reset(token)
    assert "request_id" not in json.loads(JsonFormatter().format(record("x")))


def test_request_id_header_is_kept_when_well_formed() -> None:
    assert request_id({"X-Request-Id": "abc-1.2:3"}) == "abc-1.2:3"
    for forged in ("", 'a" "b', "x" * 129, "a\nb"):
        fresh = request_id({"X-Request-Id": forged})
        assert fresh != forged and len(fresh) == 32
    assert request_id({}) != request_id({})


def test_sidecar_messages_carry_the_request_id_into_its_log_context() -> None:
    from strata.worker.kvtier import protocol, server

    seen: list[str | None] = []
    handlers = dict(server._HANDLERS)

    def probe(service: object, owner: object, request: object) -> dict[str, object]:
        seen.append(REQUEST_ID.get())
        return {}

    server._HANDLERS["probe"] = probe
    try:
        token = REQUEST_ID.set("req-7")
        try:
            message = protocol.tagged({"op": "probe"})
        finally:
            REQUEST_ID.reset(token)
        assert message == {"op": "probe", "request_id": "req-7"}
        assert protocol.tagged({"op": "probe"}) == {"op": "probe"}  # outside a request: no field
        assert server.handle(None, None, message)["ok"]  # type: ignore[arg-type]
        assert server.handle(None, None, {"op": "probe"})["ok"]  # type: ignore[arg-type]
    finally:
        server._HANDLERS.clear()
        server._HANDLERS.update(handlers)
    assert seen == ["req-7", None] and REQUEST_ID.get() is None


def test_setup_writes_to_stderr_as_it_is_when_a_line_is_logged(monkeypatch) -> None:
    """A stderr replaced and closed after set-up (as pytest does with each test's capture) must
    not turn every later line, from any thread, into a logging error."""
    import io
    import sys

    from strata.common import logs

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logs.setup("INFO")
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    errors: list[object] = []
    monkeypatch.setattr(root.handlers[0], "handleError", errors.append)
    logging.getLogger("strata.test").info("after the swap")
    assert not errors
    assert json.loads(second.getvalue())["msg"] == "after the swap"
