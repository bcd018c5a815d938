// The GGUF reader on small files built byte by byte in a temp dir: a valid
// file read back field by field, then malformed ones that must each throw
// GGUFError naming the path and the byte offset.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "errors.h"
#include "gguf.h"
#include "gguf_bytes.h"

namespace {

using muser::GGUFError;
using muser::GGUFFile;
using muser::GGUFType;

using muser_test::Bytes;

class GGUFReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/muser_gguf_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const auto& p : written_) std::remove(p.c_str());
    rmdir(dir_.c_str());
  }
  std::string write(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    written_.push_back(path);
    return path;
  }
  // Header + the given KV and tensor table bytes (counts as given).
  static Bytes header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    Bytes h;
    h.b = {'G', 'G', 'U', 'F'};
    h.put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
    return h;
  }
  // A valid file: 4 KVs (one a string array, one nested), two tensors.
  static Bytes valid_file() {
    Bytes f = header(2, 5);
    f.kv_header("general.architecture", GGUFType::STRING).str("gemma3");
    f.kv_header("gemma3.embedding_length", GGUFType::UINT32).put<uint32_t>(64);
    f.kv_header("gemma3.attention.layer_norm_rms_epsilon", GGUFType::FLOAT32).put<float>(1e-6f);
    f.kv_header("tokenizer.ggml.tokens", GGUFType::ARRAY)
        .put<uint32_t>(static_cast<uint32_t>(GGUFType::STRING)).put<uint64_t>(3);
    f.str("<pad>").str("").str("hello");
    f.kv_header("nested", GGUFType::ARRAY).put<uint32_t>(static_cast<uint32_t>(GGUFType::ARRAY)).put<uint64_t>(2);
    f.put<uint32_t>(static_cast<uint32_t>(GGUFType::INT16)).put<uint64_t>(2).put<int16_t>(-5).put<int16_t>(7);
    f.put<uint32_t>(static_cast<uint32_t>(GGUFType::INT16)).put<uint64_t>(0);
    // tensor "a": F32 [3, 2] at 0; tensor "b": Q8_0 [64] at 32 (2 blocks x 34 bytes)
    f.str("a").put<uint32_t>(2).put<uint64_t>(3).put<uint64_t>(2).put<uint32_t>(0).put<uint64_t>(0);
    f.str("b").put<uint32_t>(1).put<uint64_t>(64).put<uint32_t>(8).put<uint64_t>(32);
    f.pad_to(32);
    for (int i = 0; i < 32 + 68; ++i) f.b.push_back(static_cast<uint8_t>(i));
    return f;
  }
  // Opening must throw GGUFError whose message names the file, a byte offset and `expect`.
  void expect_error(const std::string& name, const std::vector<uint8_t>& bytes, const std::string& expect) {
    const std::string path = write(name, bytes);
    try {
      GGUFFile::open(path);
      ADD_FAILURE() << name << ": opened without error";
    } catch (const GGUFError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find("at byte "), std::string::npos) << msg;
      EXPECT_NE(msg.find(expect), std::string::npos) << msg;
    }
  }
  std::string dir_;
  std::vector<std::string> written_;
};

TEST_F(GGUFReaderTest, ValidFileReadsBack) {
  const Bytes f = valid_file();
  auto g = GGUFFile::open(write("valid.gguf", f.b));
  EXPECT_EQ(g->version(), 3u);
  EXPECT_EQ(g->alignment(), 32u);
  EXPECT_EQ(g->file_size(), f.b.size());
  EXPECT_EQ(g->data_offset() % 32, 0u);
  ASSERT_EQ(g->metadata().size(), 5u);
  EXPECT_EQ(g->metadata()[0].key, "general.architecture");
  EXPECT_EQ(g->find("general.architecture")->as_string(), "gemma3");
  EXPECT_EQ(g->find("gemma3.embedding_length")->as_int(), 64);
  EXPECT_EQ(g->find("gemma3.attention.layer_norm_rms_epsilon")->as_double(), static_cast<double>(1e-6f));
  EXPECT_EQ(g->find("absent"), nullptr);

  const muser::GGUFKV* tokens = g->find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->type, GGUFType::ARRAY);
  EXPECT_EQ(tokens->elem_type, GGUFType::STRING);
  EXPECT_EQ(tokens->count, 3u);
  EXPECT_EQ(tokens->type_name(), "ARRAY[STRING]");
  EXPECT_EQ(tokens->value.element(0).as_string(), "<pad>");
  EXPECT_EQ(tokens->value.element(1).as_string(), "");
  EXPECT_EQ(tokens->value.element(2).as_string(), "hello");
  EXPECT_THROW(tokens->value.element(3), std::out_of_range);
  // offset is the first element: its length prefix comes 8 bytes before "<pad>"
  EXPECT_EQ(std::memcmp(g->base() + tokens->offset + 8, "<pad>", 5), 0);

  const muser::GGUFKV* nested = g->find("nested");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->elem_type, GGUFType::ARRAY);
  const muser::GGUFValue inner0 = nested->value.element(0);
  EXPECT_EQ(inner0.elem_type, GGUFType::INT16);
  EXPECT_EQ(inner0.count, 2u);
  EXPECT_EQ(inner0.element(0).as_int(), -5);
  EXPECT_EQ(inner0.element(1).as_int(), 7);
  EXPECT_EQ(nested->value.element(1).count, 0u);
  std::vector<uint64_t> counts;
  nested->value.for_each_element([&](const muser::GGUFValue& v) { counts.push_back(v.count); });
  EXPECT_EQ(counts, (std::vector<uint64_t>{2, 0}));

  ASSERT_EQ(g->tensors().size(), 2u);
  const muser::GGUFTensorInfo* a = g->find_tensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(a->nbytes, 24u);
  EXPECT_EQ(a->rows(), 2);
  EXPECT_EQ(a->row_bytes(), 12);
  const muser::GGUFTensorInfo* b = g->find_tensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->type, 8u);
  EXPECT_EQ(b->nbytes, 68u);
  EXPECT_EQ(b->nelements(), 64);
  EXPECT_EQ(b->row_bytes(), 68);
  // Data bytes are the file's own bytes (no copy): counting from the data section.
  EXPECT_EQ(g->tensor_data(*a), g->base() + g->data_offset());
  EXPECT_EQ(g->tensor_data(*b)[0], 32);
  EXPECT_EQ(g->find_tensor("c"), nullptr);
}

TEST_F(GGUFReaderTest, TypedAccessorsNameTheKey) {
  auto g = GGUFFile::open(write("valid.gguf", valid_file().b));
  try {
    g->find("general.architecture")->as_double();
    ADD_FAILURE() << "as_double on a string did not throw";
  } catch (const muser::SpecError& e) {
    EXPECT_STREQ(e.what(), "metadata key 'general.architecture' has type STRING, expected a number");
  }
  EXPECT_THROW(g->find("gemma3.embedding_length")->as_string(), muser::SpecError);
  EXPECT_THROW(g->find("gemma3.attention.layer_norm_rms_epsilon")->as_int(), muser::SpecError);
}

TEST_F(GGUFReaderTest, CustomAlignment) {
  Bytes f = header(1, 1);
  f.kv_header("general.alignment", GGUFType::UINT32).put<uint32_t>(64);
  f.str("t").put<uint32_t>(1).put<uint64_t>(16).put<uint32_t>(0).put<uint64_t>(64);
  f.pad_to(64);
  f.b.resize(f.b.size() + 128);
  auto g = GGUFFile::open(write("align64.gguf", f.b));
  EXPECT_EQ(g->alignment(), 64u);
  EXPECT_EQ(g->data_offset() % 64, 0u);
  EXPECT_EQ(g->tensors()[0].offset, 64u);
}

TEST_F(GGUFReaderTest, MissingFileNamesThePath) {
  try {
    GGUFFile::open(dir_ + "/absent.gguf");
    ADD_FAILURE() << "opened a missing file";
  } catch (const GGUFError& e) {
    EXPECT_NE(std::string(e.what()).find("absent.gguf"), std::string::npos);
  }
}

TEST_F(GGUFReaderTest, BadMagic) {
  Bytes f = valid_file();
  f.b[0] = 'X';
  expect_error("magic.gguf", f.b, "bad magic");
}

TEST_F(GGUFReaderTest, UnsupportedVersions) {
  expect_error("v1.gguf", header(0, 0, 1).b, "unsupported version 1");
  expect_error("v4.gguf", header(0, 0, 4).b, "unsupported version 4");
  expect_error("big_endian.gguf", header(0, 0, 0x03000000).b, "big-endian");
}

TEST_F(GGUFReaderTest, TruncatedAtEveryByte) {
  const Bytes f = valid_file();
  // Every strict prefix that cuts into the header, metadata or tensor table,
  // or the last tensor's data, must be rejected (no prefix is a valid file:
  // tensor "b" ends at the last byte).
  for (size_t n = 0; n < f.b.size(); ++n) {
    const std::vector<uint8_t> cut(f.b.begin(), f.b.begin() + n);
    const std::string path = write("cut" + std::to_string(n) + ".gguf", cut);
    EXPECT_THROW(GGUFFile::open(path), GGUFError) << "prefix of " << n << " bytes";
  }
}

TEST_F(GGUFReaderTest, HugeCountsRejectedBeforeAllocation) {
  expect_error("kv_count.gguf", header(0, 0xFFFFFFFFull).b, "metadata count 4294967295 needs at least");
  expect_error("tensor_count.gguf", header(UINT64_MAX, 0).b, "tensor count");
  Bytes f = header(0, 1);
  f.kv_header("arr", GGUFType::ARRAY).put<uint32_t>(static_cast<uint32_t>(GGUFType::UINT64)).put<uint64_t>(1ull << 61);
  expect_error("array_count.gguf", f.b, "element count 2305843009213693952 needs at least");
  Bytes s = header(0, 1);
  s.kv_header("s", GGUFType::STRING).put<uint64_t>(UINT64_MAX);
  expect_error("string_len.gguf", s.b, "truncated");
}

TEST_F(GGUFReaderTest, NestingDepthIsLimited) {
  Bytes f = header(0, 1);
  f.kv_header("deep", GGUFType::ARRAY);
  for (int i = 0; i < 100; ++i) f.put<uint32_t>(static_cast<uint32_t>(GGUFType::ARRAY)).put<uint64_t>(1);
  f.put<uint32_t>(static_cast<uint32_t>(GGUFType::UINT8)).put<uint64_t>(0);
  expect_error("deep.gguf", f.b, "nests arrays deeper than 8");
}

TEST_F(GGUFReaderTest, TensorTableErrors) {
  auto one_tensor = [](uint32_t n_dims, std::vector<uint64_t> dims, uint32_t type, uint64_t offset,
                       const std::string& name = "t") {
    Bytes f = header(1, 0);
    f.str(name).put<uint32_t>(n_dims);
    for (uint64_t d : dims) f.put<uint64_t>(d);
    f.put<uint32_t>(type).put<uint64_t>(offset);
    f.pad_to(32);
    f.b.resize(f.b.size() + 1024);
    return f.b;
  };
  expect_error("unknown_type.gguf", one_tensor(1, {32}, 99, 0), "unknown ggml type id 99");
  expect_error("q5k_row.gguf", one_tensor(2, {100, 2}, 13, 0), "not a multiple of the Q5_K block size 256");
  expect_error("zero_dim.gguf", one_tensor(2, {4, 0}, 0, 0), "dimension 1 is 0");
  expect_error("n_dims0.gguf", one_tensor(0, {}, 0, 0), "has 0 dimensions");
  expect_error("n_dims5.gguf", one_tensor(5, {1, 1, 1, 1, 1}, 0, 0), "has 5 dimensions");
  expect_error("overflow.gguf", one_tensor(2, {1ull << 62, 4}, 0, 0), "overflows int64");
  expect_error("negative.gguf", one_tensor(1, {UINT64_MAX}, 0, 0), "expected 1 to 2^63-1");
  expect_error("misaligned.gguf", one_tensor(1, {4}, 0, 8), "not a multiple of the alignment 32");
  expect_error("outside.gguf", one_tensor(1, {1024}, 0, 0), "lies outside the file");
  expect_error("empty_name.gguf", one_tensor(1, {4}, 0, 0, ""), "empty name");
  expect_error("bad_utf8_name.gguf", one_tensor(1, {4}, 0, 0, "\xC0\xAF"), "not valid UTF-8");
}

TEST_F(GGUFReaderTest, DuplicatesAndBadAlignment) {
  Bytes dup_key = header(0, 2);
  dup_key.kv_header("k", GGUFType::UINT8).put<uint8_t>(1);
  dup_key.kv_header("k", GGUFType::UINT8).put<uint8_t>(2);
  expect_error("dup_key.gguf", dup_key.b, "duplicate metadata key 'k'");

  Bytes dup_tensor = header(2, 0);
  for (int i = 0; i < 2; ++i) dup_tensor.str("w").put<uint32_t>(1).put<uint64_t>(4).put<uint32_t>(0).put<uint64_t>(0);
  dup_tensor.pad_to(32);
  dup_tensor.b.resize(dup_tensor.b.size() + 16);
  expect_error("dup_tensor.gguf", dup_tensor.b, "duplicate tensor name 'w'");

  Bytes align3 = header(0, 1);
  align3.kv_header("general.alignment", GGUFType::UINT32).put<uint32_t>(3);
  expect_error("align3.gguf", align3.b, "bad alignment");
  Bytes align_type = header(0, 1);
  align_type.kv_header("general.alignment", GGUFType::UINT64).put<uint64_t>(32);
  expect_error("align_u64.gguf", align_type.b, "bad alignment: general.alignment has type UINT64");

  Bytes unknown_value = header(0, 1);
  unknown_value.kv_header("k", static_cast<GGUFType>(13)).put<uint64_t>(0);
  expect_error("value_type.gguf", unknown_value.b, "unknown value type 13");
}

}  // namespace

namespace {

// A float has no integer value in general, and converting one out of int64's
// range is undefined behaviour: as_int refuses floats (as_double reads them).
TEST(GGUFValueTest, AsIntOnAFloatThrows) {
  for (muser::GGUFType t : {GGUFType::FLOAT32, GGUFType::FLOAT64}) {
    const double big = 1e300;
    const float bigf = 1e30f;
    muser::GGUFValue v;
    v.type = t;
    v.data = t == GGUFType::FLOAT32 ? reinterpret_cast<const uint8_t*>(&bigf) : reinterpret_cast<const uint8_t*>(&big);
    EXPECT_THROW(v.as_int(), muser::SpecError);
    EXPECT_THROW(v.as_uint(), muser::SpecError);
    EXPECT_GT(v.as_double(), 1e29);
  }
  const uint32_t seven = 7;
  muser::GGUFValue u;
  u.type = GGUFType::UINT32;
  u.data = reinterpret_cast<const uint8_t*>(&seven);
  EXPECT_EQ(u.as_int(), 7);
}

}  // namespace
