"""Writes the seed corpora of the libFuzzer harnesses (run from the repo root:
PYTHONPATH=python python tests/fuzz/make_corpus.py)."""

import gzip
import os
import zlib

import numpy as np
from sparkgrad.data import encode_example, encode_sequence_example
from sparkgrad.data.tfrecord import write_records

HERE = os.path.dirname(os.path.abspath(__file__))


def frames(records):
    path = os.path.join(HERE, ".tmp.tfrecord")
    write_records(path, records)
    data = open(path, "rb").read()
    os.remove(path)
    return data


examples = {
    "every_kind": encode_example(
        {
            "i": np.array([1, -2], dtype=np.int64),
            "f": [0.5],
            "b": [b"x"],
            "v": [1, 2, 3],
            "w": [b"a", b""],
            "r": bytes([1, 2, 3, 4]),
        }
    ),
    "empty": encode_example({}),
    "empty_lists": encode_example({"v": ("int64", []), "w": ("bytes", []), "f": ("float", [])}),
    "sequence": encode_sequence_example({"c": 1}, {"s": [[1], [2, 3]], "t": [[b"x"]]}),
}
for name, data in examples.items():
    open(os.path.join(HERE, "corpus/fuzz_example", name), "wb").write(data)

plain = frames(list(examples.values()))
for name, data in {
    "plain": plain,
    "zero_length": frames([b"", b""]),
    "zlib": zlib.compress(plain),
    "gzip": gzip.compress(plain) + gzip.compress(frames([b"more"])),
    "truncated": plain[:-3],
}.items():
    open(os.path.join(HERE, "corpus/fuzz_tfrecord", name), "wb").write(data)

# fuzz_rest_reply: byte 0 splits a header block from an error body.
rest_replies = {
    "error_body": (
        b"Content-Type: application/json\r\n",
        b'{"error_code":"RESOURCE_DOES_NOT_EXIST","message":"Path (/x) doesn\'t exist."}',
    ),
    "rate_limited": (
        b"Retry-After: 7\r\nContent-Type: application/json\r\n",
        b'{"error_code":"TOO_MANY_REQUESTS","message":"slow down"}',
    ),
    "oauth_error": (
        b"retry-after:  Wed, 21 Oct 2015 07:28:00 GMT\r\n",
        b'{"error":"invalid_client","error_description":"Client authentication failed"}',
    ),
    "html_proxy": (b"Server: nginx\r\n", b"<html><body>502 Bad Gateway</body></html>"),
    "nested_unicode": (
        b"Retry-After: 0\r\n",
        b'{"error_code":"X","message":"\\u00e9\\n\\u0000 bad","details":[{"a":[1,2,{"b":null}]}]}',
    ),
}
for name, (head, body) in rest_replies.items():
    total = len(head) + len(body)
    split_byte = next(k for k in range(256) if k * total // 255 >= len(head))
    open(os.path.join(HERE, "corpus/fuzz_rest_reply", name), "wb").write(bytes([split_byte]) + head + body)

# fuzz_inflate: compressed streams only (levels, stored blocks, members).
os.makedirs(os.path.join(HERE, "corpus/fuzz_inflate"), exist_ok=True)
for name, data in {
    "zlib": zlib.compress(plain),
    "gzip": gzip.compress(plain) + gzip.compress(frames([b"more"])),
    "gzip_level9_members": gzip.compress(plain, 9) + gzip.compress(plain[:40], 1),
    "zlib_stored": zlib.compress(plain, 0),
    "gzip_stored": gzip.compress(plain, 0),
}.items():
    open(os.path.join(HERE, "corpus/fuzz_inflate", name), "wb").write(data)

# the sparse gradient hook's table block (csrc/net/coll_rows.c) against tables [50, 3] and [20, 2]
os.makedirs(os.path.join(HERE, "corpus/fuzz_coll_rows"), exist_ok=True)
blocks = {
    "two_tables": [2, 50, 3, 3, 20, 2, 2, 1, 5, 49, 0, 19],
    "none_touched": [2, 50, 3, 0, 20, 2, 0],
    "every_row": [2, 50, 3, 0, 20, 2, 20, *range(20)],
    "unsorted": [2, 50, 3, 2, 20, 2, 0, 7, 3],
    "other_shape": [2, 50, 4, 0, 20, 2, 0],
}
for name, words in blocks.items():
    open(os.path.join(HERE, "corpus/fuzz_coll_rows", name), "wb").write(np.array(words, "<i4").tobytes())
