// The plain C++ face of the Objective-C++ Metal glue (metal_device.mm), as
// ggml-metal-device.h is to ggml-metal-device.m: no id<> types, no Objective-C,
// no exceptions. Every call that can fail returns a Status; the .cpp side
// (metal_device.cpp) turns a failed one into muser::DeviceError. The .mm never
// throws and never catches a C++ exception (its Linux runtime, clang with
// GCC's Objective-C runtime, cannot unwind through Objective-C++ frames).
//
// Objects are opaque handles owned by the caller: a Context (device, queue,
// library, pipeline cache) from create(), buffers from new_buffer() /
// wrap_buffer(), each released exactly once.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace muser::metal {

struct Status {
  bool ok = true;
  std::string message;  // what failed, in words, when !ok
  static Status fail(std::string m) { return {false, std::move(m)}; }
};

struct Context;  // MTLDevice, command queue, library, pipeline cache (metal_device.mm)

struct CreateOptions {
  std::string metallib_path;  // a compiled metallib to load; empty or missing: compile `source`
  std::string source;         // the embedded library source (newLibraryWithSource, safe math)
};

struct DeviceInfo {
  std::string name;
  uint64_t max_buffer_length = 0;             // bytes of the largest MTLBuffer
  uint32_t max_threads_per_threadgroup = 0;   // the device's limit (maxThreadsPerThreadgroup.width)
  size_t page_size = 0;                       // bytes newBufferWithBytesNoCopy aligns to (16 KiB on Apple silicon)
  bool unified_memory = false;                // hasUnifiedMemory: shared buffers need no copy
  bool library_from_source = false;           // the library was compiled at load (no metallib)
  bool safe_math_mode = false;                // compiled with mathMode = Safe (macOS 15+) rather than fastMathEnabled = NO
};

// A buffer in shared storage: contents is host-visible and is what kernels see.
struct Buffer {
  void* handle = nullptr;    // the retained id<MTLBuffer>, opaque here
  void* contents = nullptr;  // [buffer contents]
  size_t length = 0;         // bytes
};

enum class Access : uint8_t { Read, Write, ReadWrite };

struct Binding {
  const Buffer* buffer = nullptr;
  uint64_t offset = 0;  // bytes into the buffer
  uint32_t index = 0;   // [[buffer(index)]]
  Access access = Access::Read;
};

// setBytes: a kargs struct (muser/kernel_args.h) copied into the encoder.
struct Bytes {
  std::vector<uint8_t> data;
  uint32_t index = 0;
  template <class T>
  static Bytes of(const T& v, uint32_t index) {
    Bytes b;
    b.data.resize(sizeof(T));
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.data.assign(p, p + sizeof(T));
    b.index = index;
    return b;
  }
};

struct Dispatch {
  std::string kernel;               // pipeline name (op_weight_activation, e.g. "matvec_q5_K_f32")
  std::vector<Binding> buffers;
  std::vector<Bytes> bytes;
  uint64_t threadgroups = 1;        // 1-D grid of threadgroups
  uint32_t threads = 32;            // threads per threadgroup
  uint32_t threadgroup_memory = 0;  // bytes at [[threadgroup(0)]]; 0 for none
  bool barrier_before = false;      // a buffer-scope memory barrier before this dispatch
};

// A step: the dispatches of one profile entry. Steps run in one concurrent
// compute encoder (MTLDispatchTypeConcurrent); the barriers are the
// dispatches' barrier_before flags.
struct StepEncoding {
  std::string label;
  std::vector<Dispatch> dispatches;
};

Status create(const CreateOptions& options, Context** out);
void destroy(Context* ctx);
Status info(Context* ctx, DeviceInfo* out);

Status new_buffer(Context* ctx, size_t bytes, Buffer* out);
// Wraps host memory without a copy (newBufferWithBytesNoCopy): ptr and bytes
// must be multiples of info().page_size; the memory must outlive the buffer.
Status wrap_buffer(Context* ctx, void* ptr, size_t bytes, Buffer* out);
void release_buffer(Buffer* buffer);  // drops the handle; a null handle is a no-op

// The pipeline of a kernel, built on first use and cached by name.
Status pipeline(Context* ctx, const std::string& kernel);

// Encodes the steps into one command buffer and waits; the command buffer's
// status is read after the wait. seconds (optional): one command buffer per
// step instead, each step's GPU time (GPUEndTime - GPUStartTime) appended.
Status run(Context* ctx, const std::vector<StepEncoding>& steps, std::vector<double>* seconds);

struct PipelineStats {
  uint64_t built = 0;   // pipeline states created
  uint64_t lookups = 0; // requests answered from the cache
  size_t cached = 0;    // names in the cache
};
PipelineStats pipeline_stats(Context* ctx);

// The read limit of bench/metal_head.py: a fresh context streams a shared
// buffer of nbytes (rounded down to whole words) with read_bandwidth_u32,
// iters + 2 command buffers (the first two are warm-up, dropped); each kept
// one's GPU time in seconds. Throws muser::DeviceError (metal_device.cpp).
std::vector<double> read_bandwidth_seconds(size_t nbytes, int iters);

// ---- test-only hooks ----
// Drop the barrier before the n-th dispatch (counted over a run's steps, from
// 0) of every later run; -1 restores them. Proves the emulator's hazard check.
void test_drop_barrier(Context* ctx, int n);

// ---- process-wide test hooks of the device (metal_device.cpp) ----
void test_set_drop_barrier(int n);               // test_drop_barrier on every later run of every Metal head
void test_set_max_buffer_length(uint64_t bytes); // views of the weight at most this long (0: the device's own)
uint64_t test_pipelines_built();                 // pipeline states the last-used context has created
uint64_t test_device_draws();                    // sample() calls the device drew (not left to the host)
uint64_t test_weight_views();                    // MTLBuffers the last prepared weight was wrapped in
bool test_weights_no_copy();                     // whether they wrap the mapping (newBufferWithBytesNoCopy)
void test_set_library_source(const std::string& source);  // the next device compiles this instead
size_t test_buffer_length_at(const void* contents);       // length of the live buffer whose contents is here, else 0

}  // namespace muser::metal
