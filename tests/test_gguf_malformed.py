"""Malformed and hostile GGUF files: each must raise muser.GGUFError naming the
file and the byte offset -- never crash, hang or allocate without bound.

Files are built by hand (struct.pack) so each field can be corrupted on its
own. Opens run in a subprocess so a segfault or abort is a test failure, not
a dead test run; the child prints a START line before each open so a crash is
attributed to the file that caused it.
"""
from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
import textwrap

import pytest

import muser

# ---------------------------------------------------------------- a GGUF builder

# value type ids
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
F32_T, Q8_0_T, Q5_K_T = 0, 8, 13  # ggml tensor type ids


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return u64(len(b)) + b


def header(n_tensors, n_kv, version=3, magic=b"GGUF"):
    return magic + u32(version) + u64(n_tensors) + u64(n_kv)


def kv(key, vtype, payload):
    return gstr(key) + u32(vtype) + payload


def tensor_info(name, dims, ttype, offset, n_dims=None):
    n = len(dims) if n_dims is None else n_dims
    return gstr(name) + u32(n) + b"".join(u64(d) for d in dims) + u32(ttype) + u64(offset)


def gguf_file(kvs=(), infos=(), data=b"", alignment=32, n_kv=None, n_tensors=None, version=3, magic=b"GGUF"):
    """A file from encoded kvs and tensor infos; counts default to the real ones."""
    body = header(len(infos) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv,
                  version, magic)
    body += b"".join(kvs) + b"".join(infos)
    body += b"\0" * (-len(body) % alignment)
    return body + data


def valid_file():
    kvs = [
        kv("general.architecture", STR, gstr("gemma3")),
        kv("gemma3.embedding_length", U32, u32(32)),
        kv("tokenizer.ggml.tokens", ARR, u32(STR) + u64(3) + gstr("<pad>") + gstr("") + gstr("hi")),
        kv("nested", ARR, u32(ARR) + u64(2) + u32(I16) + u64(1) + struct.pack("<h", -3) + u32(U8) + u64(0)),
        kv("flag", BOOL, b"\x01"),
    ]
    infos = [tensor_info("a", [32, 2], F32_T, 0), tensor_info("b", [64], Q8_0_T, 256)]
    data = bytes(range(256)) + bytes(68)
    return gguf_file(kvs, infos, data)


# ---------------------------------------------------------------- the cases

def one_tensor(dims, ttype=F32_T, offset=0, name="t", n_dims=None, data_bytes=4096, kvs=(), alignment=32):
    return gguf_file(list(kvs), [tensor_info(name, dims, ttype, offset, n_dims)], bytes(data_bytes),
                     alignment=alignment)


def nested(depth):
    payload = b"".join(u32(ARR) + u64(1) for _ in range(depth)) + u32(U8) + u64(0)
    return gguf_file([kv("deep", ARR, payload)])


VALID = valid_file()

# name -> (bytes, a phrase the message must contain)
CASES = {
    "bad_magic": (gguf_file(magic=b"GGML"), "bad magic"),
    "empty": (b"", "truncated"),
    "three_bytes": (b"GGU", "truncated"),
    "version_1": (gguf_file(version=1), "unsupported version 1"),
    "version_4": (gguf_file(version=4), "unsupported version 4"),
    "big_endian": (gguf_file(version=0x03000000), "big-endian"),
    "truncated_header": (header(0, 0)[:13], "truncated"),
    "kv_count_huge": (header(0, 2**32 - 1) + bytes(120), "metadata count 4294967295 needs at least"),
    "tensor_count_huge": (header(2**63, 0) + bytes(64), "tensor count"),
    "kv_count_too_big_for_data": (header(0, 2) + kv("a", U8, b"\1"), "metadata count 2 needs at least"),
    "key_truncated": (header(0, 1) + u64(20) + b"abcdef", "truncated: metadata key of length 20"),
    "key_length_huge": (header(0, 1) + u64(2**64 - 1) + bytes(16), "truncated"),
    "key_empty": (gguf_file([kv("", U8, b"\1")]), "is empty"),
    "key_bad_utf8": (gguf_file([kv(b"ab\xff", U8, b"\1")]), "not valid UTF-8"),
    "key_overlong_utf8": (gguf_file([kv(b"\xc0\xaf", U8, b"\1")]), "not valid UTF-8"),
    "key_duplicate": (gguf_file([kv("k", U8, b"\1"), kv("k", U8, b"\2")]), "duplicate metadata key 'k'"),
    "value_type_unknown": (gguf_file([kv("k", 13, u64(0))]), "unknown value type 13"),
    "value_truncated_u64": (header(0, 1) + kv("k", U64, b"\1\2\3"), "truncated"),
    "value_string_too_long": (header(0, 1) + kv("k", STR, u64(1000) + b"short"), "truncated"),
    "value_string_bad_utf8": (gguf_file([kv("general.architecture", STR, gstr(b"gem\xed\xa0\x80"))]),
                              "not valid UTF-8"),
    "value_bool_2": (gguf_file([kv("k", BOOL, b"\x02")]), "expected 0 or 1"),
    "array_count_huge": (gguf_file([kv("k", ARR, u32(U32) + u64(2**62))]), "element count 4611686018427387904"),
    "array_string_count_huge": (gguf_file([kv("k", ARR, u32(STR) + u64(2**40))]), "needs at least"),
    "array_string_element_truncated": (header(0, 1) + kv("k", ARR, u32(STR) + u64(2) + gstr("ok") + u64(50) + b"x"),
                                       "'k'[1] of length 50"),
    "array_element_type_unknown": (gguf_file([kv("k", ARR, u32(99) + u64(0))]), "unknown element type 99"),
    "array_bool_element_7": (gguf_file([kv("k", ARR, u32(BOOL) + u64(2) + b"\x01\x07")]), "'k'[1] is a BOOL"),
    "arrays_nested_too_deep": (nested(8), "deeper than 8"),  # 9 levels; 8 open (test below)
    "arrays_nested_without_bound": (nested(10_000), "deeper than 8"),
    "alignment_not_power_of_two": (gguf_file([kv("general.alignment", U32, u32(48))]), "bad alignment"),
    "alignment_zero": (gguf_file([kv("general.alignment", U32, u32(0))]), "bad alignment"),
    "alignment_wrong_type": (gguf_file([kv("general.alignment", U64, u64(32))]), "bad alignment"),
    "tensor_info_truncated": (header(1, 0) + gstr("tensor.name.long") + u32(2) + u64(4),
                              "truncated: tensor dimension"),
    "tensor_name_empty": (one_tensor([4], name=""), "empty name"),
    "tensor_name_bad_utf8": (one_tensor([4], name=b"w\x80"), "not valid UTF-8"),
    "tensor_name_duplicate": (gguf_file([], [tensor_info("w", [4], F32_T, 0), tensor_info("w", [4], F32_T, 32)],
                                        bytes(64)), "duplicate tensor name 'w'"),
    "tensor_n_dims_0": (one_tensor([], n_dims=0), "has 0 dimensions"),
    "tensor_n_dims_5": (one_tensor([1, 1, 1, 1, 1]), "has 5 dimensions"),
    "tensor_n_dims_huge": (header(1, 0) + gstr("t") + u32(2**31) + bytes(64), "dimensions"),
    "tensor_dim_zero": (one_tensor([4, 0]), "dimension 1 is 0"),
    "tensor_dim_negative": (one_tensor([2**64 - 2]), "expected 1 to 2^63-1"),
    "tensor_elements_overflow": (one_tensor([2**32, 2**32]), "overflows int64"),
    "tensor_bytes_overflow": (one_tensor([2**62], ttype=28), "overflows 64 bits"),  # F64: 2^62 x 8 bytes
    "tensor_type_unknown": (one_tensor([4], ttype=4), "unknown ggml type id 4"),
    "tensor_type_huge": (one_tensor([4], ttype=2**31), "unknown ggml type id"),
    "tensor_q5k_row_not_256": (one_tensor([100, 2], ttype=Q5_K_T), "not a multiple of the Q5_K block size 256"),
    "tensor_q8_0_row_not_32": (one_tensor([33], ttype=Q8_0_T), "not a multiple of the Q8_0 block size 32"),
    "tensor_offset_misaligned": (one_tensor([4], offset=4), "not a multiple of the alignment 32"),
    "tensor_offset_misaligned_64": (one_tensor([4], offset=32, kvs=[kv("general.alignment", U32, u32(64))],
                                               alignment=64), "not a multiple of the alignment 64"),
    "tensor_data_truncated": (VALID[:-1], "lies outside the file"),
    "tensor_data_past_end": (one_tensor([4096]), "lies outside the file"),
    "tensor_offset_huge": (one_tensor([4], offset=2**64 - 32), "lies outside the file"),
}


# The child: opens each file in argv order, prints one JSON line per file.
CHILD = textwrap.dedent(
    """
    import json, sys, muser
    for path in sys.argv[1:]:
        print("START " + path, flush=True)
        try:
            f = muser.GGUFFile(path)
            # a file that opens must also read: every value and every tensor byte
            for k in f.keys():
                f[k]
            total = sum(int(f.tensor_bytes(t.name).sum()) for t in f.tensors)
            out = {"path": path, "result": "ok"}
        except muser.GGUFError as e:
            out = {"path": path, "result": "GGUFError", "message": str(e)}
        except BaseException as e:
            out = {"path": path, "result": type(e).__name__, "message": str(e)}
        print(json.dumps(out), flush=True)
    """
)


def open_in_child(paths, timeout=60):
    """{path: result dict} for files opened in one subprocess; a crash or hang fails
    the test naming the file being opened."""
    proc = subprocess.run([sys.executable, "-c", CHILD, *map(str, paths)], capture_output=True, text=True,
                          timeout=timeout)
    results, current = {}, None
    for line in proc.stdout.splitlines():
        if line.startswith("START "):
            current = line[6:]
        else:
            r = json.loads(line)
            results[r["path"]] = r
            current = None
    assert proc.returncode == 0 and current is None, (
        f"child died with status {proc.returncode} while opening {current}\n{proc.stderr[-2000:]}"
    )
    return results


def write_all(directory, named_bytes):
    paths = {}
    for name, data in named_bytes.items():
        paths[name] = directory / f"{name}.gguf"
        paths[name].write_bytes(data)
    return paths


# ---------------------------------------------------------------- tests

def test_the_valid_base_file_opens(tmp_path):
    path = tmp_path / "valid.gguf"
    path.write_bytes(VALID)
    f = muser.GGUFFile(path)
    assert f["general.architecture"] == "gemma3"
    assert f["tokenizer.ggml.tokens"] == ["<pad>", "", "hi"]
    assert f["nested"] == [[-3], []]
    assert f["flag"] is True
    assert [t.name for t in f.tensors] == ["a", "b"]
    assert f.tensor("b").offset + f.tensor("b").nbytes == f.file_size


def test_malformed_files_raise_gguf_error(tmp_path):
    assert len(CASES) >= 25
    paths = write_all(tmp_path, {name: data for name, (data, _) in CASES.items()})
    results = open_in_child(paths.values())
    failures = []
    for name, (_, phrase) in CASES.items():
        r = results[str(paths[name])]
        msg = r.get("message", "")
        if r["result"] != "GGUFError":
            failures.append(f"{name}: {r['result']} {msg}")
        elif f"{name}.gguf" not in msg or "byte" not in msg or phrase not in msg:
            failures.append(f"{name}: message lacks the file name, 'byte' or {phrase!r}: {msg}")
    assert not failures, "\n".join(failures)


def test_message_format(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(CASES["kv_count_huge"][0])
    with pytest.raises(muser.GGUFError) as e:
        muser.GGUFFile(path)
    assert str(e.value) == (
        f"{path}: at byte 16: metadata count 4294967295 needs at least 60129542130 bytes but only 120 remain"
    )


def test_arrays_nested_eight_levels_open(tmp_path):
    path = tmp_path / "deep8.gguf"
    path.write_bytes(nested(7))  # 7 arrays of one array, then an empty UINT8 array: 8 levels
    value = muser.GGUFFile(path)["deep"]
    for _ in range(7):
        assert isinstance(value, list) and len(value) == 1
        value = value[0]
    assert value == []
    assert muser.GGUFFile(path).value_type("deep") == "ARRAY[ARRAY]"


def test_invalid_utf8_in_string_array_is_replaced(tmp_path):
    # Array elements are not validated at open (a vocabulary is large); they
    # decode with U+FFFD instead.
    path = tmp_path / "vocab.gguf"
    path.write_bytes(gguf_file([kv("tokenizer.ggml.tokens", ARR, u32(STR) + u64(2) + gstr(b"ok") + gstr(b"a\xffb"))]))
    assert muser.GGUFFile(path)["tokenizer.ggml.tokens"] == ["ok", "a\ufffdb"]


def test_truncation_at_every_byte(tmp_path):
    # Every prefix cuts into the header, the tables or the last tensor (which
    # ends at the last byte), so every one must be rejected cleanly.
    variants = {f"cut_{n:05d}": VALID[:n] for n in range(len(VALID))}
    paths = write_all(tmp_path, variants)
    results = open_in_child(paths.values())
    bad = {name: results[str(p)] for name, p in paths.items() if results[str(p)]["result"] != "GGUFError"}
    assert not bad, list(bad.items())[:5]


def test_random_byte_flips_never_crash(tmp_path):
    # Flipped bytes may leave a valid file (a changed tensor byte) or make a
    # malformed one; either way the open must end in success or GGUFError.
    rng = random.Random(20240607)
    variants = {}
    for i in range(400):
        data = bytearray(VALID)
        for _ in range(rng.choice([1, 1, 2, 4, 8])):
            pos = rng.randrange(len(data))
            data[pos] = rng.choice([data[pos] ^ (1 << rng.randrange(8)), rng.randrange(256), 0xFF, 0x00])
        variants[f"flip_{i:03d}"] = bytes(data)
    paths = write_all(tmp_path, variants)
    results = open_in_child(paths.values())
    outcomes = [results[str(p)]["result"] for p in paths.values()]
    unexpected = [(n, results[str(p)]) for n, p in paths.items() if results[str(p)]["result"] not in ("ok", "GGUFError")]
    assert not unexpected, unexpected[:5]
    # the sample really exercises both outcomes
    assert outcomes.count("GGUFError") > 50 and outcomes.count("ok") > 10
