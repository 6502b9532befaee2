"""``json_value`` is ``json.loads``: the same value (types, key order, float bits) or the same refusal.

The fast decoder answers only what it accepts; everything else must reach ``json.loads``. Generated JSON (every
value type, any Unicode, escaped or not, any whitespace), hand-picked number spellings, and the inputs only
``json`` takes are compared with ``json.loads`` itself.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc.errors import BadRequest
from extproc.prompt.openai import RequestKind, json_value, parse_request


def same(a: Any, b: Any) -> bool:
    """Equal as ``json.loads`` results can differ: type, dict key order, float bits (-0.0, NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def outcome(decode: Any, raw: bytes) -> tuple[str, Any]:
    try:
        return "value", decode(raw)
    except (ValueError, RecursionError) as exc:  # json's errors (JSONDecodeError, UnicodeDecodeError, digits)
        return "error", type(exc)


def assert_same_as_json(raw: bytes) -> None:
    ours, theirs = outcome(json_value, raw), outcome(json.loads, raw)
    assert ours[0] == theirs[0], (raw[:80], ours, theirs)
    if ours[0] == "value":
        assert same(ours[1], theirs[1]), (raw[:80], ours[1], theirs[1])
    else:
        assert ours[1] is theirs[1], (raw[:80], ours[1], theirs[1])


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()  # any code point: escapes, astral planes, controls (json.dumps escapes what it must)
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(value=_values, ensure_ascii=st.booleans(), indent=st.sampled_from([None, 0, 2, "\t"]))
def test_generated_json_decodes_as_json_does(value: Any, ensure_ascii: bool, indent: Any) -> None:
    text = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)
    raw = text.encode("utf-8", "surrogatepass")  # st.text() may hold lone surrogates: bytes json refuses
    assert_same_as_json(raw)


@settings(max_examples=300, deadline=None)
@given(
    sign=st.sampled_from(["", "-"]),
    whole=st.from_regex(r"\A(0|[1-9][0-9]{0,25})\Z"),
    frac=st.from_regex(r"\A[0-9]{0,40}\Z"),
    exp=st.sampled_from(["", "e", "E", "e+", "e-", "E-"]),
    power=st.integers(min_value=0, max_value=400),
)
def test_number_spellings_decode_as_json_does(sign: str, whole: str, frac: str, exp: str, power: int) -> None:
    number = sign + whole + (f".{frac}" if frac else "") + (f"{exp}{power}" if exp else "")
    assert_same_as_json(b'{"n": ' + number.encode() + b"}")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40) | st.text(alphabet='{}[]",:\\ u0123456789abcdefnrtlsNIa-+.eE\ud800é', max_size=40)
       .map(lambda t: t.encode("utf-8", "surrogatepass")))  # fmt: skip
def test_arbitrary_bytes_decode_or_fail_as_json_does(raw: bytes) -> None:
    assert_same_as_json(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": NaN, "b": -Infinity}',  # json extensions the strict decoder refuses
        b'{"a": "\\ud800"}',  # a lone surrogate escape: json keeps it
        b'{"a": "\\udc00\\ud800"}',
        b'\xef\xbb\xbf{"a": 1}',  # a UTF-8 byte order mark
        '{"a": "é"}'.encode("utf-16"),  # UTF-16 with a BOM, detected by json
        '{"a": "é"}'.encode("utf-32-le"),
        b'{"a": 1e400, "b": -1e400}',  # past a double: inf in json
        b'{"a": 1, "a": 2, "b": 3}',  # duplicate keys: the last value, the first position
        b'{"a": ' + b"9" * 4000 + b"}",  # a long integer json still takes
        b'{"a": ' + b"9" * 5000 + b"}",  # past json's digit limit: ValueError
        b"[" * 3000 + b"]" * 3000,  # deeper than either recursion allows
        b'{"a": "\xff"}',  # not UTF-8
        b'{"a": 1} x',
        b"",
        b' \n\t{"a" : [ 1 , 2.5e-3 , -0 , -0.0 , 5e-324 , 1.7976931348623157e308 ] } \n',
    ],
)
def test_edge_inputs_decode_or_fail_as_json_does(raw: bytes) -> None:
    assert_same_as_json(raw)


def test_nan_survives_a_request_parse() -> None:
    """A body only json takes is parsed as before, through the fallback."""
    parsed = parse_request(b'{"model": "m", "prompt": "hi", "temperature": NaN}', None, RequestKind.COMPLETION)
    assert parsed.model == "m"
    assert math.isnan(json_value(b'{"temperature": NaN}')["temperature"])  # the fallback's value, not a refusal


def test_refusals_keep_their_message() -> None:
    with pytest.raises(BadRequest, match="not valid JSON"):
        parse_request(b'{"model": "m", "prompt": "hi"', None, RequestKind.COMPLETION)
    with pytest.raises(BadRequest, match="nested deeper"):
        parse_request(b'{"model": "m", "prompt": ' + b"[" * 3000 + b"]" * 3000 + b"}", None, RequestKind.COMPLETION)
