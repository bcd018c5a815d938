// libFuzzer harness: the bytes of a GGUF file through everything Head.load
// does with them, on the CPU device.
//
//   1. GGUFFile::from_bytes (the parse of a private copy);
//   2. every metadata value through the accessor that matches its type,
//      array elements through for_each_element (nested arrays recursed) and
//      the last element through element(i);
//   3. every tensor: nelements/rows/row_bytes, its first and last byte;
//   4. read_head_spec with no overrides;
//   5. when vocab x hidden <= kMaxElements (so one input stays fast): a Head
//      on each route with f32 and q8 activations, one step of a fixed finite
//      hidden state, and a read of the first and last logit.
//
// muser::Error and std::invalid_argument (ArgValueError, ArgTypeError) are the
// documented ways to refuse a file and end the input quietly. Anything else --
// a crash, a sanitizer report, std::bad_alloc from a hostile size, any other
// exception, a timeout -- is a finding. Run: tests/fuzz/run.sh.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "errors.h"
#include "gguf.h"
#include "head.h"
#include "head_spec.h"
#include "route.h"

namespace {

constexpr int64_t kMaxElements = int64_t{1} << 20;

// Keeps reads from being optimized away.
volatile uint64_t g_sink = 0;

void touch(const uint8_t* p, uint64_t n) {
  if (n == 0) return;
  g_sink = g_sink + p[0] + p[n - 1];
}

void walk_value(const muser::GGUFValue& v, int depth) {
  using muser::GGUFType;
  switch (v.type) {
    case GGUFType::STRING: {
      const std::string_view s = v.as_string();
      touch(reinterpret_cast<const uint8_t*>(s.data()), s.size());
      break;
    }
    case GGUFType::ARRAY: {
      uint64_t n = 0;
      v.for_each_element([&](const muser::GGUFValue& e) {
        walk_value(e, depth + 1);
        ++n;
      });
      if (n != v.count) __builtin_trap();  // the walk must visit exactly count elements
      if (v.count > 0) walk_value(v.element(v.count - 1), depth + 1);
      break;
    }
    case GGUFType::FLOAT32:
    case GGUFType::FLOAT64: g_sink = g_sink + static_cast<uint64_t>(v.as_double() != 0.0); break;
    case GGUFType::UINT64: g_sink = g_sink + v.as_uint(); break;
    default:
      if (muser::gguf_is_integer(v.type)) g_sink = g_sink + static_cast<uint64_t>(v.as_int());
      break;
  }
}

void walk_file(const muser::GGUFFile& f) {
  for (const muser::GGUFKV& kv : f.metadata()) {
    if (f.find(kv.key) != &kv) __builtin_trap();  // every key is found as itself
    g_sink = g_sink + kv.type_name().size();
    if (kv.type == muser::GGUFType::STRING) {
      const std::string_view s = kv.as_string();
      touch(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    } else if (muser::gguf_is_float(kv.type)) {
      g_sink = g_sink + static_cast<uint64_t>(kv.as_double() != 0.0);
    } else if (muser::gguf_is_integer(kv.type)) {
      g_sink = g_sink + static_cast<uint64_t>(kv.as_int());
    }
    walk_value(kv.value, 0);
  }
  for (const muser::GGUFTensorInfo& t : f.tensors()) {
    if (f.find_tensor(t.name) != &t) __builtin_trap();
    g_sink = g_sink + static_cast<uint64_t>(t.nelements() + t.rows() + t.row_bytes());
    touch(f.tensor_data(t), t.nbytes);
  }
}

void run_heads(const std::shared_ptr<muser::GGUFFile>& file, const muser::HeadSpec& spec) {
  if (spec.hidden <= 0 || spec.vocab <= 0 || spec.hidden > kMaxElements / spec.vocab) return;
  std::vector<float> hidden(static_cast<size_t>(spec.hidden));
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = static_cast<float>(static_cast<int>(i % 17) - 8) * 0.25f;
  for (muser::Route route : {muser::Route::Reference, muser::Route::Fused, muser::Route::Graph,
                             muser::Route::Canonical}) {
    for (muser::Acts acts : {muser::Acts::F32, muser::Acts::Q8}) {
      muser::HeadOptions options;
      options.device = "cpu";
      options.route = route;
      options.acts = acts;
      options.threads = 1;
      try {
        std::shared_ptr<muser::Head> head = muser::Head::from_file(file, options);
        std::shared_ptr<muser::HostBuffer> out = head->run(hidden.data(), 1, nullptr, nullptr);
        if (!out || out->count < static_cast<size_t>(spec.vocab)) __builtin_trap();
        g_sink = g_sink + static_cast<uint64_t>(out->data[0] != 0.0f) +
                 static_cast<uint64_t>(out->data[spec.vocab - 1] != 0.0f);
      } catch (const muser::Error&) {
      } catch (const std::invalid_argument&) {  // e.g. acts='q8' on a float head
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    std::shared_ptr<muser::GGUFFile> file = muser::GGUFFile::from_bytes("fuzz.gguf", data, size);
    walk_file(*file);
    const muser::HeadSpec spec = muser::read_head_spec(*file, muser::SpecOverrides{});
    run_heads(file, spec);
  } catch (const muser::Error&) {
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
