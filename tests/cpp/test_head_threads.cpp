// One Head shared by 8 threads, 1,000 mixed calls each (single rows and
// batches, into the head's pool or into the caller's own memory): every
// result equals the serial run, and every pooled result is still intact after
// the thread's later calls (the pool never hands out a buffer someone holds).
// Under ThreadSanitizer (MUSER_SANITIZE=thread) this is the race check of the
// engine's Head, pool and CPU thread pool.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "device.h"
#include "errors.h"
#include "gguf.h"
#include "gguf_bytes.h"
#include "head.h"
#include "quant_types.h"

namespace {

using muser_test::Bytes;

// A Muse Glimmer-style head: H x V Q8_0 weight with small finite scales, gamma,
// logit scale and soft cap.
std::vector<uint8_t> head_file(int64_t H, int64_t V, uint32_t seed) {
  using muser::GGUFType;
  Bytes f;
  f.b = {'G', 'G', 'U', 'F'};
  f.put<uint32_t>(3).put<uint64_t>(2).put<uint64_t>(5);
  f.kv_header("general.architecture", GGUFType::STRING).str("muse-glimmer");
  f.kv_header("muse-glimmer.embedding_length", GGUFType::UINT32).put<uint32_t>((uint32_t)H);
  f.kv_header("muse-glimmer.attention.layer_norm_rms_epsilon", GGUFType::FLOAT32).put<float>(1e-5f);
  f.kv_header("muse-glimmer.logit_scale", GGUFType::FLOAT32).put<float>(0.196116f);
  f.kv_header("muse-glimmer.final_logit_softcapping", GGUFType::FLOAT32).put<float>(20.0f);
  const uint64_t norm_bytes = (uint64_t)H * 4, norm_padded = (norm_bytes + 31) / 32 * 32;
  f.str("output_norm.weight").put<uint32_t>(1).put<uint64_t>((uint64_t)H).put<uint32_t>(0).put<uint64_t>(0);
  f.str("output.weight").put<uint32_t>(2).put<uint64_t>((uint64_t)H).put<uint64_t>((uint64_t)V);
  f.put<uint32_t>((uint32_t)muser::GgmlType::Q8_0).put<uint64_t>(norm_padded);
  f.pad_to(32);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> g(0.5f, 1.5f);
  for (int64_t i = 0; i < H; ++i) f.put<float>(g(rng));
  f.pad_to(32);
  const int64_t blocks = H / 32 * V;
  for (int64_t k = 0; k < blocks; ++k) {
    f.put<uint16_t>((uint16_t)(0x1400 + rng() % 0x200));  // f16 scale ~1e-3
    for (int i = 0; i < 32; ++i) f.put<int8_t>((int8_t)(rng() % 255 - 127));
  }
  return f.b;
}

TEST(HeadThreads, EightThreadsMixedCallsEqualSerial) {
  const int64_t H = 256, V = 2000;
  const auto bytes = head_file(H, V, 7);
  muser::HeadOptions opt;
  opt.route = muser::Route::Canonical;
  opt.threads = 2;
  auto head = muser::Head::from_file(muser::GGUFFile::from_bytes("threads.gguf", bytes.data(), bytes.size()), opt);

  const int kInputs = 16, kMaxT = 3;
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<std::vector<float>> inputs(kInputs, std::vector<float>((size_t)(kMaxT * H)));
  for (auto& x : inputs)
    for (auto& v : x) v = n(rng);
  // the serial run: row r of input i at t = kMaxT (batch rows equal single steps)
  std::vector<std::vector<float>> expect(kInputs);
  for (int i = 0; i < kInputs; ++i) {
    expect[i].resize((size_t)(kMaxT * V));
    head->run(inputs[i].data(), kMaxT, expect[i].data(), nullptr);
  }

  const int kThreads = 8, kCalls = 1000;
  std::vector<int> wrong(kThreads, 0);
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      std::mt19937 r((uint32_t)(100 + th));
      std::vector<float> own((size_t)(kMaxT * V));
      std::shared_ptr<muser::HostBuffer> held;  // a pooled result kept across later calls
      int held_input = -1, held_t = 0;
      for (int c = 0; c < kCalls; ++c) {
        const int i = (int)(r() % kInputs), t = 1 + (int)(r() % kMaxT);
        const bool into_own = r() % 4 == 0;
        auto buf = head->run(inputs[i].data(), t, into_own ? own.data() : nullptr, nullptr);
        const float* y = into_own ? own.data() : buf->data;
        if (std::memcmp(y, expect[i].data(), (size_t)(t * V) * sizeof(float)) != 0) ++wrong[th];
        if (held && std::memcmp(held->data, expect[held_input].data(), (size_t)(held_t * V) * sizeof(float)) != 0)
          ++wrong[th];  // a later call wrote a buffer this thread still held
        if (!into_own && r() % 2 == 0) {
          held = buf;
          held_input = i;
          held_t = t;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int th = 0; th < kThreads; ++th) EXPECT_EQ(wrong[th], 0) << "thread " << th;
}

TEST(HeadThreads, PoolReusesOnlyFreeBuffers) {
  const int64_t H = 64, V = 300;
  const auto bytes = head_file(H, V, 3);
  muser::HeadOptions opt;
  opt.threads = 1;
  auto head = muser::Head::from_file(muser::GGUFFile::from_bytes("pool.gguf", bytes.data(), bytes.size()), opt);
  std::vector<float> x((size_t)H, 0.5f);
  const float* first = head->run(x.data(), 1, nullptr, nullptr)->data;  // released at once
  EXPECT_EQ(head->run(x.data(), 1, nullptr, nullptr)->data, first) << "a free buffer is reused";
  std::vector<std::shared_ptr<muser::HostBuffer>> held;
  for (size_t k = 0; k < muser::Head::kPoolSize + 2; ++k) held.push_back(head->run(x.data(), 1, nullptr, nullptr));
  for (size_t a = 0; a < held.size(); ++a)
    for (size_t b = a + 1; b < held.size(); ++b) EXPECT_NE(held[a]->data, held[b]->data);
  const float* pooled = held[0]->data;
  held.clear();
  EXPECT_EQ(head->buffer(), nullptr) << "the latest result was a one-off buffer, freed with its last owner";
  EXPECT_EQ(head->run(x.data(), 1, nullptr, nullptr)->data, pooled) << "the pool's buffers wait for reuse";
  EXPECT_NE(head->buffer(), nullptr);
}

// A shard (HeadOptions::shard_rank/shard_world) computes rows [rank V / world,
// (rank + 1) V / world) of the weight, in place: the same columns of the
// unsharded logits, bit for bit; bad shard arguments are refused.
TEST(HeadShard, RowRangeIsTheUnshardedColumns) {
  const int64_t H = 256, V = 2003, t = 3;
  const auto bytes = head_file(H, V, 11);
  muser::HeadOptions opt;
  opt.route = muser::Route::Canonical;
  opt.threads = 2;
  auto file = muser::GGUFFile::from_bytes("shard.gguf", bytes.data(), bytes.size());
  auto full = muser::Head::from_file(file, opt);
  std::mt19937 rng(5);
  std::normal_distribution<float> g;
  std::vector<float> x((size_t)(t * H));
  for (float& v : x) v = g(rng);
  std::vector<float> want((size_t)(t * V));
  full->run(x.data(), (int)t, want.data(), nullptr);
  for (int64_t world : {2, 3, 7}) {
    for (int64_t rank = 0; rank < world; ++rank) {
      opt.shard_rank = rank;
      opt.shard_world = world;
      auto h = muser::Head::from_file(file, opt);
      const int64_t s = rank * V / world, e = (rank + 1) * V / world;
      ASSERT_EQ(h->rows().start, s);
      ASSERT_EQ(h->rows().stop, e);
      ASSERT_EQ(h->spec().vocab, e - s);
      ASSERT_EQ(h->model_vocab(), V);
      EXPECT_EQ(h->output_weight().data, full->output_weight().data + s * full->output_weight().row_bytes);
      std::vector<float> got((size_t)(t * (e - s)));
      h->run(x.data(), (int)t, got.data(), nullptr);
      for (int64_t r = 0; r < t; ++r)
        EXPECT_EQ(std::memcmp(got.data() + r * (e - s), want.data() + r * V + s, (size_t)(e - s) * 4), 0)
            << "world " << world << " rank " << rank << " row " << r;
    }
  }
  EXPECT_THROW(muser::shard_row_range(V, 2, 2), muser::ArgValueError);
  EXPECT_THROW(muser::shard_row_range(V, -1, 2), muser::ArgValueError);
  EXPECT_THROW(muser::shard_row_range(V, 0, 0), muser::ArgValueError);
  EXPECT_THROW(muser::shard_row_range(3, 0, 4), muser::ArgValueError);
}

}  // namespace
