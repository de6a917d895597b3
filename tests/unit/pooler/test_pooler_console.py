"""The admin console's wire protocol, bytes in and out."""

from __future__ import annotations

import struct

from pg_operator.pooler.console import (
    Result,
    collect,
    encode_query,
    encode_startup,
    parse_data_row,
    parse_error,
    parse_row_description,
    split_messages,
)


def message(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("!I", len(payload) + 4) + payload


def row_description(*names: str) -> bytes:
    body = struct.pack("!H", len(names))
    for n in names:
        body += n.encode() + b"\0" + b"\0" * 18
    return message(b"T", body)


def data_row(*values: str | None) -> bytes:
    body = struct.pack("!H", len(values))
    for v in values:
        body += struct.pack("!i", -1) if v is None else struct.pack("!i", len(v.encode())) + v.encode()
    return message(b"D", body)


def test_startup_and_query_encoding() -> None:
    startup = encode_startup("pgbouncer", "pgbouncer")
    assert struct.unpack("!I", startup[:4])[0] == len(startup)
    assert struct.unpack("!I", startup[4:8])[0] == 196608
    assert startup[8:] == b"user\0pgbouncer\0database\0pgbouncer\0\0"
    assert encode_query("PAUSE") == b"Q\0\0\0\x0aPAUSE\0"


def test_split_keeps_a_partial_message_for_later() -> None:
    whole = message(b"C", b"PAUSE\0")
    messages, rest = split_messages(whole + whole[:3])
    assert messages == [(b"C", b"PAUSE\0")]
    assert rest == whole[:3]


def test_rows_of_a_show_command() -> None:
    stream = (
        row_description("database", "cl_active", "host")
        + data_row("app", "3", None)
        + data_row("pgbouncer", "1", None)
        + message(b"C", b"SHOW\0")
        + message(b"Z", b"I")
    )
    messages, rest = split_messages(stream)
    result, columns = Result(), list[str]()
    assert collect(messages, result, columns) is True
    assert rest == b""
    assert result.rows == [
        {"database": "app", "cl_active": "3", "host": None},
        {"database": "pgbouncer", "cl_active": "1", "host": None},
    ]
    assert result.command == "SHOW"


def test_an_error_is_its_message() -> None:
    payload = b"SERROR\0C08P01\0Minvalid command 'SHOW STATE', use SHOW HELP;\0\0"
    assert parse_error(payload) == "invalid command 'SHOW STATE', use SHOW HELP;"
    result = Result()
    assert collect([(b"E", payload), (b"Z", b"I")], result, []) is True
    assert result.error is not None and "SHOW STATE" in result.error


def test_row_parsers() -> None:
    assert parse_row_description(row_description("a", "bb")[5:]) == ["a", "bb"]
    assert parse_data_row(data_row("x", None, "")[5:]) == ["x", None, ""]
