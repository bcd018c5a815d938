// Tests of the test-only Metal emulator itself (ctest muser_metal_emulator),
// written against src/metal/metal_api/Metal.h exactly as the real
// src/metal/metal_device.mm is: Objective-C++, manual retain/release, no C++
// exceptions (GCC's Objective-C runtime could not catch them here).
// Each check of the emulator is made to fire, and its clean twin not to.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <string>
#include <vector>

#include "metal_api/Metal.h"
#include "metal_api/muser_os_version.h"
#include "muser_metal_emulator.h"
#include "emu_test_args.h"

static int g_failures = 0;
#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                        \
    }                                                                      \
  } while (0)

static std::string read_file(const char* path) {
  std::string s;
  FILE* f = fopen(path, "rb");
  if (!f) return s;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  fclose(f);
  return s;
}

// The library source, as the .mm will embed it: the kernel files themselves.
static NSString* kernel_source() {
  std::string s;
  for (const char* f : {"vec_add.metal", "reduce.metal", "checks.metal"})
    s += read_file((std::string(MUSER_EMU_TEST_KERNEL_DIR) + "/" + f).c_str());
  return [NSString stringWithUTF8String:s.c_str()];
}

struct Env {
  id<MTLDevice> dev = nil;
  id<MTLCommandQueue> queue = nil;
  id<MTLLibrary> lib = nil;
};

static MTLCompileOptions* safe_options() {
  MTLCompileOptions* o = [[[MTLCompileOptions alloc] init] autorelease];
  if (MUSER_MACOS_AVAILABLE(15.0)) {
    [o setMathMode:MTLMathModeSafe];
  } else {
    [o setFastMathEnabled:NO];
  }
  return o;
}

static id<MTLComputePipelineState> pipeline(Env& e, const char* name) {
  id<MTLFunction> f = [e.lib newFunctionWithName:[NSString stringWithUTF8String:name]];
  CHECK(f != nil);
  NSError* err = nil;
  id<MTLComputePipelineState> p = [e.dev newComputePipelineStateWithFunction:f error:&err];
  [f release];
  CHECK(p != nil);
  return [p autorelease];
}

static id<MTLBuffer> floats(Env& e, size_t n, float fill) {
  id<MTLBuffer> b = [e.dev newBufferWithLength:n * sizeof(float) options:MTLResourceStorageModeShared];
  float* p = (float*)[b contents];
  for (size_t i = 0; i < n; ++i) p[i] = fill;
  return [b autorelease];
}

static bool contains(NSError* err, const char* what) {
  return err && strstr([[err localizedDescription] UTF8String], what) != nullptr;
}

// Commits and waits; returns the command buffer (autoreleased) for its status.
static id<MTLCommandBuffer> run(id<MTLCommandBuffer> cb) {
  [cb commit];
  [cb waitUntilCompleted];
  return cb;
}

static void write_range(id<MTLComputeCommandEncoder> enc, id<MTLComputePipelineState> p, id<MTLBuffer> y,
                        uint32_t offset, uint32_t n, float value) {
  EmuTestArgs k = {n, offset, value, 0};
  [enc setComputePipelineState:p];
  [enc setBuffer:y offset:0 atIndex:0];
  [enc setBytes:&k length:sizeof k atIndex:1];
  [enc dispatchThreads:MTLSizeMake(n, 1, 1) threadsPerThreadgroup:MTLSizeMake(64, 1, 1)];
}

static void test_vec_add(Env& e) {
  const uint32_t n = 1000;  // not a multiple of the threadgroup: edge threads must do nothing
  id<MTLBuffer> a = floats(e, n, 0), b = floats(e, n, 0), c = floats(e, n + 24, -7.0f);
  for (uint32_t i = 0; i < n; ++i) {
    ((float*)[a contents])[i] = 0.5f * i;
    ((float*)[b contents])[i] = 1.0f / (i + 1);
  }
  EmuTestArgs k = {n, 0, 0, 0};
  id<MTLCommandBuffer> cb = [e.queue commandBuffer];
  id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent];
  [enc setComputePipelineState:pipeline(e, "emu_vec_add")];
  [enc setBuffer:a offset:0 atIndex:0];
  [enc setBuffer:b offset:0 atIndex:1];
  [enc setBuffer:c offset:0 atIndex:2];
  [enc setBytes:&k length:sizeof k atIndex:3];
  [enc dispatchThreadgroups:MTLSizeMake((n + 255) / 256, 1, 1) threadsPerThreadgroup:MTLSizeMake(256, 1, 1)];
  [enc endEncoding];
  run(cb);
  CHECK([cb status] == MTLCommandBufferStatusCompleted);
  CHECK([cb error] == nil);
  const float* pc = (const float*)[c contents];
  bool ok = true;
  for (uint32_t i = 0; i < n; ++i) ok = ok && pc[i] == 0.5f * i + 1.0f / (i + 1);
  for (uint32_t i = n; i < n + 24; ++i) ok = ok && pc[i] == -7.0f;
  CHECK(ok);
}

// The kernel's tree, serially: butterfly within each 32 (xor 16, 8, 4, 2, 1;
// every lane ends with the same bits, lane 0's order computed here), then
// the 8 partials (xor 4, 2, 1).
static float serial_tree(const float* x, size_t n) {
  std::vector<float> v(x, x + n);
  for (size_t m = n / 2; m >= 1; m /= 2) {
    std::vector<float> w(n);
    for (size_t l = 0; l < n; ++l) w[l] = v[l] + v[l ^ m];
    v = w;
  }
  return v[0];
}

static float serial_reduce256(const float* x) {
  float partial[8];
  for (int s = 0; s < 8; ++s) partial[s] = serial_tree(x + 32 * s, 32);
  return serial_tree(partial, 8);
}

static void test_reduce(Env& e, const char* kernel, bool dynamic) {
  const size_t groups = 5, n = 256 * groups;
  id<MTLBuffer> x = floats(e, n, 0), out = floats(e, groups, 0);
  float* px = (float*)[x contents];
  uint32_t s = 12345;
  for (size_t i = 0; i < n; ++i) {  // wide magnitudes: the order shows in the bits
    s = s * 1664525u + 1013904223u;
    px[i] = ldexpf((float)(s >> 8) / 16777216.0f - 0.5f, (int)(s % 40) - 20);
  }
  id<MTLCommandBuffer> cb = [e.queue commandBuffer];
  id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent];
  [enc setComputePipelineState:pipeline(e, kernel)];
  [enc setBuffer:x offset:0 atIndex:0];
  [enc setBuffer:out offset:0 atIndex:1];
  if (dynamic) [enc setThreadgroupMemoryLength:32 atIndex:0];
  [enc dispatchThreadgroups:MTLSizeMake(groups, 1, 1) threadsPerThreadgroup:MTLSizeMake(256, 1, 1)];
  [enc endEncoding];
  run(cb);
  CHECK([cb status] == MTLCommandBufferStatusCompleted);
  const float* po = (const float*)[out contents];
  for (size_t g = 0; g < groups; ++g) {
    float want = serial_reduce256(px + 256 * g);
    uint32_t a, b;
    memcpy(&a, &po[g], 4);
    memcpy(&b, &want, 4);
    CHECK(a == b);
  }
  // and the order matters for these inputs: a plain left-to-right sum differs somewhere
  bool differs = false;
  for (size_t g = 0; g < groups; ++g) {
    float seq = 0;
    for (size_t i = 0; i < 256; ++i) seq += px[256 * g + i];
    differs = differs || seq != po[g];
  }
  CHECK(differs);
}

static void test_simd_ops(Env& e) {
  id<MTLBuffer> x = floats(e, 32, 0), out = floats(e, 64, 0);
  float* px = (float*)[x contents];
  for (int i = 0; i < 32; ++i) px[i] = (float)(i + 1);  // exact sums
  id<MTLCommandBuffer> cb = [e.queue commandBuffer];
  id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoder];
  [enc setComputePipelineState:pipeline(e, "emu_simd_ops")];
  [enc setBuffer:x offset:0 atIndex:0];
  [enc setBuffer:out offset:0 atIndex:1];
  [enc dispatchThreadgroups:MTLSizeMake(1, 1, 1) threadsPerThreadgroup:MTLSizeMake(32, 1, 1)];
  [enc endEncoding];
  run(cb);
  CHECK([cb status] == MTLCommandBufferStatusCompleted);
  const float* po = (const float*)[out contents];
  bool ok = true;
  for (int i = 0; i < 32; ++i) ok = ok && po[2 * i] == 528.0f && po[2 * i + 1] == (i < 31 ? px[i + 1] : px[i]);
  CHECK(ok);
}

static void test_hazards(Env& e) {
  id<MTLComputePipelineState> w = pipeline(e, "emu_write_range");
  // overlapping writes, no barrier: reported
  {
    id<MTLBuffer> y = floats(e, 256, 0);
    [y setLabel:@"logits"];
    id<MTLCommandBuffer> cb = [e.queue commandBuffer];
    id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent];
    write_range(enc, w, y, 0, 128, 1.0f);
    write_range(enc, w, y, 64, 128, 2.0f);
    [enc endEncoding];
    run(cb);
    CHECK([cb status] == MTLCommandBufferStatusError);
    CHECK(contains([cb error], "hazard"));
    CHECK(contains([cb error], "bytes [256, 512) of buffer 'logits'"));
    CHECK([[cb error] code] == MTLCommandBufferErrorInternal);
    CHECK(strstr(muser_metal_emu_last_error(), "hazard") != nullptr);
  }
  // the same with a barrier between: clean, and in encode order
  {
    id<MTLBuffer> y = floats(e, 256, 0);
    id<MTLCommandBuffer> cb = [e.queue commandBuffer];
    id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent];
    write_range(enc, w, y, 0, 128, 1.0f);
    [enc memoryBarrierWithScope:MTLBarrierScopeBuffers];
    write_range(enc, w, y, 64, 128, 2.0f);
    [enc endEncoding];
    run(cb);
    CHECK([cb status] == MTLCommandBufferStatusCompleted);
    CHECK(((float*)[y contents])[100] == 2.0f && ((float*)[y contents])[10] == 1.0f);
  }
  // disjoint tiles of one buffer with no barrier: clean (writes are measured, not guessed)
  {
    id<MTLBuffer> y = floats(e, 256, 0);
    id<MTLCommandBuffer> cb = [e.queue commandBuffer];
    id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent];
    write_range(enc, w, y, 0, 128, 1.0f);
    write_range(enc, w, y, 128, 128, 2.0f);
    [enc endEncoding];
    run(cb);
    CHECK([cb status] == MTLCommandBufferStatusCompleted);
  }
  // a read of what another dispatch writes, no barrier: reported
  {
    id<MTLBuffer> a = floats(e, 64, 1), b = floats(e, 64, 2), c = floats(e, 64, 0);
    EmuTestArgs k = {64, 0, 0, 0};
    id<MTLCommandBuffer> cb = [e.queue commandBuffer];
    id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent];
    write_range(enc, w, a, 0, 64, 5.0f);
    [enc setComputePipelineState:pipeline(e, "emu_vec_add")];
    [enc setBuffer:a offset:0 atIndex:0];
    [enc setBuffer:b offset:0 atIndex:1];
    [enc setBuffer:c offset:0 atIndex:2];
    [enc setBytes:&k length:sizeof k atIndex:3];
    [enc dispatchThreads:MTLSizeMake(64, 1, 1) threadsPerThreadgroup:MTLSizeMake(64, 1, 1)];
    [enc endEncoding];
    run(cb);
    CHECK([cb status] == MTLCommandBufferStatusError);
    CHECK(contains([cb error], "hazard") && contains([cb error], "reads"));
  }
  // a serial encoder orders its dispatches: no hazard
  {
    id<MTLBuffer> y = floats(e, 256, 0);
    id<MTLCommandBuffer> cb = [e.queue commandBuffer];
    id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoder];
    write_range(enc, w, y, 0, 128, 1.0f);
    write_range(enc, w, y, 64, 128, 2.0f);
    [enc endEncoding];
    run(cb);
    CHECK([cb status] == MTLCommandBufferStatusCompleted);
    CHECK(((float*)[y contents])[100] == 2.0f);
  }
  // dispatches between barriers run shuffled, by the seed
  {
    std::vector<std::vector<size_t>> orders;
    for (uint64_t seed : {1u, 2u, 3u}) {
      muser_metal_emu_set_seed(seed);
      id<MTLBuffer> y = floats(e, 8 * 16, 0);
      id<MTLCommandBuffer> cb = [e.queue commandBuffer];
      id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent];
      for (uint32_t i = 0; i < 8; ++i) write_range(enc, w, y, 16 * i, 16, (float)i);
      [enc endEncoding];
      run(cb);
      CHECK([cb status] == MTLCommandBufferStatusCompleted);
      size_t o[8];
      CHECK(muser_metal_emu_last_order(o, 8) == 8);
      orders.push_back(std::vector<size_t>(o, o + 8));
    }
    std::vector<size_t> identity = {0, 1, 2, 3, 4, 5, 6, 7};
    CHECK(orders[0] != identity || orders[1] != identity || orders[2] != identity);
    CHECK(orders[0] != orders[1] || orders[1] != orders[2]);
    muser_metal_emu_set_seed(1);
  }
}

// Encodes one dispatch of `kernel` with a y buffer at index 0; returns the command buffer after its run.
static id<MTLCommandBuffer> one(Env& e, const char* kernel, MTLSize groups, MTLSize per, size_t tg_len,
                                id<MTLBuffer> x = nil) {
  id<MTLBuffer> y = floats(e, 4096, 0);
  id<MTLCommandBuffer> cb = [e.queue commandBuffer];
  id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent];
  [enc setComputePipelineState:pipeline(e, kernel)];
  if (x) {
    [enc setBuffer:x offset:0 atIndex:0];
    [enc setBuffer:y offset:0 atIndex:1];
  } else {
    [enc setBuffer:y offset:0 atIndex:0];
  }
  if (tg_len) [enc setThreadgroupMemoryLength:tg_len atIndex:0];
  [enc dispatchThreadgroups:groups threadsPerThreadgroup:per];
  [enc endEncoding];
  return run(cb);
}

static void test_limits(Env& e) {
  id<MTLCommandBuffer> cb = one(e, "emu_tg_touch", MTLSizeMake(1, 1, 1), MTLSizeMake(32, 1, 1), 32 * 1024);
  CHECK([cb status] == MTLCommandBufferStatusCompleted);
  cb = one(e, "emu_tg_touch", MTLSizeMake(1, 1, 1), MTLSizeMake(32, 1, 1), 33 * 1024);
  CHECK([cb status] == MTLCommandBufferStatusError);
  CHECK(contains([cb error], "33792 bytes of threadgroup memory"));
  cb = one(e, "emu_tg_static_big", MTLSizeMake(1, 1, 1), MTLSizeMake(32, 1, 1), 0);
  CHECK([cb status] == MTLCommandBufferStatusError);
  CHECK(contains([cb error], "threadgroup array big"));
  cb = one(e, "emu_tg_touch", MTLSizeMake(1, 1, 1), MTLSizeMake(32, 1, 1), 20);
  CHECK([cb status] == MTLCommandBufferStatusError);
  CHECK(contains([cb error], "multiple of 16"));
  cb = one(e, "emu_tg_touch", MTLSizeMake(1, 1, 1), MTLSizeMake(1024, 1, 1), 16);
  CHECK([cb status] == MTLCommandBufferStatusCompleted);
  cb = one(e, "emu_tg_touch", MTLSizeMake(1, 1, 1), MTLSizeMake(1025, 1, 1), 16);
  CHECK([cb status] == MTLCommandBufferStatusError);
  CHECK(contains([cb error], "1025 threads per threadgroup"));
  cb = one(e, "emu_tg_touch", MTLSizeMake(1, 1, 1), MTLSizeMake(32, 1, 1), 0);
  CHECK([cb status] == MTLCommandBufferStatusError);
  CHECK(contains([cb error], "no setThreadgroupMemoryLength"));
}

static void test_divergence_and_races(Env& e) {
  id<MTLCommandBuffer> cb = one(e, "emu_barrier_divergent", MTLSizeMake(1, 1, 1), MTLSizeMake(64, 1, 1), 0);
  CHECK([cb status] == MTLCommandBufferStatusError);
  CHECK(contains([cb error], "barrier divergence"));
  id<MTLBuffer> x = floats(e, 4 * 64, 0);
  for (int i = 0; i < 4 * 64; ++i) ((float*)[x contents])[i] = (float)i;
  cb = one(e, "emu_tg_per_thread", MTLSizeMake(1, 1, 1), MTLSizeMake(64, 1, 1), 0, x);
  CHECK([cb status] == MTLCommandBufferStatusError);
  CHECK(contains([cb error], "threadgroup memory race") && contains([cb error], "threadgroup array tmp"));
  cb = one(e, "emu_tg_per_thread", MTLSizeMake(4, 1, 1), MTLSizeMake(1, 1, 1), 0, x);  // one thread: its own
  CHECK([cb status] == MTLCommandBufferStatusCompleted);
  cb = one(e, "emu_simd_divergent", MTLSizeMake(1, 1, 1), MTLSizeMake(32, 1, 1), 0);
  CHECK([cb status] == MTLCommandBufferStatusError);
  CHECK(contains([cb error], "SIMD divergence"));
}

static void test_buffers(Env& e) {
  const size_t page = 16384;
  void* mem = mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(mem != MAP_FAILED);
  void* aligned = (void*)(((uintptr_t)mem + page - 1) / page * page);
  __block int deallocs = 0;
  id<MTLBuffer> b = [e.dev newBufferWithBytesNoCopy:aligned
                                             length:2 * page
                                            options:MTLResourceStorageModeShared
                                        deallocator:^(void* p, NSUInteger n) {
                                          deallocs += p == aligned && n == 2 * page;
                                        }];
  CHECK(b != nil && [b contents] == aligned && [b length] == 2 * page);
  [b release];
  CHECK(deallocs == 1);
  b = [e.dev newBufferWithBytesNoCopy:(char*)aligned + 4096 length:page options:MTLResourceStorageModeShared deallocator:nil];
  CHECK(b == nil);
  CHECK(strstr(muser_metal_emu_last_error(), "page") != nullptr);
  b = [e.dev newBufferWithBytesNoCopy:aligned length:page + 64 options:MTLResourceStorageModeShared deallocator:nil];
  CHECK(b == nil);
  muser_metal_emu_set_page_size(4096);  // the hook: a 4 KiB-page device accepts the same pointer
  b = [e.dev newBufferWithBytesNoCopy:(char*)aligned + 4096 length:4096 options:MTLResourceStorageModeShared deallocator:nil];
  CHECK(b != nil);
  [b release];
  muser_metal_emu_set_page_size(page);

  muser_metal_emu_set_max_buffer_length(2 * page);
  CHECK([e.dev maxBufferLength] == 2 * page);
  b = [e.dev newBufferWithLength:2 * page + 1 options:MTLResourceStorageModeShared];
  CHECK(b == nil);
  CHECK(strstr(muser_metal_emu_last_error(), "maxBufferLength") != nullptr);
  b = [e.dev newBufferWithBytesNoCopy:aligned length:3 * page options:MTLResourceStorageModeShared deallocator:nil];
  CHECK(b == nil);
  b = [e.dev newBufferWithLength:2 * page options:MTLResourceStorageModeShared];
  CHECK(b != nil);
  [b release];
  muser_metal_emu_set_max_buffer_length(size_t(8) << 30);
  munmap(mem, 4 * page);

  // a buffer released after encoding lives until the command buffer is done with it
  id<MTLBuffer> y = [e.dev newBufferWithLength:64 * 4 options:MTLResourceStorageModeShared];
  id<MTLCommandBuffer> cb = [e.queue commandBuffer];
  id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoder];
  write_range(enc, pipeline(e, "emu_write_range"), y, 0, 64, 3.0f);
  [enc endEncoding];
  [y retain];
  [y release];
  run(cb);
  CHECK([cb status] == MTLCommandBufferStatusCompleted && ((float*)[y contents])[63] == 3.0f);
  [y release];
}

static void test_errors(Env& e) {
  muser_metal_emu_fail_next_command_buffer("injected GPU fault");
  id<MTLCommandBuffer> cb = [e.queue commandBuffer];
  id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoder];
  write_range(enc, pipeline(e, "emu_write_range"), floats(e, 16, 0), 0, 16, 1.0f);
  [enc endEncoding];
  run(cb);
  CHECK([cb status] == MTLCommandBufferStatusError);
  CHECK([[[cb error] domain] isEqualToString:MTLCommandBufferErrorDomain]);
  CHECK(contains([cb error], "injected GPU fault"));
  // unbound argument, short setBytes
  cb = [e.queue commandBuffer];
  enc = [cb computeCommandEncoder];
  [enc setComputePipelineState:pipeline(e, "emu_write_range")];
  [enc setBuffer:floats(e, 16, 0) offset:0 atIndex:0];
  uint32_t short_args = 16;
  [enc setBytes:&short_args length:4 atIndex:1];
  [enc dispatchThreads:MTLSizeMake(16, 1, 1) threadsPerThreadgroup:MTLSizeMake(16, 1, 1)];
  [enc endEncoding];
  run(cb);
  CHECK([cb status] == MTLCommandBufferStatusError && contains([cb error], "reads 16 bytes; 4 are bound"));
  cb = [e.queue commandBuffer];
  enc = [cb computeCommandEncoder];
  [enc setComputePipelineState:pipeline(e, "emu_vec_add")];
  [enc dispatchThreads:MTLSizeMake(16, 1, 1) threadsPerThreadgroup:MTLSizeMake(16, 1, 1)];
  [enc endEncoding];
  run(cb);
  CHECK([cb status] == MTLCommandBufferStatusError && contains([cb error], "[[buffer(0)]] a is not bound"));
}

static void test_library(Env& e) {
  NSError* err = nil;
  // fast math (Metal's default) is refused: it would change the kernels' rounding
  id<MTLLibrary> l = [e.dev newLibraryWithSource:kernel_source() options:nil error:&err];
  CHECK(l == nil && [[err domain] isEqualToString:MTLLibraryErrorDomain] && [err code] == MTLLibraryErrorCompileFailure);
  CHECK(contains(err, "fast math"));
  err = nil;
  l = [e.dev newLibraryWithSource:@"MUSER_KERNEL(no_such_kernel, MUSER_ARG_TID(i)) {}" options:safe_options() error:&err];
  CHECK(l == nil && contains(err, "no_such_kernel"));
  err = nil;
  l = [e.dev newLibraryWithSource:@"this is not a kernel" options:safe_options() error:&err];
  CHECK(l == nil && contains(err, "Compilation failed"));
  CHECK([e.lib newFunctionWithName:@"emu_not_there"] == nil);
  // the OS-version wrapper: on an emulated macOS 14, mathMode does not exist
  muser_metal_emu_set_os_version(14, 6);
  CHECK(!MUSER_MACOS_AVAILABLE(15.0) && MUSER_MACOS_AVAILABLE(14.0));
  l = [e.dev newLibraryWithSource:kernel_source() options:safe_options() error:&err];  // fastMathEnabled = NO path
  CHECK(l != nil);
  [l release];
  MTLCompileOptions* o = [[[MTLCompileOptions alloc] init] autorelease];
  [o setMathMode:MTLMathModeSafe];
  err = nil;
  l = [e.dev newLibraryWithSource:kernel_source() options:o error:&err];
  CHECK(l == nil && contains(err, "macOS 15+"));
  muser_metal_emu_set_os_version(15, 0);
  CHECK(MUSER_MACOS_AVAILABLE(15.0));
  // no device
  muser_metal_emu_set_no_device(1);
  CHECK(MTLCreateSystemDefaultDevice() == nil);
  muser_metal_emu_set_no_device(0);
}

int main() {
  NSAutoreleasePool* pool = [[NSAutoreleasePool alloc] init];
  Env e;
  e.dev = MTLCreateSystemDefaultDevice();
  if (!e.dev) {
    fprintf(stderr, "no device\n");
    return 1;
  }
  e.queue = [e.dev newCommandQueue];
  NSError* err = nil;
  e.lib = [e.dev newLibraryWithSource:kernel_source() options:safe_options() error:&err];
  if (!e.lib) {
    fprintf(stderr, "library: %s\n", err ? [[err localizedDescription] UTF8String] : "?");
    return 1;
  }
  struct {
    const char* name;
    void (*fn)(Env&);
  } tests[] = {
      {"vec_add", test_vec_add},
      {"reduce_dynamic", [](Env& x) { test_reduce(x, "emu_reduce_dynamic", true); }},
      {"reduce_static", [](Env& x) { test_reduce(x, "emu_reduce_static", false); }},
      {"simd_ops", test_simd_ops},
      {"hazards", test_hazards},
      {"limits", test_limits},
      {"divergence_and_races", test_divergence_and_races},
      {"buffers", test_buffers},
      {"errors", test_errors},
      {"library", test_library},
  };
  for (auto& t : tests) {
    NSAutoreleasePool* inner = [[NSAutoreleasePool alloc] init];
    int before = g_failures;
    t.fn(e);
    printf("%s %s\n", g_failures == before ? "ok  " : "FAIL", t.name);
    [inner release];
  }
  [e.lib release];
  [e.queue release];
  [e.dev release];
  [pool release];
  printf("%s\n", g_failures ? "FAILED" : "all passed");
  return g_failures ? 1 : 0;
}
