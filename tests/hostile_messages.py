"""Hypothesis strategies for hostile messages: JSON of random shape, every extreme an edge has a
limit for (nesting depth, element count, size in UTF-8 bytes, each just under, at and over),
wrong and unknown types, NaN and 1e999, unpaired surrogates, binary frames, text that is not
UTF-8, and REST requests with random methods, bodies and content types.

Large documents are built from a few drawn numbers rather than drawn character by character, so
that a 128 KiB frame costs hypothesis nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from hypothesis import strategies as st

FrameKind = Literal["text", "binary", "raw_text"]  # raw_text: bytes in a text frame, UTF-8 or not


@dataclass(frozen=True)
class Frame:
    """One message as it goes on the wire, and how it was made (for the failure report)."""

    data: str | bytes
    kind: FrameKind
    how: str

    @property
    def size(self) -> int:
        return len(
            self.data.encode("utf-8", "surrogatepass") if isinstance(self.data, str) else self.data
        )

    def __repr__(self) -> str:
        data = self.data if len(self.data) <= 120 else self.data[:100]
        more = f" ... ({self.size} bytes)" if len(self.data) > 120 else ""
        return f"Frame({self.how}, {self.kind}, {data!r}{more})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))  # hypothesis prints a failing round with this: short


@dataclass(frozen=True)
class Edge:
    """What an edge's messages look like, and its limits."""

    types: tuple[str, ...]
    fields: dict[str, st.SearchStrategy[Any]]
    max_bytes: int
    max_depth: int
    max_items: int
    envelope: dict[str, Any] = field(default_factory=dict)  # {"v": 1} on the sockets
    sizes: tuple[int, ...] = ()  # byte sizes worth sending besides the limit's neighbours

    def boundary_sizes(self) -> list[int]:
        return [self.max_bytes - 1, self.max_bytes, self.max_bytes + 1, *self.sizes]


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=15,
)
# each a JSON string of its width in UTF-8: the byte size and the character count differ
WIDE_CHARS = ("a", "é", "한", "😀")


def nested(depth: int, kind: str) -> str:
    """`depth` levels of arrays or objects around a 0."""
    if kind == "[":
        return "[" * depth + "0" + "]" * depth
    return '{"a":' * depth + "0" + "}" * depth


def wide(count: int) -> str:
    """An array of `count` elements: `count` items to the reader (the array and its commas)."""
    return "[" + ",".join("0" * count) + "]"


def padded(doc: dict[str, Any], size: int, char: str) -> str:
    """`doc` with a `pad` string making it `size` bytes of UTF-8 (or the nearest above)."""
    base = len(json.dumps({**doc, "pad": ""}, ensure_ascii=False).encode())
    room = max(size - base, 0)
    width = len(char.encode())
    pad = char * (room // width) + "a" * (room % width)
    return json.dumps({**doc, "pad": pad}, ensure_ascii=False)


@st.composite
def documents(draw: st.DrawFn, edge: Edge) -> dict[str, Any]:
    """A JSON object shaped like the edge's messages: a known type or not, known fields with
    plausible values or values of any type, maybe unknown fields."""
    doc: dict[str, Any] = {}
    for key, value in edge.envelope.items():
        choice = draw(st.sampled_from(["keep", "keep", "keep", "drop", "wrong"]))
        if choice == "keep":
            doc[key] = value
        elif choice == "wrong":
            doc[key] = draw(st.sampled_from([2, 0, "1", None, 1.5, [1]]))
    doc["type"] = draw(st.sampled_from(edge.types) | st.sampled_from(["", "x", "Type"]) | scalars)
    for key in draw(st.lists(st.sampled_from(sorted(edge.fields)), max_size=5, unique=True)):
        doc[key] = (
            draw(edge.fields[key] | values) if draw(st.booleans()) else draw(edge.fields[key])
        )
    if draw(st.booleans()):
        doc.update(draw(st.dictionaries(st.text(max_size=8), values, max_size=2)))
    return doc


def _text(how: str, data: str) -> Frame:
    return Frame(data, "text", how)


@st.composite
def frames(draw: st.DrawFn, edge: Edge) -> Frame:
    """One hostile message for `edge`."""
    how = draw(
        st.sampled_from(
            ["message"] * 6
            + ["deep", "deep", "wide", "sized", "sized", "scalar", "text", "binary"]
            + ["not_utf8", "constant", "surrogate", "escapes"]
        )
    )
    envelope = {**edge.envelope, "type": draw(st.sampled_from(edge.types))}
    if how == "message":
        return _text(how, json.dumps(draw(documents(edge))))
    if how == "deep":
        depth = draw(
            st.sampled_from(
                [edge.max_depth - 1, edge.max_depth, edge.max_depth + 1, 100, 1000, 5000]
            )
        )
        inner = nested(depth, draw(st.sampled_from(["[", "{"])))
        if draw(st.booleans()):  # bare, or inside a message (one level more)
            return _text(f"deep {depth}", inner)
        return _text(f"deep {depth}+1", json.dumps(envelope)[:-1] + ', "x": ' + inner + "}")
    if how == "wide":
        count = draw(
            st.sampled_from(
                [edge.max_items - 1, edge.max_items, edge.max_items + 1, 10 * edge.max_items]
            )
        )
        return _text(f"wide {count}", wide(count))
    if how == "sized":
        size = draw(st.sampled_from(edge.boundary_sizes()))
        char = draw(st.sampled_from(WIDE_CHARS))
        return _text(f"sized {size} {char}", padded(envelope, size, char))
    if how == "scalar":
        return _text(how, json.dumps(draw(values)))
    if how == "text":
        return _text(how, draw(st.text(max_size=200)))
    if how == "binary":
        data = draw(st.binary(max_size=200) | st.just(json.dumps(envelope).encode()))
        return Frame(data, "binary", how)
    if how == "not_utf8":
        text = json.dumps(envelope).encode()
        bad = draw(
            st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"])
        )
        at = draw(st.integers(0, len(text)))
        return Frame(
            text[:at] + bad + text[at:], draw(st.sampled_from(["raw_text", "binary"])), how
        )
    if how == "constant":
        constant = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e400"]))
        return _text(f"constant {constant}", json.dumps(envelope)[:-1] + f', "x": {constant}}}')
    if how == "surrogate":
        escape = draw(st.sampled_from(["\\ud800", "\\udfff", "\\ud83d\\ude00", "\\udc00\\ud800"]))
        return _text(f"surrogate {escape}", json.dumps(envelope)[:-1] + f', "x": "{escape}"}}')
    # escapes: brackets, quotes and backslashes inside strings are no structure
    piece = draw(st.sampled_from(['\\"[{', "\\\\", '[{\\"', "\\u005b", "]}"]))
    count = draw(st.sampled_from([10, 1000, edge.max_items + 1]))
    return _text(f"escapes {count}", json.dumps(envelope)[:-1] + f', "x": "{piece * count}"}}')


# -- REST ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    content_type: str | None
    body: bytes

    def __repr__(self) -> str:
        body = self.body if len(self.body) <= 100 else self.body[:80] + b"..."
        return f"Request({self.method} {self.path} {self.content_type!r} {body!r})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


HEX = "0123456789abcdef"
requirements = st.fixed_dictionaries(
    {},
    optional={
        "labels": st.lists(st.sampled_from(["gpu", "a", "-", ""]), max_size=3) | values,
        "region": st.sampled_from(["eu", "", "x" * 70]) | values,
        "codec": st.sampled_from(["H264", "VP8"]) | values,
        "resolution": st.sampled_from(["320x180", "99999x99999", "1x1", "x"]) | values,
    },
)


@st.composite
def requests(draw: st.DrawFn, max_body: int) -> Request:
    session = "".join(draw(st.lists(st.sampled_from(HEX), min_size=32, max_size=32)))
    routes = [
        ("POST", "/api/sessions"),
        ("GET", f"/api/sessions/{session}"),
        ("DELETE", f"/api/sessions/{session}"),
        ("GET", "/api/workers"),
    ]
    if draw(st.integers(0, 3)):  # mostly the API's routes, now and then anything
        method, path = draw(st.sampled_from(routes))
    else:
        method = draw(st.sampled_from(["GET", "POST", "DELETE", "PUT", "PATCH"]))
        path = draw(
            st.sampled_from([r[1] for r in routes] + ["/api/sessions/x", "/api/openapi.json"])
        )
    content_type = draw(
        st.sampled_from(
            [
                None,
                "application/json",
                "application/json; charset=utf-8",
                "application/json; charset=latin-1",
                "text/plain",
                "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=xyz",
                "application/octet-stream",
                "x" * 300,
            ]
        )
    )
    how = draw(
        st.sampled_from(
            ["empty", "object", "object", "json", "deep", "wide", "sized", "not_utf8", "raw"]
        )
    )
    if how == "empty":
        body = b""
    elif how == "object":
        body = json.dumps({"requirements": draw(requirements | values)}).encode()
    elif how == "json":
        body = json.dumps(draw(values)).encode()
    elif how == "deep":
        body = nested(
            draw(st.sampled_from([32, 33, 1000, 2000])), draw(st.sampled_from(["[", "{"]))
        ).encode()
    elif how == "wide":
        body = wide(draw(st.sampled_from([100, 2000, 5000]))).encode()
    elif how == "sized":
        size = draw(st.sampled_from([max_body - 1, max_body, max_body + 1, 70_000]))
        body = padded({"requirements": {}}, size, draw(st.sampled_from(WIDE_CHARS))).encode()
    elif how == "not_utf8":
        body = b'{"requirements": "\xff\xfe"}'
    else:
        body = draw(st.binary(max_size=300))
    return Request(method, path, content_type, body)
