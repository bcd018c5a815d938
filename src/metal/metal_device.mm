// The Objective-C++ glue of the Metal backend: it owns the MTLDevice, the
// command queue, the library, a pipeline-state cache keyed by kernel name,
// the shared-storage buffers, and encodes a run as one concurrent compute
// encoder (MTLDispatchTypeConcurrent) per command buffer with a buffer-scope
// memory barrier before each dispatch that depends on an earlier one.
//
// Manual retain/release (as ggml-metal): every new/alloc/copy/Create is
// released here exactly once, so this file builds with ARC off on macOS and
// runs on Linux against tests/metal_emulator/ (GNUstep). Two rules follow
// from that runtime (clang with GCC's Objective-C runtime cannot unwind C++
// exceptions through Objective-C++ frames): nothing here throws or catches a
// C++ exception -- failures leave as Status values (metal_device.cpp makes
// them muser::DeviceError) -- and the one OS-version question goes through
// macos15() and MUSER_MACOS_AVAILABLE (muser_os_version.h), which the
// emulator answers as a test sets it, so the pre-macOS-15 path runs too.
#import <Foundation/Foundation.h>
#if defined(MUSER_METAL_OWN_API)
#import "Metal.h"  // the project's declarations of the subset used (src/metal/metal_api/)
#else
#import <Metal/Metal.h>
#endif

#include "muser_os_version.h"

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "metal_device.h"

#if defined(MUSER_METAL_EMULATOR)
extern "C" size_t muser_emu_page_size(void);  // tests/metal_emulator/emu_runtime.h
#endif

#if __has_feature(objc_arc)
#error "metal_device.mm uses manual retain/release: compile it with -fno-objc-arc"
#endif

namespace muser::metal {

namespace {

// The one OS-version check (@available is always true on Linux: the emulator answers there).
bool macos15() {
  if (MUSER_MACOS_AVAILABLE(15.0)) return true;
  return false;
}

NSString* ns(const std::string& s) { return [NSString stringWithUTF8String:s.c_str()]; }  // autoreleased

std::string str(NSString* s) { return s ? std::string([s UTF8String]) : std::string(); }

std::string describe(NSError* e) { return e ? str([e localizedDescription]) : std::string("no error given"); }

const char* status_name(MTLCommandBufferStatus s) {
  switch (s) {
    case MTLCommandBufferStatusNotEnqueued: return "not enqueued";
    case MTLCommandBufferStatusEnqueued: return "enqueued";
    case MTLCommandBufferStatusCommitted: return "committed";
    case MTLCommandBufferStatusScheduled: return "scheduled";
    case MTLCommandBufferStatusCompleted: return "completed";
    case MTLCommandBufferStatusError: return "error";
  }
  return "unknown";
}

}  // namespace

struct Context {
  id<MTLDevice> device = nil;
  id<MTLCommandQueue> queue = nil;
  id<MTLLibrary> library = nil;
  bool from_source = false;
  bool safe_math_mode = false;
  std::mutex mutex;  // the cache, the stats and the barrier hook
  std::map<std::string, id<MTLComputePipelineState>> pipelines;  // each retained once
  PipelineStats stats;
  int drop_barrier = -1;
};

namespace {

// The pipeline of `kernel`, from the cache or built now (ctx->mutex held).
Status pipeline_locked(Context* ctx, const std::string& kernel, id<MTLComputePipelineState>* out) {
  auto it = ctx->pipelines.find(kernel);
  if (it != ctx->pipelines.end()) {
    ++ctx->stats.lookups;
    *out = it->second;
    return {};
  }
  id<MTLFunction> fn = [ctx->library newFunctionWithName:ns(kernel)];
  if (!fn) return Status::fail("the Metal library has no kernel '" + kernel + "'");
  NSError* err = nil;
  id<MTLComputePipelineState> ps = [ctx->device newComputePipelineStateWithFunction:fn error:&err];
  [fn release];
  if (!ps) return Status::fail("building the pipeline of kernel '" + kernel + "' failed: " + describe(err));
  ctx->pipelines[kernel] = ps;
  ++ctx->stats.built;
  ctx->stats.cached = ctx->pipelines.size();
  *out = ps;
  return {};
}

}  // namespace

Status create(const CreateOptions& o, Context** out) {
  *out = nullptr;
  @autoreleasepool {
    id<MTLDevice> device = MTLCreateSystemDefaultDevice();  // +1
    if (!device) return Status::fail("no Metal device (MTLCreateSystemDefaultDevice returned nil)");
    id<MTLCommandQueue> queue = [device newCommandQueue];
    if (!queue) {
      [device release];
      return Status::fail("the Metal device gave no command queue (newCommandQueue returned nil)");
    }
    id<MTLLibrary> library = nil;
    NSError* err = nil;
    bool from_source = false, safe = false;
#if defined(MUSER_HAVE_METALLIB)  // built by xcrun metal (src/metal/CMakeLists.txt): Apple's SDK only
    const bool have_metallib =
        !o.metallib_path.empty() && [[NSFileManager defaultManager] fileExistsAtPath:ns(o.metallib_path)];
#else
    const bool have_metallib = false;
#endif
    if (have_metallib) {
#if defined(MUSER_HAVE_METALLIB)
      library = [device newLibraryWithURL:[NSURL fileURLWithPath:ns(o.metallib_path)] error:&err];
#endif
      if (!library) {
        [queue release];
        [device release];
        return Status::fail("loading the metallib " + o.metallib_path + " failed: " + describe(err));
      }
    } else {
      if (o.source.empty()) {
        [queue release];
        [device release];
        return Status::fail("no metallib and no embedded library source to compile");
      }
      MTLCompileOptions* opts = [[MTLCompileOptions alloc] init];
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wunguarded-availability-new"
#pragma clang diagnostic ignored "-Wunguarded-availability"
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
      // safe math: IEEE division, sqrt and tanh, no reassociation (the canonical route's bits)
      if (macos15()) {
        opts.mathMode = MTLMathModeSafe;
        safe = true;
      } else {
        opts.fastMathEnabled = NO;
      }
#pragma clang diagnostic pop
      library = [device newLibraryWithSource:ns(o.source) options:opts error:&err];
      [opts release];
      if (!library) {
        [queue release];
        [device release];
        return Status::fail("the Metal library source does not compile: " + describe(err));
      }
      from_source = true;
    }
    Context* ctx = new Context;
    ctx->device = device;
    ctx->queue = queue;
    ctx->library = library;
    ctx->from_source = from_source;
    ctx->safe_math_mode = safe;
    *out = ctx;
  }
  return {};
}

void destroy(Context* ctx) {
  if (!ctx) return;
  for (auto& kv : ctx->pipelines) [kv.second release];
  [ctx->library release];
  [ctx->queue release];
  [ctx->device release];
  delete ctx;
}

Status info(Context* ctx, DeviceInfo* out) {
  @autoreleasepool {
    out->name = str([ctx->device name]);
    out->max_buffer_length = (uint64_t)[ctx->device maxBufferLength];
    out->max_threads_per_threadgroup = (uint32_t)[ctx->device maxThreadsPerThreadgroup].width;
    out->unified_memory = [ctx->device hasUnifiedMemory];
#if defined(MUSER_METAL_EMULATOR)
    out->page_size = muser_emu_page_size();  // the alignment the emulated device demands (a test setting)
#else
    // 16 KiB: Apple silicon's page, a multiple of every other Mac's
    out->page_size = (size_t)NSPageSize() > 16384 ? (size_t)NSPageSize() : 16384;
#endif
    out->library_from_source = ctx->from_source;
    out->safe_math_mode = ctx->safe_math_mode;
  }
  return {};
}

Status new_buffer(Context* ctx, size_t bytes, Buffer* out) {
  const size_t n = bytes ? bytes : 16;
  id<MTLBuffer> b = [ctx->device newBufferWithLength:n options:MTLResourceStorageModeShared];
  if (!b) return Status::fail("newBufferWithLength of " + std::to_string(n) + " bytes (shared storage) returned nil");
  out->handle = (void*)b;
  out->contents = [b contents];
  out->length = n;
  return {};
}

Status wrap_buffer(Context* ctx, void* ptr, size_t bytes, Buffer* out) {
  id<MTLBuffer> b = [ctx->device newBufferWithBytesNoCopy:ptr
                                                   length:bytes
                                                  options:MTLResourceStorageModeShared
                                              deallocator:nil];
  if (!b)
    return Status::fail("newBufferWithBytesNoCopy of " + std::to_string(bytes) +
                        " bytes returned nil (the address and length must be page multiples, the length at most "
                        "maxBufferLength)");
  out->handle = (void*)b;
  out->contents = [b contents];
  out->length = bytes;
  return {};
}

void release_buffer(Buffer* buffer) {
  if (!buffer || !buffer->handle) return;
  [(id<MTLBuffer>)buffer->handle release];
  buffer->handle = nullptr;
  buffer->contents = nullptr;
  buffer->length = 0;
}

Status pipeline(Context* ctx, const std::string& kernel) {
  std::lock_guard<std::mutex> lock(ctx->mutex);
  id<MTLComputePipelineState> ps = nil;
  @autoreleasepool {
    return pipeline_locked(ctx, kernel, &ps);
  }
}

PipelineStats pipeline_stats(Context* ctx) {
  std::lock_guard<std::mutex> lock(ctx->mutex);
  return ctx->stats;
}

void test_drop_barrier(Context* ctx, int n) {
  std::lock_guard<std::mutex> lock(ctx->mutex);
  ctx->drop_barrier = n;
}

namespace {

// Encodes steps [first, last) into one command buffer, commits it and waits;
// the status is read after the wait. `counter` numbers the dispatches of the
// whole run (the barrier hook's index). ctx->mutex held.
Status encode_and_wait(Context* ctx, const std::vector<StepEncoding>& steps, size_t first, size_t last,
                       int* counter) {
  // every pipeline and limit checked before anything is encoded
  std::vector<id<MTLComputePipelineState>> states;
  for (size_t s = first; s < last; ++s)
    for (const Dispatch& d : steps[s].dispatches) {
      id<MTLComputePipelineState> ps = nil;
      const Status st = pipeline_locked(ctx, d.kernel, &ps);
      if (!st.ok) return st;
      if (d.threads == 0 || d.threads > (uint32_t)[ps maxTotalThreadsPerThreadgroup])
        return Status::fail("kernel '" + d.kernel + "': " + std::to_string(d.threads) +
                            " threads per threadgroup; its pipeline takes 1 to " +
                            std::to_string((unsigned long)[ps maxTotalThreadsPerThreadgroup]));
      for (const Binding& b : d.buffers)
        if (!b.buffer || !b.buffer->handle || b.offset >= b.buffer->length)
          return Status::fail("kernel '" + d.kernel + "': buffer " + std::to_string(b.index) +
                              " is unset or its offset lies past its end");
      states.push_back(ps);
    }
  id<MTLCommandBuffer> cb = [ctx->queue commandBuffer];  // autoreleased
  if (!cb) return Status::fail("the command queue gave no command buffer");
  id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent];
  if (!enc) return Status::fail("the command buffer gave no concurrent compute encoder");
  size_t k = 0;
  for (size_t s = first; s < last; ++s)
    for (const Dispatch& d : steps[s].dispatches) {
      const int n = (*counter)++;
      if (d.barrier_before && n != ctx->drop_barrier) [enc memoryBarrierWithScope:MTLBarrierScopeBuffers];
      [enc setComputePipelineState:states[k++]];
      for (const Binding& b : d.buffers)
        [enc setBuffer:(id<MTLBuffer>)b.buffer->handle offset:(NSUInteger)b.offset atIndex:b.index];
      for (const Bytes& b : d.bytes) [enc setBytes:b.data.data() length:b.data.size() atIndex:b.index];
      if (d.threadgroup_memory) [enc setThreadgroupMemoryLength:(d.threadgroup_memory + 15) / 16 * 16 atIndex:0];
      [enc dispatchThreadgroups:MTLSizeMake((NSUInteger)d.threadgroups, 1, 1)
          threadsPerThreadgroup:MTLSizeMake(d.threads, 1, 1)];
    }
  [enc endEncoding];
  [cb commit];
  [cb waitUntilCompleted];
  const MTLCommandBufferStatus status = [cb status];  // after the wait
  if (status != MTLCommandBufferStatusCompleted) {
    std::string what = steps[first].label;
    for (size_t s = first + 1; s < last; ++s) what += ", " + steps[s].label;
    return Status::fail("the Metal command buffer of " + what + " ended with status '" + status_name(status) +
                        "': " + describe([cb error]));
  }
  return {};
}

}  // namespace

Status run(Context* ctx, const std::vector<StepEncoding>& steps, std::vector<double>* seconds) {
  if (steps.empty()) return {};
  std::lock_guard<std::mutex> lock(ctx->mutex);
  int counter = 0;
  @autoreleasepool {
    if (!seconds) return encode_and_wait(ctx, steps, 0, steps.size(), &counter);
    // profiled: one command buffer per step, so each step's time is its own
    for (size_t s = 0; s < steps.size(); ++s) {
      const auto start = std::chrono::steady_clock::now();
      const Status st = encode_and_wait(ctx, steps, s, s + 1, &counter);
      if (!st.ok) return st;
      seconds->push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  return {};
}

}  // namespace muser::metal
